"""Data-parallel training with torch.distributed, launched by ``torchrun``.

Launch any training script (or ``llm-marl train``) unchanged::

    torchrun --nproc_per_node 2 -m llm_marl.cli train --env ClimbingGame-v0 --policy tabular
    # several machines: the same on each, plus
    #   --nnodes N --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST:PORT

The trainer finds the process group from torchrun's environment variables (with CUDA, NCCL for CUDA
tensors and gloo for CPU ones, ``"cpu:gloo,cuda:nccl"``; without it, gloo). What changes with W ranks:

- The dataset is read in global batches of ``items_per_step × W`` items; rank r rolls out its own
  block of ``items_per_step`` of them. ``rollout_buffer_size`` and ``train_batch_size`` count
  samples per rank, like a per-device batch size.
- Updates happen at batch boundaries, decided together: when any rank's buffer of an agent holds
  ``rollout_buffer_size`` samples (or at an epoch's end), every rank drains that agent's buffer into
  mini-batches of ``train_batch_size``; mini-batch i of all ranks forms one optimizer step whose
  loss is the mean over the union of their samples (gradients are summed across ranks and divided
  by the global sample count; a rank with fewer mini-batches contributes zero). So all ranks take
  the same steps and hold identical weights, and W ranks with ``items_per_step=n`` and
  ``rollout_buffer_size=m`` match one process with ``items_per_step=W·n``,
  ``rollout_buffer_size=W·m`` wherever that one process also updates only at batch boundaries.
- Rank 0 alone logs, evaluates and writes models. Each rank reseeds torch's global RNG at every
  batch from (seed, rank, batch), so ranks never sample identical answers.
- A checkpoint holds what each rank owns (runs/checkpoint.py): every rank writes its rollout
  buffers, metrics not yet logged, the rest of a cut update and its generators (Python, NumPy,
  torch, the policies', the envs'); rank 0 writes them at the top of the folder with everything
  else, rank r into ``rank_<r>/``. A resume with the same number of ranks gives each rank its
  own back. With another number it is refused in one line unless no rank's buffers hold a
  sample; then every rank starts from rank 0's generators and metrics.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

from llm_marl.policies.weight_changes import weights_changed


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the process group (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> "DistributedContext":
        """Join the process group torchrun describes, or stay single-process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1 or not dist.is_available():
            return cls()
        join_process_group()
        return cls(dist.get_rank(), dist.get_world_size())

    def shard(self, batch: list[int], per_rank: int) -> list[int]:
        """This rank's block of a global batch."""
        return batch[self.rank * per_rank : (self.rank + 1) * per_rank]

    def sum(self, value: float) -> float:
        return float(self._all_reduce(float(value), torch.float64, "SUM")) if self.enabled else value

    def max(self, value: int) -> int:
        return int(self._all_reduce(int(value), torch.int64, "MAX")) if self.enabled else value

    @staticmethod
    def _all_reduce(value: float | int, dtype: torch.dtype, op: str) -> float | int:
        tensor = torch.tensor([value], dtype=dtype)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.item()

    def union(self, keys: list[str]) -> list[str]:
        """The sorted union of every rank's ``keys``."""
        return sorted(set(self.gather(keys)))

    def gather(self, items: list) -> list:
        """Every rank's ``items`` (picklable), concatenated in rank order."""
        if not self.enabled:
            return list(items)
        gathered: list[list | None] = [None] * self.world_size
        dist.all_gather_object(gathered, list(items))
        return [item for part in gathered for item in part or []]

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks (a missing gradient counts as zero). FSDP
        shards (DTensors, ``fsdp=True``) are skipped: their reduce-scatter already summed them."""
        if not self.enabled:
            return
        for p in parameters:
            if _is_shard(p):
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad.to(torch.device("cpu")) if p.grad.device.type != "cuda" else p.grad
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            if grad is not p.grad:
                p.grad.copy_(grad)

    def broadcast_parameters(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Make every rank start from rank 0's weights (a change notice for every sampling copy:
        a write through ``p.data`` bumps no ``p._version``). FSDP shards (DTensors, ``fsdp=True``)
        are skipped: they were broadcast before sharding, and each rank holds its own part."""
        if not self.enabled:
            return
        parameters = [p for p in parameters if not _is_shard(p)]
        with torch.no_grad():
            for p in parameters:
                dist.broadcast(p.data, src=0)
        weights_changed(parameters)

    def broadcast_object(self, value: object) -> object:
        """Rank 0's ``value`` on every rank (every rank calls it)."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets ``TORCHELASTIC_RUN_ID`` and the rank variables)."""
    return all(os.environ.get(name) for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def join_process_group() -> None:
    """Join the process group torchrun describes (at any world size, one rank included), on this
    rank's GPU where there is CUDA; a no-op when already joined."""
    if dist.is_initialized():
        return
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=process_group_backend(cuda))
    atexit.register(_leave_process_group)


def process_group_backend(cuda_available: bool) -> str:
    """The process group's backend: with CUDA, NCCL for CUDA tensors and gloo for CPU ones (the
    trainers all-reduce CPU scalars, and a model left on the CPU has CPU gradients, which NCCL alone
    refuses); without CUDA, gloo."""
    return "cpu:gloo,cuda:nccl" if cuda_available else "gloo"


def _is_shard(p: torch.Tensor) -> bool:
    """Whether ``p`` is an FSDP shard (a DTensor parameter)."""
    return type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor"


def _leave_process_group() -> None:
    """At exit, destroy the process group this module joined: left to interpreter shutdown, gloo's
    threads can abort the process ("terminate called without an active exception", exit -6)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
