"""The MAREINFORCE family of learners: MAGRPO, MAREINFORCE, MARLOO, MAReMax (docs/algorithms.md).

The training loop, top to bottom::

    claim the run folder, or load the checkpoint to resume          # runs/checkpoint.py
    for epoch in range(num_train_epochs):
        for batch b of items_per_step dataset indices:
            if eval_interval and b % eval_interval == 0: evaluate()      # evaluation.py
            trees   = collect_trees(env, policies, batch, args)          # tree.py
            samples = samples_from_trees(trees, ...)                     # buffer.py (+ reference KL)
            for each node's samples, in creation order:
                append to every agent's buffer
                if a buffer holds rollout_buffer_size samples: update()   # update.py: mini-batch steps of the full buffers
            log; maybe checkpoint                                        # runs/logging.py, runs/checkpoint.py
        update() on the partly filled buffers
    closing checkpoint; a signal stops after the batch                  # runs/checkpoint.py, runs/interrupt.py

The four trainers differ only in their config's default ``advantage_mode``. A trainer is built
either env-native — ``MAGRPOTrainer(env=..., policies=..., args=..., eval_env=None)`` where env is
a ``pettingzoo.ParallelEnv`` (or a zero-argument factory) and policies a dict agent -> Policy or
a list in agent order — or with the Hugging Face-compatible keywords of the anchor library
(``agent_model``/``agents``, ``reward_func``, ``formatters``, ... see docs/algorithms.md §7), which build a
:class:`~llm_marl.tasks.FunctionTask` and a :class:`~llm_marl.envs.DialogueEnv` internally.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from pettingzoo import ParallelEnv

from llm_marl import cpu
from llm_marl.learners.buffer import RolloutBuffer, Sample, node_groups, samples_from_trees
from llm_marl.learners.checks import check_horizon, check_menu_policies, check_policies, env_horizon
from llm_marl.learners.reinforce.config import MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig
from llm_marl.learners.evaluation import episode_metrics, evaluate, illegal_rates
from llm_marl.learners.evaluation import num_items as _num_items
from llm_marl.learners.stalls import dynamic_sampling, keep_entropy_differentiable, note_stalls
from llm_marl.learners.tree import RolloutNode, collect_trees, derive_seed, iter_nodes
from llm_marl.learners.update import JointUpdate, _score_batches, default_optimizer  # noqa: F401 (re-exported)
from llm_marl.policies.base import Completion, Policy
from llm_marl.policies.reference import frozen_references, kl_to_reference
from llm_marl.runs.distributed import DistributedContext
from llm_marl.runs.fsdp import gathered, save_consolidated, shard_agents
from llm_marl.runs.interrupt import StopRequests, TrainingInterrupted
from llm_marl.runs.logging import RunLogger, flush_before, flush_pending, open_wandb, wants_wandb
from llm_marl.runs.recording import RolloutRecorder
from llm_marl.runs.rng import seed_everything
from llm_marl.runs.run_dir import agent_folders
from llm_marl.tasks.base import TaskError


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
class _UnfinishedBatch:
    """A batch whose update raised, or stopped at ``max_steps``. The update left the buffers (and,
    cut by ``max_steps``, its remaining mini-batches) as they were, so ``train()`` called again
    (the cause fixed, or with a higher ``max_steps``; a cut batch is checkpointed) finishes that
    update and appends ``rest``, instead of collecting the batch a second time and training on
    its samples twice."""

    batch_step: int
    roots: list[RolloutNode]
    samples: list[Sample]
    elapsed: float
    rest: list[Sample]
    """The batch's samples not yet in the buffers."""


class AgentsByName:
    """llm_marl's trainer API for the agents: ``agents`` (their names), ``optimizers`` (a dict by
    name). The trainers read ``agent_ids`` and ``optimizer_by_agent``, so that the trainers of
    :mod:`llm_marl.comlrl` can answer CoMLRL's lists under these names instead."""

    agent_ids: list[str]
    optimizer_by_agent: dict[str, torch.optim.Optimizer]

    @property
    def agents(self) -> list[str]:
        """The agents' names, in the env's order (the trainer reads ``agent_ids``; the trainers of
        :mod:`llm_marl.comlrl` answer CoMLRL's list of models here instead)."""
        return self.agent_ids

    @agents.setter
    def agents(self, names: Sequence[str]) -> None:
        self.agent_ids = list(names)

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Agent name -> its optimizer (``optimizer_by_agent``; a list by agent position in
        :mod:`llm_marl.comlrl`)."""
        return self.optimizer_by_agent

    @optimizers.setter
    def optimizers(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.optimizer_by_agent = optimizers


class MAGRPOTrainer(AgentsByName, JointUpdate):
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
        cpu.configure_threads(self.args.num_threads)  # before any model is loaded or run
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
        self.agent_ids = list(self.env.possible_agents)
        if self.args.num_agents != len(self.agent_ids):
            raise ValueError(
                f"num_agents is {self.args.num_agents} but the env has {len(self.agent_ids)} agents {self.agent_ids}"
            )
        check_horizon(self.env, self.args.num_turns, "env")
        if self.eval_env is not None:
            check_horizon(self.eval_env, self.args.num_turns, "eval_env")
        self.policies = _by_agent(policies, self.agent_ids, "policies")
        check_policies(self.policies)
        if getattr(self.args, "natural_gradient", False):
            check_menu_policies(self.policies, getattr(self.args, "optim", "sgd"))
        if self.args.entropy_bonus_used:
            keep_entropy_differentiable(self.policies.values())
        if self.args.agent_devices is not None:
            for agent, device in zip(self.agent_ids, self.args.agent_devices):
                if hasattr(self.policies[agent], "to"):
                    self.policies[agent] = self.policies[agent].to(device) or self.policies[agent]
        self.dist = DistributedContext.from_environment()
        wanted = self.args.reference_kl_enabled or (self.args.fsdp and getattr(self.args, "dpo_reference", False))
        self.reference_policies = self._make_references() if wanted else None  # fsdp: copies made before sharding
        self.sharded: dict[str, Any] = shard_agents(self, optimizers) if self.args.fsdp else {}  # agent -> ShardedModel
        self.trainable = {a: [p for p in self.policies[a].parameters() if p.requires_grad] for a in self.agent_ids}
        if optimizers is None:
            rate = {a: self.args.learning_rate_of(i) for i, a in enumerate(self.agent_ids)}  # agent_learning_rates
            self.optimizer_by_agent = {a: default_optimizer(params, lr=rate[a], weight_decay=self.args.weight_decay, kind=self.args.optim)
                                       for a, params in self.trainable.items() if params}
        else:
            self.optimizer_by_agent = _by_agent(optimizers, self.agent_ids, "optimizers")
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.buffers = {a: RolloutBuffer() for a in self.agent_ids}
        self._unfinished: _UnfinishedBatch | None = None
        self.state = TrainerState()
        self.wandb = None
        if self.dist.is_main and (wandb_config is not None or wants_wandb(self.args.report_to)):
            self.wandb = open_wandb(wandb_config, {**self.args.to_dict(), **run_config}, self.args.output_dir)
        self.logger = RunLogger(None, mirrors=self._mirrors())
        self.recorder = RolloutRecorder.from_args(self.args, self.agent_ids, enabled=self.dist.is_main)
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
        once more where :func:`~llm_marl.runs.checkpoint.closing_wanted` says so
        (``save_final_checkpoint``).
        """
        from llm_marl.runs import checkpoint

        args = self.args
        if self._cannot_train:
            raise ValueError(self._cannot_train)
        seed_everything(args.seed)
        path = checkpoint.claim_run_folder(self, resume_from_checkpoint)
        if path is not None:
            checkpoint.load(self, path)  # a batch max_steps cut was recorded and evaluated: it is finished, not redone
            self.recorder.purge(self.state.batch_step + (self._unfinished is not None))
        self._weights_set()  # rank 0's weights on every rank; every agent's weight version 0 (staleness.py)
        self.logger = RunLogger(
            args.output_dir if self.dist.is_main else None,
            purge_step=self.state.batch_step + (self._unfinished is not None) if resume_from_checkpoint else None,
            mirrors=self._mirrors(),
        )
        batches = self._batches()
        total = self._num_epochs() * len(batches)
        self._schedule_batches = total  # the entropy bonus's schedule (entropy_coef_final) runs over these
        progress = _progress(total, self.state.epoch * len(batches) + self.state.batch_in_epoch, args.progress_bar)
        stop = StopRequests(checkpoints=checkpoint.closing_wanted(self) and self.dist.is_main).__enter__()
        try:
            while self.state.epoch < self._num_epochs() and not self._reached_max_steps():
                b = self.state.batch_in_epoch
                steps_before = self.state.global_step
                if not self._cut_pending():
                    self._batch_notes_start = {name: len(values) for name, values in self._pending.items()}
                if b == len(batches):  # train() again after the epoch's closing update raised or was cut
                    self._end_epoch()
                    self._after_batch(progress, steps_before, True)
                    continue
                if args.eval_interval and b % args.eval_interval == 0 and (self.dist.is_main or self.sharded) and self._unfinished is None:
                    self.evaluate()
                self._train_batch(self.dist.shard(batches[b], args.items_per_step))
                if self._unfinished is not None:
                    break  # max_steps reached inside the batch: its rest is kept
                self.state.batch_in_epoch += 1
                self.state.batch_step += 1
                epoch_done = self.state.batch_in_epoch == len(batches)
                if epoch_done:
                    self._end_epoch()
                progress.update(1)
                self._after_batch(progress, steps_before, epoch_done)
                if self.dist.max(int(stop.signum is not None)):
                    raise TrainingInterrupted(stop.signum or signal.SIGTERM, checkpoint.save_closing(self))
            self._flush_metrics(force=True)  # a run ended by max_steps mid-epoch logs its last batches too
            checkpoint.save_closing(self)
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

    def _reached_max_steps(self) -> bool:
        return self.args.max_steps is not None and self.state.global_step >= self.args.max_steps

    def evaluate(self, num_eval_samples: int | None = None, *, seed: int | None = None) -> dict[str, float]:
        """Play ``num_eval_samples`` (default ``eval_num_samples``) eval items once each, drawing
        from ``seed`` (default: from ``args.seed``), and return — and log — their metrics
        (:func:`llm_marl.learners.evaluation.evaluate` says more). ``fsdp=True``: all ranks call it, rank 0 plays, others get {}."""
        with self.gathered_weights():
            return evaluate(self, num_eval_samples, seed=seed) if self.dist.is_main or not self.sharded else {}

    def gathered_weights(self) -> Any:
        """Context: sharded agents (``fsdp=True``) hold their full weights; every rank enters it."""
        return gathered(self)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=4)

    def save_model(self, output_dir: str) -> None:
        """Write each agent's policy to ``output_dir/<agent>`` (:func:`~llm_marl.runs.run_dir.agent_folders`:
        ``final/player_1``; the drop-in constructor's ``agent_i``, as CoMLRL) with ``save_pretrained``
        where the policy has it, else ``policy.pt``. With ``fsdp=True`` every rank calls it; rank 0
        writes each agent's consolidated weights as one Hugging Face folder."""
        for agent, folder in zip(self.agent_ids, agent_folders(self.agent_ids)):
            target = os.path.join(output_dir, folder)
            os.makedirs(target, exist_ok=True)
            policy = self.policies[agent]
            if agent in self.sharded:
                save_consolidated(self.sharded[agent], policy, target, self.dist.is_main)
            elif hasattr(policy, "save_pretrained"):
                policy.save_pretrained(target)
            elif hasattr(policy, "state_dict"):
                torch.save(policy.state_dict(), os.path.join(target, "policy.pt"))

    # --- one dataset batch ----------------------------------------------------------------------

    def _end_epoch(self) -> None:
        """Train on what the buffers still hold, then count the epoch (once that update is done)."""
        self._update()
        if not self._update_cut():  # else max_steps cut it: train() again finishes it first
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0

    def _train_batch(self, indices: list[int]) -> None:
        """Roll out the items ``indices``, buffer their samples and update whenever the buffers are full. A batch whose
        update raises or stops at ``max_steps`` is kept (:class:`_UnfinishedBatch`): the next call finishes it."""
        self._reown_restored()  # a resume's buffered answers, its cut batch's included (staleness.py)
        unfinished, self._unfinished = self._unfinished, None
        if unfinished is not None and unfinished.batch_step == self.state.batch_step:
            if self._update_or_keep(unfinished):
                self._buffer_and_update(unfinished.batch_step, unfinished.roots, unfinished.samples, unfinished.elapsed, unfinished.rest)
            return
        with self.gathered_weights():  # fsdp: every rank gathers the full weights once for its rollout
            roots, samples, elapsed = self._collect(indices)
        self._buffer_and_update(self.state.batch_step, roots, samples, elapsed, samples)

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
            self._in_training(exc, f"a reward shared by agents {self.agent_ids}")
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
        if args.dynamic_sampling:
            samples = dynamic_sampling(self, samples)
        return roots, samples, elapsed

    def _buffer_and_update(
        self, batch_step: int, roots: list[RolloutNode], samples: list[Sample], elapsed: float, rest: list[Sample]
    ) -> None:
        """Append ``rest`` node by node, updating whenever a buffer is full, then log the batch."""
        args = self.args
        groups = node_groups(rest, self.agent_ids)  # one per node: its acting agents' samples
        for g, group in enumerate(groups):
            for sample in group:
                self.buffers[sample.agent].append(sample)
            if not self.dist.enabled and self._buffers_full():
                if not self._update_or_keep(_UnfinishedBatch(batch_step, roots, samples, elapsed, [s for later in groups[g + 1 :] for s in later])):
                    return  # max_steps: the batch is logged once it is finished
        if self.dist.enabled and self.dist.max(int(self._buffers_full())):
            if not self._update_or_keep(_UnfinishedBatch(batch_step, roots, samples, elapsed, [])):
                return
        stepped = sum(len(node.joint) for node in iter_nodes(roots))
        metrics = episode_metrics(roots, args.num_turns, prefix="train")
        metrics.update(illegal_rates(roots, "train"))
        metrics["train/env_steps_per_second"] = stepped / max(elapsed, 1e-9)
        metrics["train/skipped_items"] = self.state.skipped_items
        note_stalls(self, samples)
        for sample in samples:
            if not sample.completions:
                continue  # a preference learner's placeholder for an agent that did not act
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
            self.agent_ids,
            advantage_mode=args.advantage_mode,
            normalize={agent: args.advantage_normalization_of(i) for i, agent in enumerate(self.agent_ids)},
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

    def _rollout_seed(self) -> int:
        """The seed of this epoch's rollout trees: each tree's randomness depends only on it and
        the tree's item (tree.py), whatever the batching, ordering or rank."""
        return derive_seed(self.args.seed, "epoch", self.state.epoch)

    def _make_references(self) -> dict[str, Policy]:
        return frozen_references(self.policies, self.agent_ids, self.args.reference_devices)

    def _kl_penalty(self, agent: str, observations: Sequence[Any], completions: Sequence[Completion]) -> list[float]:
        return kl_to_reference(self.policies[agent], self.reference_policies[agent], observations, completions)

    # --- logging and checkpoints --------------------------------------------------------------

    def _note(self, name: str, value: float) -> None:
        self._pending.setdefault(name, []).append(value)

    def _flush_metrics(self, force: bool = False) -> None:
        """Log the averaged pending training metrics at the index of the batch just trained (cut by max_steps: once finished)."""
        if self._cut_pending():  # what earlier batches noted is logged; the batch's own wait (checkpointed)
            self._pending, self._batch_notes_start = flush_before(self._pending, getattr(self, "_batch_notes_start", {}), self.logger, self.state.batch_step), {}
            return
        flush_pending(self._pending, self.logger, self.state.batch_step, self.args.logging_steps, force)

    def _after_batch(self, progress: Any, steps_before: int, epoch_done: bool) -> None:
        from llm_marl.runs import checkpoint

        returns = self._pending.get("train/turn_1/expected_return")  # the whole episode's (a game pays at its end)
        if returns:
            progress.set_postfix(**{"return": f"{returns[-1]:.3f}"}, step=self.state.global_step)
        self._flush_metrics(force=epoch_done)
        checkpoint.save_if_due(self, steps_before)

    def _last_good(self) -> str:
        last = self.state.last_checkpoint
        return f"; last good checkpoint: {last}" if last else "; no checkpoint written yet"

    def _batches(self) -> list[list[int]]:
        n = _num_items(self.env)
        size = self.args.items_per_step * self.dist.world_size
        return [list(range(start, min(start + size, n))) for start in range(0, n, size)]

class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: no baseline."""

    config_class = MAREINFORCEConfig


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: leave-one-out baseline."""

    config_class = MARLOOConfig


class MAReMaxTrainer(MAGRPOTrainer):
    """Multi-agent ReMax: max baseline."""

    config_class = MAReMaxConfig


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
        split = getattr(env, "eval_split", None)  # a ProgramEnv with eval_items
        if callable(split) and (held_out := split()) is not None:
            return held_out, None
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
