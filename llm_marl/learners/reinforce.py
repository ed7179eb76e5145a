"""The MAREINFORCE family of learners: MAGRPO, MAREINFORCE, MARLOO, MAReMax (docs/algorithms.md).

The training loop, top to bottom::

    for epoch in range(num_train_epochs):
        for batch b of items_per_step dataset indices:
            if eval_interval and b % eval_interval == 0: evaluate()
            trees   = collect_trees(env, policies, batch, args)          # tree.py
            samples = samples_from_trees(trees, ...)                     # buffer.py (+ reference KL)
            for each node's samples, in creation order:
                append to every agent's buffer
                if the buffers hold rollout_buffer_size samples: update() # mini-batch optimizer steps
            log; maybe checkpoint
        update() on the partly filled buffers

The four trainers differ only in their config's default ``advantage_mode``. A trainer is built
either env-native — ``MAGRPOTrainer(env=..., policies=..., args=..., eval_env=None)`` where env is
a ``pettingzoo.ParallelEnv`` (or a zero-argument factory) and policies a dict agent -> Policy or
a list in agent order — or with the Hugging Face-compatible keywords of the anchor library
(``agent_model``/``agents``, ``reward_func``, ``formatters``, ... see docs/algorithms.md §7), which build a
:class:`~llm_marl.tasks.FunctionTask` and a :class:`~llm_marl.envs.DialogueEnv` internally.
"""

from __future__ import annotations

import copy
import math
import os
import random
import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from pettingzoo import ParallelEnv

from llm_marl.learners.advantages import k3_kl, sample_losses
from llm_marl.learners.buffer import RolloutBuffer, Sample, samples_from_trees
from llm_marl.learners.checks import check_horizon, check_policies, env_horizon
from llm_marl.runs.distributed import DistributedContext
from llm_marl.runs.interrupt import StopRequests, TrainingInterrupted
from llm_marl.learners.config import MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig
from llm_marl.runs.logging import RunLogger, open_wandb, wants_wandb
from llm_marl.runs.recording import RolloutRecorder
from llm_marl.learners.tree import RolloutNode, collect_trees, derive_seed, grow_trees, iter_nodes, ask_team
from llm_marl.policies.base import Completion, Policy, token_log_probs_of
from llm_marl.tasks.base import TaskError


def default_optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with torch's fused kernel where every parameter allows it (floating point, on CPU or
    CUDA), the usual per-tensor loop elsewhere. Both compute the same update."""
    fusable = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    if fusable:
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError):  # a torch build without the fused kernel for this device
            pass
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _grad_norm(params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total 2-norm of the gradients, after clipping them to ``max_norm`` when it is given."""
    if max_norm is not None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads) if hasattr(torch, "_foreach_norm") else [g.norm() for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class TrainerState:
    """Where training stands; saved in checkpoints."""

    epoch: int = 0
    """Epochs completed."""
    batch_in_epoch: int = 0
    """Dataset batches of the current epoch already trained on."""
    batch_step: int = 0
    """Dataset batches trained on in total (the logging x-axis)."""
    global_step: int = 0
    """Optimizer steps taken (per agent; agents step in lock-step)."""
    skipped_items: int = 0
    """Items dropped by reward_error_policy="skip"."""
    last_checkpoint: str | None = None
    """Path of the newest complete checkpoint."""


@dataclass
class _Backward:
    """One agent's scored mini-batch: its loss and gradient norm, or why it cannot be stepped."""

    loss: float
    grad_norm: float
    log_prob_mean: float | None
    error: str | None


@dataclass
class _UnfinishedBatch:
    """A batch whose update raised. The update left the buffers as they were, so ``train()``
    called again (the cause fixed) retries that update and appends ``rest``, instead of
    collecting the batch a second time and training on its samples twice."""

    batch_step: int
    roots: list[RolloutNode]
    samples: list[Sample]
    elapsed: float
    rest: list[Sample]
    """The batch's samples not yet in the buffers."""


class MAGRPOTrainer:
    """Multi-agent GRPO: baseline = mean of the group's K returns (see the module docstring)."""

    config_class = MAGRPOConfig

    def __init__(
        self,
        env: ParallelEnv | Callable[[], ParallelEnv] | None = None,
        policies: Mapping[str, Policy] | Sequence[Policy] | None = None,
        args: MAGRPOConfig | None = None,
        eval_env: ParallelEnv | Callable[[], ParallelEnv] | None = None,
        *,
        optimizers: Mapping[str, torch.optim.Optimizer] | Sequence[torch.optim.Optimizer] | None = None,
        eval_logger: Callable[..., list[dict[str, float]]] | None = None,
        eval_aggregator: Callable[..., dict[str, float]] | None = None,
        **anchor_kwargs: Any,
    ):
        wandb_config, run_config, self._cannot_train = None, {}, None
        if args is None and env is not None and not anchor_kwargs:
            # a default config fits the env: its agent count and, where it declares one, its horizon
            env = _instantiate(env, "env")
            horizon = env_horizon(env)
            args = self.config_class(num_agents=len(env.possible_agents), **({"num_turns": horizon} if horizon else {}))
        elif args is None:
            count = len(anchor_kwargs["agents"]) if anchor_kwargs.get("agents") is not None else anchor_kwargs.get("num_agents")
            args = self.config_class(num_agents=count) if count is not None else self.config_class()
        self.args = args
        if not isinstance(self.args, MAGRPOConfig):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(self.args).__name__}")
        self.args.validate()  # again: the config may have been changed since it was constructed
        if anchor_kwargs or env is None:
            from llm_marl.comlrl.anchor_compat import build_from_anchor_kwargs

            if env is not None or policies is not None:
                raise TypeError(
                    f"pass either env=/policies= or the anchor-library keywords, not both (got {sorted(anchor_kwargs)})"
                )
            algorithm = type(self).__name__.removesuffix("Trainer").lower()
            anchor_kwargs.update(eval_logger=eval_logger, eval_aggregator=eval_aggregator)
            built = build_from_anchor_kwargs(self.args, algorithm=algorithm, **anchor_kwargs)
            self.args, env, policies, eval_env = built.args, built.env, built.policies, built.eval_env
            wandb_config, run_config, self._cannot_train = built.wandb_config, built.run_config, built.cannot_train
            eval_logger, eval_aggregator = built.eval_logger, built.eval_aggregator
            self.tokenizers = built.tokenizers
        self.env = _instantiate(env, "env")
        self.no_eval_reason: str | None = None
        """Why there is nothing to evaluate on (then evaluate() warns once and returns {})."""
        if eval_env is not None:
            self.eval_env = _instantiate(eval_env, "eval_env")
        else:
            self.eval_env, self.no_eval_reason = _eval_split(self.env)
        self._warned: set[str] = set()
        self.agents = list(self.env.possible_agents)
        if self.args.num_agents != len(self.agents):
            raise ValueError(
                f"num_agents is {self.args.num_agents} but the env has {len(self.agents)} agents {self.agents}"
            )
        check_horizon(self.env, self.args.num_turns, "env")
        if self.eval_env is not None:
            check_horizon(self.eval_env, self.args.num_turns, "eval_env")
        self.policies = _by_agent(policies, self.agents, "policies")
        check_policies(self.policies)
        if self.args.agent_devices is not None:
            for agent, device in zip(self.agents, self.args.agent_devices):
                if hasattr(self.policies[agent], "to"):
                    self.policies[agent] = self.policies[agent].to(device) or self.policies[agent]
        self.dist = DistributedContext.from_environment()
        self.trainable = {a: [p for p in self.policies[a].parameters() if p.requires_grad] for a in self.agents}
        if optimizers is None:
            self.optimizers = {
                a: default_optimizer(params, lr=self.args.agent_learning_rate, weight_decay=self.args.weight_decay)
                for a, params in self.trainable.items()
                if params
            }
        else:
            self.optimizers = _by_agent(optimizers, self.agents, "optimizers")
        self.reference_policies = self._make_references() if self.args.reference_kl_enabled else None
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.buffers = {a: RolloutBuffer() for a in self.agents}
        self._unfinished: _UnfinishedBatch | None = None
        self.state = TrainerState()
        self.wandb = None
        if self.dist.is_main and (wandb_config is not None or wants_wandb(self.args.report_to)):
            self.wandb = open_wandb(wandb_config, {**self.args.to_dict(), **run_config}, self.args.output_dir)
        self.logger = RunLogger(None, mirrors=self._mirrors())
        self.recorder = RolloutRecorder.from_args(self.args, self.agents, enabled=self.dist.is_main)
        self._pending: dict[str, list[float]] = {}
        self.run_id: str | None = None
        self.launch_identity: dict[str, Any] = {}  # launch settings a resume must repeat (the CLI's env id, model, menu)

    # --- public API ---------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainerState:
        """Train for ``num_train_epochs`` epochs; returns the final :class:`TrainerState`.

        ``resume_from_checkpoint``: a checkpoint folder, or True for the newest one of the run in
        ``output_dir``; training then continues exactly where that checkpoint left off. A new
        run refuses a non-empty ``output_dir`` unless ``overwrite_output_dir`` (run_folder.py).
        SIGINT/SIGTERM stop after the current batch and raise
        :class:`~llm_marl.runs.interrupt.TrainingInterrupted` (interrupt.py). A checkpoint is
        written every ``save_steps`` optimizer steps and, when training ends or a signal stops it,
        once more where :meth:`_closing_checkpoint` says so (``save_final_checkpoint``).
        """
        from llm_marl.runs import checkpoint

        args = self.args
        if self._cannot_train:
            raise ValueError(self._cannot_train)
        seed_everything(args.seed)
        path = self._claim_run_folder(resume_from_checkpoint)
        if path is not None:
            checkpoint.load(self, path)
            self.recorder.purge(self.state.batch_step)
        for agent in self.agents:
            self.dist.broadcast_parameters(self.trainable[agent])
        self.logger = RunLogger(
            args.output_dir if self.dist.is_main else None,
            purge_step=self.state.batch_step if resume_from_checkpoint else None,
            mirrors=self._mirrors(),
        )
        batches = self._batches()
        total = self._num_epochs() * len(batches)
        progress = _progress(total, self.state.epoch * len(batches) + self.state.batch_in_epoch, args.progress_bar)
        stop = StopRequests(checkpoints=self._closing_checkpoint() and self.dist.is_main).__enter__()
        try:
            while self.state.epoch < self._num_epochs() and not self._reached_max_steps():
                b = self.state.batch_in_epoch
                steps_before = self.state.global_step
                if b == len(batches):  # train() again after the epoch's closing update raised
                    self._end_epoch()
                    self._after_batch(progress, steps_before, True)
                    continue
                if args.eval_interval and b % args.eval_interval == 0 and self.dist.is_main and self._unfinished is None:
                    self.evaluate()
                self._train_batch(self.dist.shard(batches[b], args.items_per_step))
                self.state.batch_in_epoch += 1
                self.state.batch_step += 1
                epoch_done = self.state.batch_in_epoch == len(batches)
                if epoch_done:
                    self._end_epoch()
                progress.update(1)
                self._after_batch(progress, steps_before, epoch_done)
                if self.dist.max(int(stop.signum is not None)):
                    self._stop_on_signal(stop.signum or signal.SIGTERM)
            self._flush_metrics(force=True)  # a run ended by max_steps mid-epoch logs its last batches too
            if self._closing_checkpoint() and self.dist.is_main:
                checkpoint.save(self)
            self.dist.barrier()
        finally:
            stop.__exit__()
            progress.close()
            self.logger.close()
        return self.state

    def _num_epochs(self) -> int:
        """Passes over the train dataset that train() makes: ``num_train_epochs`` (the iterative
        preference learners: their rounds)."""
        return self.args.num_train_epochs

    def _mirrors(self) -> list[Any]:
        return [self.wandb] if self.wandb is not None else []

    def _launch(self) -> dict[str, Any]:
        """What the run is made of beyond its config (recorded in run.json; resume checks it):
        the env's name, each agent's policy class, and what the CLI adds in ``launch_identity``
        (env id, model, menu, train_items)."""
        env = self.env
        name = (getattr(env, "metadata", None) or {}).get("name") or type(getattr(env, "task", env)).__name__
        return {"env": name, "policies": {a: type(p).__name__ for a, p in self.policies.items()}, **self.launch_identity}

    def _claim_run_folder(self, resume: str | bool | None) -> str | None:
        """Claim ``output_dir`` for this run (run_folder.py); the checkpoint to resume, if any.
        A trainer that trains again continues its own run in its folder."""
        from llm_marl.runs import checkpoint, run_folder

        out = self.args.output_dir
        if out is None:
            return checkpoint.resolve(resume, out) if resume else None
        held = run_folder.read_identity(out)
        if not resume and held is not None and held["run_id"] == self.run_id:
            return None  # train() again on this trainer: the same run continues
        if not resume:
            if self.dist.is_main:
                identity, moved = run_folder.claim_new(out, self.args, self._launch())
                if moved:
                    print(f"[llm_marl] moved the previous contents of {out} aside to {moved}")
            self.dist.barrier()
            self.run_id = run_folder.read_identity(out)["run_id"]
            return None
        held = run_folder.check_resume(out, self.args, self._launch())
        path = checkpoint.resolve(resume, out, held["run_id"] if held else None)
        saved = checkpoint.run_id_of(path)
        if held is not None and saved is not None and saved != held["run_id"]:
            raise run_folder.RunFolderError(f"{path} belongs to run {saved}, but {out} holds run {held['run_id']}")
        if held is None:  # a folder from before run identities, or a checkpoint from elsewhere
            held = run_folder.new_identity(self.args, run_id=saved, launch=self._launch())
            if self.dist.is_main:
                run_folder.write_identity(out, held)
        self.run_id = held["run_id"]
        return path

    def _closing_checkpoint(self) -> bool:
        """Whether train() writes a checkpoint when it ends or a signal stops it: an output_dir and
        ``save_final_checkpoint`` not False (the drop-in constructor resolves None to
        ``save_steps > 0``: CoMLRL writes weights only when asked; anchor_compat.py)."""
        return self.args.output_dir is not None and self.args.save_final_checkpoint is not False

    def _stop_on_signal(self, signum: int) -> None:
        """Write a checkpoint of the batch just finished (where :meth:`_closing_checkpoint`) and
        raise TrainingInterrupted."""
        from llm_marl.runs import checkpoint

        path = None
        if self._closing_checkpoint():
            if self.dist.is_main:
                path = checkpoint.save(self)
            self.dist.barrier()
        raise TrainingInterrupted(signum, path)

    def _reached_max_steps(self) -> bool:
        return self.args.max_steps is not None and self.state.global_step >= self.args.max_steps

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Play ``num_eval_samples`` (default ``eval_num_samples``) eval items once each (one
        answer per agent per turn, no early termination) and return — and log —
        ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return``, plus the eval hooks'
        metrics when both are given.

        Evaluation plays the ``eval_env`` passed to the constructor, else the eval split of a
        :class:`~llm_marl.envs.DialogueEnv`'s task — never the training items unless the training
        env is passed as ``eval_env`` on purpose. Without either (no eval split, the task's
        ``dataset("eval")`` raised or is empty, or a foreign env), it warns once why and returns
        ``{}``, logging nothing — also when called by the periodic schedule. With
        ``reward_error_policy="skip"`` an eval item whose task raised is dropped, printed and
        counted in ``eval/skipped_items``.
        """
        args = self.args
        if num_eval_samples is None:
            num_eval_samples = args.eval_num_samples
        if isinstance(num_eval_samples, bool) or not isinstance(num_eval_samples, int) or num_eval_samples < 0:
            raise ValueError(f"num_eval_samples must be an int >= 0, got {num_eval_samples!r}")
        env = self.eval_env
        if env is None:
            self._warn_once("no-eval", f"evaluation skipped: {self.no_eval_reason}")
            return {}
        available = _num_items(env)
        if num_eval_samples > available:
            self._warn_once(
                "eval-size",
                f"eval_num_samples is {num_eval_samples} but the eval data has {available} "
                f"item{'s' if available != 1 else ''}; "
                f"evaluating on all {available}",
            )
        count = min(num_eval_samples, available)
        skip = args.reward_error_policy == "skip"
        roots: list[RolloutNode] = []
        for start in range(0, count, args.eval_batch_size):
            indices = list(range(start, min(start + args.eval_batch_size, count)))
            roots += grow_trees(env, self.policies, indices, num_samples=1, num_turns=args.num_turns, skip_errors=skip,
                                per_agent_rewards=bool(getattr(args, "per_agent_rewards", False)), learner=type(self).__name__)
        failed = [root for root in roots if root.error is not None]
        for root in failed:
            print(f"[llm_marl] skipped eval item {root.index}: {root.error}")
        roots = [root for root in roots if root.error is None]
        self.recorder.evaluation(self.state.batch_step, roots, self.logger)
        metrics = episode_metrics(roots, args.num_turns, prefix="eval")
        if skip:
            metrics["eval/skipped_items"] = float(len(failed))
        if self.eval_logger is not None and self.eval_aggregator is not None and roots:
            metrics.update(self._hook_metrics(env, roots))
        self.logger.log(metrics, self.state.batch_step)
        return metrics

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def save_model(self, output_dir: str) -> None:
        """Write each agent's policy to ``output_dir/agent_{i}`` (``save_pretrained`` where the
        policy has it, else a torch state dict ``policy.pt``)."""
        for i, agent in enumerate(self.agents):
            target = os.path.join(output_dir, f"agent_{i}")
            os.makedirs(target, exist_ok=True)
            policy = self.policies[agent]
            if hasattr(policy, "save_pretrained"):
                policy.save_pretrained(target)
            elif hasattr(policy, "state_dict"):
                torch.save(policy.state_dict(), os.path.join(target, "policy.pt"))

    # --- one dataset batch ----------------------------------------------------------------------

    def _end_epoch(self) -> None:
        """Train on what the buffers still hold, then count the epoch."""
        self._update()
        self.state.epoch += 1
        self.state.batch_in_epoch = 0

    def _train_batch(self, indices: list[int]) -> None:
        """Roll out the items ``indices``, buffer their samples and update whenever the buffers
        are full. If an update raises, the batch is kept (:class:`_UnfinishedBatch`) and the next
        call for the same batch step finishes it."""
        unfinished, self._unfinished = self._unfinished, None
        if unfinished is not None and unfinished.batch_step == self.state.batch_step:
            self._update_or_keep(unfinished)
            self._buffer_and_update(unfinished.batch_step, unfinished.roots, unfinished.samples, unfinished.elapsed, unfinished.rest)
            return
        roots, samples, elapsed = self._collect(indices)
        self._buffer_and_update(self.state.batch_step, roots, samples, elapsed, samples)

    def _update_or_keep(self, unfinished: _UnfinishedBatch) -> None:
        """:meth:`_update`; if it raises, keep ``unfinished`` for the next call to finish."""
        try:
            self._update()
        except Exception:
            self._unfinished = unfinished
            raise

    def _collect(self, indices: list[int]) -> tuple[list[RolloutNode], list[Sample], float]:
        """The batch's trees (items whose task raised dropped under reward_error_policy="skip"),
        their training samples, and the seconds the rollout took; the trees are recorded."""
        args = self.args
        if self.dist.enabled:
            torch.manual_seed(derive_seed(args.seed, "rank", self.dist.rank, self.state.batch_step))
        started = time.perf_counter()
        try:
            roots = collect_trees(self.env, self.policies, indices, args, seed=self._rollout_seed()) if indices else []
        except (TaskError, ValueError) as exc:
            self._in_training(exc, f"a reward shared by agents {self.agents}")
            raise
        elapsed = time.perf_counter() - started
        failed = [root for root in roots if root.error is not None]
        if failed:
            self.state.skipped_items += len(failed)
            for root in failed:
                print(f"[llm_marl] skipped item {root.index}: {root.error}")
        roots = [root for root in roots if root.error is None]
        try:
            samples = self._samples(roots)
        except FloatingPointError as exc:
            self._in_training(exc, "a return")
            raise
        self.recorder.train_batch(self.state.batch_step, roots, samples, self.logger)
        return roots, samples, elapsed

    def _buffer_and_update(
        self, batch_step: int, roots: list[RolloutNode], samples: list[Sample], elapsed: float, rest: list[Sample]
    ) -> None:
        """Append ``rest`` node by node, updating whenever every buffer is full, then log the batch."""
        args = self.args
        num_agents = len(self.agents)
        for start in range(0, len(rest), num_agents):
            for sample in rest[start : start + num_agents]:
                self.buffers[sample.agent].append(sample)
            if not self.dist.enabled and self._buffers_full():
                self._update_or_keep(_UnfinishedBatch(batch_step, roots, samples, elapsed, rest[start + num_agents :]))
        if self.dist.enabled and self.dist.max(int(self._buffers_full())):
            self._update_or_keep(_UnfinishedBatch(batch_step, roots, samples, elapsed, []))
        stepped = sum(len(node.joint) for node in iter_nodes(roots))
        metrics = episode_metrics(roots, args.num_turns, prefix="train")
        metrics["train/env_steps_per_second"] = stepped / max(elapsed, 1e-9)
        metrics["train/skipped_items"] = self.state.skipped_items
        for sample in samples:
            self._note(f"train/{sample.agent}/advantage_mean", float(np.mean(sample.advantages)))
            self._note(f"train/{sample.agent}/advantage_std", float(np.std(sample.advantages)))
            if sample.kl:
                self._note(f"train/{sample.agent}/kl_mean", float(np.mean(sample.kl)))
        for name, value in metrics.items():
            self._note(name, value)

    def _samples(self, roots: list[RolloutNode]) -> list[Sample]:
        """The training samples of a batch's trees, node by node, agents in order within a node."""
        args = self.args
        return samples_from_trees(
            roots,
            self.agents,
            advantage_mode=args.advantage_mode,
            normalize=args.advantage_normalization,
            kl_penalty=self._kl_penalty if self.reference_policies is not None else None,
            kl_coef=args.reference_kl_coef,
        )

    def _in_training(self, exc: Exception, what: str) -> None:
        """Complete ``exc``'s message (rollout errors name item and turn) with where training
        stands: the agents and the optimizer step the rollout was collected for. Type, cause and
        traceback are kept."""
        if len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (
                f"{exc.args[0]} [{what}, collected for optimizer step {self.state.global_step + 1} "
                f"(dataset batch {self.state.batch_step}){self._last_good()}]",
            )

    def _buffers_full(self) -> bool:
        return all(len(self.buffers[a]) >= self.args.rollout_buffer_size for a in self.agents)

    def _update(self) -> None:
        """Consume every agent's buffer in mini-batches of train_batch_size, one optimizer step each.

        All-or-nothing across agents: mini-batch i of every agent is scored and its loss and
        gradient checked before any agent's optimizer steps. A non-finite loss or gradient raises
        ``FloatingPointError`` and leaves every agent's weights and optimizer state, the samples
        not yet trained on (still in the buffers) and ``global_step`` as they were before that
        step; steps before it stand. Gradients of all agents are held at once for this.

        Distributed: every rank takes the same number of steps (the most any rank needs); a rank
        out of samples contributes zero gradient. parallel_training="mp": agents are scored
        concurrently, each on its own device.
        """
        if not self.dist.max(int(any(len(buffer) for buffer in self.buffers.values()))):
            return
        if self.dist.enabled:
            for agent in self.agents:
                policy = self.policies[agent]
                if hasattr(policy, "pending_observations"):
                    policy.add_observations(self.dist.union(policy.pending_observations()))
        size = self.args.resolved_train_batch_size
        batches = {agent: self._minibatches(agent, size) for agent in self.agents}
        counts = {agent: self.dist.max(len(batches[agent])) for agent in self.agents}
        for i in range(max(counts.values())):
            step = {
                agent: batches[agent][i] if i < len(batches[agent]) else []
                for agent in self.agents
                if agent in self.optimizers and i < counts[agent]
            }
            self._joint_optimizer_step(step)
            for agent in self.agents:
                if i < len(batches[agent]):
                    self.buffers[agent].discard(len(batches[agent][i]))
            self.state.global_step += 1

    def _minibatches(self, agent: str, size: int) -> list[list[Sample]]:
        """``agent``'s buffer as this update's consecutive mini-batches (kept in the buffer until trained on)."""
        return self.buffers[agent].batches(size)

    def _joint_optimizer_step(self, step: dict[str, list[Sample]]) -> None:
        """One optimizer step of every agent in ``step`` (agent -> mini-batch), or of none."""
        agents = list(step)
        concurrent = self.args.parallel_training == "mp" and not self.dist.enabled and len(agents) > 1
        results: list[_Backward] = []
        others: list[tuple[str, torch.optim.Optimizer, _Backward]] = []
        try:
            done = self._team_backward(step)  # each team of adapters: one forward, one backward
            if concurrent:
                with ThreadPoolExecutor(max_workers=len(agents)) as pool:
                    results = list(pool.map(lambda agent: self._backward(agent, step[agent], done.get(agent)), agents))
            else:
                for agent in agents:  # stops at the first failure: the decision is the same on every rank
                    results.append(self._backward(agent, step[agent], done.get(agent)))
                    if results[-1].error:
                        break
            failed = next((r.error for r in results if r.error), None)
            if not failed:
                others = self._other_backwards(step)
                failed = next((r.error for _, _, r in others if r.error), None)
            if failed:
                raise FloatingPointError(
                    f"{failed}; no agent was updated (weights, optimizer states, buffered samples and "
                    f"global_step are as before this step){self._last_good()}"
                )
        except BaseException:
            for optimizer in [self.optimizers[agent] for agent in agents] + [o for _, o, _ in others]:
                optimizer.zero_grad(set_to_none=True)
            raise
        for agent, result in zip(agents, results):
            self.optimizers[agent].step()
            self.optimizers[agent].zero_grad(set_to_none=True)
            self._note(f"train/{agent}/loss", result.loss)
            self._note(f"train/{agent}/grad_norm", result.grad_norm)
            if result.log_prob_mean is not None:
                self._note(f"train/{agent}/logprob_mean", result.log_prob_mean)
        for name, optimizer, result in others:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self._note(f"train/{name}/loss", result.loss)
            self._note(f"train/{name}/grad_norm", result.grad_norm)

    def _other_backwards(self, step: dict[str, list[Sample]]) -> list[tuple[str, torch.optim.Optimizer, "_Backward"]]:
        """Gradients of what else learns from this step's mini-batches, after every agent's
        gradient is known to be finite: ``(metric name, optimizer, _Backward)`` each, stepped
        together with the agents or not at all. None here; actor-critic learners: their critics."""
        return []

    def _local_loss(self, batch: list[Sample], log_probs: torch.Tensor, total: int) -> torch.Tensor:
        """This rank's share of the mean sample loss of ``batch`` (``total`` samples on all ranks)."""
        advantages = torch.tensor([a for s in batch for a in s.advantages], device=log_probs.device)
        return sample_losses(log_probs, advantages, [len(s.completions) for s in batch]).sum() / total

    def _team_backward(self, step: Mapping[str, list[Sample]]) -> dict[str, tuple[torch.Tensor, float | None]]:
        """For the agents of each team of adapters in ``step`` (at least two with samples): their
        answers scored in ONE forward, their finite losses back-propagated in ONE backward (each
        reaches only its agent's adapter). Returns agent -> (local loss, mean log-prob).
        Distributed runs score agents one by one (every rank then makes the same collective
        calls in the same order, whichever agents have samples there), as do learners whose
        loss is not this class's ``_loss_sum`` (the actor-critic learners)."""
        done: dict[str, tuple[torch.Tensor, float | None]] = {}
        if self.dist.enabled or type(self)._loss_sum is not MAGRPOTrainer._loss_sum:
            return done  # learners with their own loss (actor-critic) score agents one by one
        with_samples = {agent: batch for agent, batch in step.items() if batch}
        for group in _update_groups(self.policies, list(with_samples)):
            if len(group) < 2:
                continue
            for agent in group:
                self.optimizers[agent].zero_grad(set_to_none=True)
            scored = _score_batches(self.policies, {a: with_samples[a] for a in group}, self.args.logprob_reduction)
            finite = []
            for agent in group:
                local = self._local_loss(with_samples[agent], scored[agent], self.dist.sum(len(with_samples[agent])))
                if torch.isfinite(local):
                    finite.append(local)
                done[agent] = (local, scored[agent].detach().mean().item())
            if finite:
                torch.stack([f.to(finite[0].device) for f in finite]).sum().backward()
        return done

    def _backward(
        self, agent: str, batch: list[Sample], done: tuple[torch.Tensor, float | None] | None = None
    ) -> "_Backward":
        """Gradient of the mean sample loss of ``batch`` (of the union of the ranks' batches) in
        the agent's parameters, summed over ranks and clipped; nothing is stepped. ``done``: the
        loss and mean log-prob where the team's backward already ran (:meth:`_team_backward`)."""
        optimizer, params = self.optimizers[agent], self.trainable[agent]
        if done is not None:  # back-propagated with its team: only sum over ranks, check and clip
            local, log_prob_mean = done
            return self._gradient(f"agent {agent!r}", params, local.detach(), batch, log_prob_mean)
        total = self.dist.sum(len(batch))
        optimizer.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        log_prob_mean = None
        if batch:
            loss_sum, log_prob_mean = self._loss_sum(agent, batch)
            local = loss_sum / total
        return self._gradient(f"agent {agent!r}", params, local, batch, log_prob_mean)

    def _loss_sum(self, agent: str, batch: list[Sample]) -> tuple[torch.Tensor, float]:
        """The sum over ``batch`` of each sample's loss mean_k(-A_k log pi(answer_k)), differentiable,
        and the mean log pi of its answers."""
        observations = [s.observation for s in batch for _ in s.completions]
        completions = [c for s in batch for c in s.completions]
        log_probs = self.policies[agent].log_probs(observations, completions, reduction=self.args.logprob_reduction)
        advantages = torch.tensor([a for s in batch for a in s.advantages], device=log_probs.device)
        losses = sample_losses(log_probs, advantages, [len(s.completions) for s in batch])
        return losses.sum(), log_probs.detach().mean().item()

    def _gradient(
        self, who: str, params: list[torch.nn.Parameter], local: torch.Tensor, batch: list[Sample], log_prob_mean: float | None = None
    ) -> "_Backward":
        """Backpropagate this rank's share ``local`` of a mini-batch loss, sum the gradients of
        ``params`` over ranks and clip them; errors name ``who``, the optimizer step and the items."""
        if local.requires_grad and torch.isfinite(local):
            local.backward()
        loss = self.dist.sum(local.item())
        where = f"{who}, optimizer step {self.state.global_step + 1}, items {sorted({s.index for s in batch})}"
        if not math.isfinite(loss):
            return _Backward(loss, math.nan, log_prob_mean, f"{where}: loss is {loss}")
        self.dist.sum_gradients(params)
        grad_norm = _grad_norm(params, self.args.max_grad_norm).item()
        if not math.isfinite(grad_norm):
            return _Backward(loss, grad_norm, log_prob_mean, f"{where}: gradient norm is {grad_norm}")
        return _Backward(loss, grad_norm, log_prob_mean, None)

    def _rollout_seed(self) -> int:
        """The seed of this epoch's rollout trees: each tree's randomness depends only on it and
        the tree's item (tree.py), whatever the batching, ordering or rank."""
        return derive_seed(self.args.seed, "epoch", self.state.epoch)

    # --- reference KL -------------------------------------------------------------------------

    def _make_references(self) -> dict[str, Policy]:
        references = {}
        devices = self.args.reference_devices
        for i, agent in enumerate(self.agents):
            policy = self.policies[agent]
            own = getattr(policy, "reference_policy", None)
            if own is not None:  # e.g. an adapter's base with adapters disabled: no copy
                references[agent] = own()
                continue
            reference = copy.deepcopy(policy)
            if devices is not None and hasattr(reference, "to"):
                reference = reference.to(devices[i]) or reference
            for p in reference.parameters():
                p.requires_grad_(False)
            references[agent] = reference
        return references

    def _kl_penalty(self, agent: str, observations: Sequence[Any], completions: Sequence[Completion]) -> list[float]:
        with torch.no_grad():
            policy_values, mask = token_log_probs_of(self.policies[agent], observations, completions)
            reference_values, _ = token_log_probs_of(self.reference_policies[agent], observations, completions)
            kl = k3_kl(policy_values, reference_values.to(policy_values.device), mask)
        return kl.tolist()

    # --- logging and checkpoints --------------------------------------------------------------

    def _note(self, name: str, value: float) -> None:
        self._pending.setdefault(name, []).append(value)

    def _flush_metrics(self, force: bool = False) -> None:
        """Log the averaged pending training metrics at the index of the batch just trained."""
        if not self._pending or not (force or self.state.batch_step % self.args.logging_steps == 0):
            return
        metrics = {name: float(np.mean(values)) for name, values in self._pending.items()}
        self._pending = {}
        self.logger.log(metrics, self.state.batch_step - 1)

    def _after_batch(self, progress: Any, steps_before: int, epoch_done: bool) -> None:
        from llm_marl.runs import checkpoint

        reward = self._pending.get("train/turn_1/reward_mean")
        if reward:
            progress.set_postfix(reward=f"{reward[-1]:.3f}", step=self.state.global_step)
        self._flush_metrics(force=epoch_done)
        every = self.args.save_steps
        crossed = every and self.state.global_step // every > steps_before // every
        if crossed and self.args.output_dir is not None and self.dist.is_main:
            checkpoint.save(self)

    def _last_good(self) -> str:
        last = self.state.last_checkpoint
        return f"; last good checkpoint: {last}" if last else "; no checkpoint written yet"

    def _batches(self) -> list[list[int]]:
        n = _num_items(self.env)
        size = self.args.items_per_step * self.dist.world_size
        return [list(range(start, min(start + size, n))) for start in range(0, n, size)]

    def _hook_metrics(self, env: ParallelEnv, roots: list[RolloutNode]) -> dict[str, float]:
        """Call the eval hooks as the anchor library does: ``eval_logger`` once with every item
        (``agent_completions_turns[agent][item][turn]``), ``eval_aggregator`` on its list."""
        data = getattr(env, "data", None)
        chains = [list(root.nodes()) for root in roots]
        completions = [[[node.completions[a][0].text for node in chain] for chain in chains] for a in self.agents]
        items = [data[root.index] if data is not None else {"index": root.index} for root in roots]
        prompts = [item.get("prompt", "") if isinstance(item, Mapping) else "" for item in items]
        try:
            per_item = self.eval_logger(agent_completions_turns=completions, batch_items=items, prompts=prompts)
        except Exception as exc:
            raise RuntimeError(f"eval_logger raised {type(exc).__name__}: {exc} (evaluation at batch {self.state.batch_step})") from exc
        try:
            aggregated = self.eval_aggregator(per_item, num_turns=self.args.num_turns)
        except Exception as exc:
            raise RuntimeError(f"eval_aggregator raised {type(exc).__name__}: {exc} (evaluation at batch {self.state.batch_step})") from exc
        if not isinstance(aggregated, Mapping):
            raise TypeError(f"eval_aggregator must return a dict of metrics, got {type(aggregated).__name__}")
        return {f"eval/{name}": float(value) for name, value in aggregated.items()}


class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: no baseline."""

    config_class = MAREINFORCEConfig


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: leave-one-out baseline."""

    config_class = MARLOOConfig


class MAReMaxTrainer(MAGRPOTrainer):
    """Multi-agent ReMax: max baseline."""

    config_class = MAReMaxConfig


def episode_metrics(roots: Sequence[RolloutNode], num_turns: int, prefix: str) -> dict[str, float]:
    """``{prefix}/turn_k/reward_mean`` and ``.../expected_return`` over the nodes at each turn.

    ``reward_mean`` averages immediate rewards; ``expected_return`` averages returns (with
    discount 1 and one answer per agent, the sum of rewards from turn k on).
    """
    rewards: list[list[float]] = [[] for _ in range(num_turns)]
    returns: list[list[float]] = [[] for _ in range(num_turns)]
    for node in iter_nodes(roots):
        rewards[node.turn].extend(node.rewards)
        returns[node.turn].extend(node.returns)
    metrics = {}
    for t in range(num_turns):
        if rewards[t]:
            metrics[f"{prefix}/turn_{t + 1}/reward_mean"] = float(np.mean(rewards[t]))
            metrics[f"{prefix}/turn_{t + 1}/expected_return"] = float(np.mean(returns[t]))
    return metrics


def _update_groups(policies: Mapping[str, Policy], agents: Sequence[str]) -> list[list[str]]:
    """Agents updated together: each team of adapters (policies sharing a ``team`` that scores
    with ``log_probs(requests)``) is one group, every other agent its own, in agent order."""
    groups: list[list[str]] = []
    by_team: dict[int, list[str]] = {}
    for agent in agents:
        team = getattr(policies[agent], "team", None)
        if team is None or not hasattr(team, "log_probs"):
            groups.append([agent])
        elif id(team) in by_team:
            by_team[id(team)].append(agent)
        else:
            by_team[id(team)] = [agent]
            groups.append(by_team[id(team)])
    return groups


def _score_batches(
    policies: Mapping[str, Policy], batches: Mapping[str, list[Sample]], reduction: str
) -> dict[str, torch.Tensor]:
    """Each agent's log-probs of its batch's answers; a team's agents in one forward."""
    requests = {
        agent: ([s.observation for s in batch for _ in s.completions], [c for s in batch for c in s.completions])
        for agent, batch in batches.items()
        if batch
    }
    scored: dict[str, torch.Tensor] = {}
    for group in _update_groups(policies, list(requests)):
        team = getattr(policies[group[0]], "team", None)
        if len(group) > 1 and team is not None:
            scored.update(ask_team(policies, group, requests, lambda asked: team.log_probs(asked, reduction=reduction)))
        else:
            for agent in group:
                scored[agent] = policies[agent].log_probs(*requests[agent], reduction=reduction)
    return scored


def _instantiate(env: Any, name: str) -> ParallelEnv:
    if isinstance(env, ParallelEnv) or hasattr(env, "possible_agents"):
        return env
    if callable(env):
        made = env()
        if not hasattr(made, "possible_agents"):
            raise TypeError(f"{name} factory returned {type(made).__name__}, not a pettingzoo.ParallelEnv")
        return made
    raise TypeError(f"{name} must be a pettingzoo.ParallelEnv or a zero-argument factory, got {type(env).__name__}")


def _eval_split(env: ParallelEnv) -> tuple[ParallelEnv | None, str | None]:
    """The eval split of a plain DialogueEnv's task, or (None, why there is none). Wrapped and
    foreign envs have no split to take: they are evaluated only on an explicit ``eval_env``."""
    from llm_marl.envs.dialogue import DialogueEnv

    hint = (
        "pass eval_env= (the training env itself, if you mean to evaluate on training items), "
        "or eval_dataset= with the drop-in constructor"
    )
    if type(env) is not DialogueEnv:
        return None, f"the env is a {type(env).__name__}, not a DialogueEnv, so it has no eval split; {hint}"
    name = env.task.task_name
    try:
        data = env.task.dataset("eval")
    except Exception as exc:  # noqa: BLE001 - any failure means: no eval split
        return None, f"task {name}: dataset('eval') raised {type(exc).__name__}: {exc}; {hint}"
    if data is None or len(data) == 0:
        return None, f"task {name}: the eval split is empty; {hint}"
    try:
        return DialogueEnv(env.task, split="eval"), None
    except Exception as exc:  # noqa: BLE001
        return None, f"task {name}: the eval split cannot be played ({type(exc).__name__}: {exc}); {hint}"


def _num_items(env: ParallelEnv) -> int:
    data = getattr(env, "data", None)
    return len(data) if data is not None else getattr(env, "num_items", 1)


def _by_agent(values: Any, agents: list[str], name: str) -> dict[str, Any]:
    if values is None:
        raise TypeError(f"{name} is required: a dict agent -> value or a list in agent order {agents}")
    if isinstance(values, Mapping):
        if set(values) != set(agents):
            raise ValueError(f"{name} keys {sorted(values)} do not match the env's agents {agents}")
        return {a: values[a] for a in agents}
    values = list(values)
    if len(values) != len(agents):
        raise ValueError(f"{name}: expected {len(agents)} (one per agent {agents}), got {len(values)}")
    return dict(zip(agents, values))


class _NoProgress:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="training", unit="batch", dynamic_ncols=True, mininterval=1.0)
