"""The iterative preference learners, MADPOIter and MARLHFIter (docs/preference.md §5).

Both alternate collection and training for ``num_iterations`` rounds, with CoMLRL's fields. In a
round every train item is rolled out with ``preference_num_candidates`` (C) "current" answers
per agent and ``comparator_num_candidates`` (C', default C) "comparator" answers, all from the
current policies (``comparator_policy="current"``, the only comparator built here); candidate k
of each group forms joint answer k, and a pair compares current k with comparator k
(:func:`~llm_marl.learners.preference.math.select_comparison_pairs`, ``pair_selection``
``"comparator_reward"`` by default). The round's pairs are kept, and the pairs trained on are
chosen by ``preference_replay_mode``: ``"current"`` (this round's), ``"nearest_k"`` (a sample of
the last ``preference_replay_k`` rounds'), ``"all_history"`` or ``"lambda_decay"`` (every round,
weighted (1 − λ)·λ^age) — ``preference_replay_sample_size`` pairs, default this round's count.

* :class:`MADPOIterTrainer`: after a round's collection, ``num_train_epochs`` shuffled passes of
  the joint DPO loss (MADPO's) over the chosen pairs, ``train_batch_size`` pairs per step.
* :class:`MARLHFIterTrainer`: at the start of each round, a fresh reward model (the initial
  one's weights) is fit to the chosen pairs, then ``num_train_epochs`` epochs of RL against it;
  ``preference_scoring_reward="reward_model"`` labels the pairs of rounds after the first with
  the previous round's reward model instead of the env's reward.

The kept rounds are checkpoint extras, so runs resume exactly.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from llm_marl.learners.preference import math as pm
from llm_marl.learners.buffer import RolloutBuffer, Sample
from llm_marl.learners.config import _at_least, _one_of
from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer, PreferenceSample
from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer
from llm_marl.learners.tree import RolloutNode, derive_seed

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]

COMPARATOR_POLICIES = ("current",)
SCORING_REWARDS = ("task", "reward_model")


@dataclass
class _IterativeFields:
    """The fields both iterative configs add (CoMLRL's names and defaults)."""

    # --- rounds and replay ---
    num_iterations: int = 6
    """Rounds of collection then training."""
    preference_replay_mode: str = "current"
    """Pairs trained on: "current" (this round's), "nearest_k", "all_history" or "lambda_decay"."""
    preference_replay_k: int | None = None
    """nearest_k: sample from the last k rounds (required there; None or 1 for "current")."""
    preference_replay_lambda: float | None = None
    """lambda_decay: round weights (1 - lambda) * lambda^age, lambda in [0, 1] (required there)."""
    preference_replay_sample_size: int | None = None
    """Replay modes: pairs sampled per round; None: this round's pair count."""
    # --- the comparator ---
    comparator_policy: str = "current"
    """Who writes the comparator answers: "current" (the current policies; CoMLRL's other comparators are not built here)."""
    comparator_num_candidates: int | None = None
    """C': comparator answers per agent per item; None: preference_num_candidates."""
    comparator_generation_mode: str = "decentralized"
    """"decentralized" (one comparator answer per agent); "centralized" is not built here."""
    comparator_centralized_agent_index: int = 0
    """Accepted for CoMLRL scripts; must be 0 with collaboration_mode "centralized" (one actor), else unused (centralized comparators are not built here)."""
    comparator_model_name: str | None = None
    """Accepted for CoMLRL scripts; must be None (comparator_policy "model" is not built here)."""
    comparator_history_k: int | None = None
    """Accepted for CoMLRL scripts; must be None (comparator_policy "history" is not built here)."""
    comparator_api_url: str | None = None
    """Accepted for CoMLRL scripts; must be None (comparator_policy "api" is not built here)."""
    # --- CoMLRL's output folders (accepted; this run's files live in output_dir) ---
    preference_replay_dir: str | None = None
    """Accepted for CoMLRL scripts; the kept rounds are saved in checkpoints instead."""
    policy_checkpoint_dir: str | None = None
    """Accepted for CoMLRL scripts; checkpoints go to output_dir every save_steps steps."""
    log_reward_distribution: bool = False
    """Accepted for CoMLRL scripts; unused (iter/ metrics log pair counts per round)."""

    def _check_iterative(self) -> None:
        _at_least(self, "num_iterations", 1)
        if self.preference_refresh != "epoch":
            raise ValueError(f"preference_refresh must be 'epoch' for the iterative learners (their rounds refresh the pairs); got {self.preference_refresh!r}")
        _one_of(self, "preference_replay_mode", pm.REPLAY_MODES)
        _one_of(self, "comparator_policy", COMPARATOR_POLICIES)
        _one_of(self, "comparator_generation_mode", ("decentralized",))
        if getattr(self, "collaboration_mode", None) == "centralized" and self.comparator_centralized_agent_index != 0:
            raise ValueError("comparator_centralized_agent_index must be actor index 0 with collaboration_mode='centralized' "
                             f"(one actor); got {self.comparator_centralized_agent_index!r}")
        for name in ("comparator_model_name", "comparator_history_k", "comparator_api_url"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} belongs to a comparator not built here (comparator_policy must be 'current'); got {getattr(self, name)!r}")
        if self.comparator_num_candidates is not None:
            _at_least(self, "comparator_num_candidates", 1)
        if self.joint_mode != "aligned":
            raise ValueError(f"joint_mode must be 'aligned' for the iterative learners (candidate k of each agent forms joint answer k); got {self.joint_mode!r}")
        mode, k, lam, size = self.preference_replay_mode, self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        if mode == "current":
            if k not in (None, 1):
                raise ValueError(f"preference_replay_k must be None or 1 when preference_replay_mode='current'; got {k!r}")
            if size is not None:
                raise ValueError("preference_replay_sample_size is only for preference_replay_mode 'nearest_k', 'all_history' or 'lambda_decay'")
        elif mode == "nearest_k":
            if k is None:
                raise ValueError("preference_replay_k is required when preference_replay_mode='nearest_k'")
            _at_least(self, "preference_replay_k", 1)
        elif k is not None:
            raise ValueError(f"preference_replay_k is only for preference_replay_mode='nearest_k'; got {k!r}")
        if mode == "lambda_decay":
            if lam is None or not 0.0 <= float(lam) <= 1.0:
                raise ValueError(f"preference_replay_lambda must be in [0, 1] when preference_replay_mode='lambda_decay'; got {lam!r}")
        elif lam is not None:
            raise ValueError(f"preference_replay_lambda is only for preference_replay_mode='lambda_decay'; got {lam!r}")
        if size is not None:
            _at_least(self, "preference_replay_sample_size", 1)

    def _pair_selections(self) -> tuple[str, ...]:
        return pm.PAIR_SELECTIONS + ("comparator_reward",)


@dataclass
class MADPOIterConfig(_IterativeFields, MADPOConfig):
    """Configuration of :class:`MADPOIterTrainer` (CoMLRL's defaults)."""

    num_train_epochs: int = 1
    """DPO passes over each round's chosen pairs."""
    preference_num_candidates: int = 20
    """C: current answers per agent per item (>= 2)."""
    preference_pairs_per_sample: int | None = 4
    """At most this many pairs per item; None: every pair (required for pair_selection="all")."""
    pair_selection: str = "comparator_reward"
    """"comparator_reward" (highest comparator reward, then gap), "reward_gap", "all" or "random"."""

    def validate(self) -> None:
        super().validate()
        self._check_iterative()


@dataclass
class MARLHFIterConfig(_IterativeFields, MARLHFConfig):
    """Configuration of :class:`MARLHFIterTrainer` (CoMLRL's defaults)."""

    num_train_epochs: int = 2
    """RL epochs against each round's reward model."""
    preference_num_candidates: int = 20
    """C: current answers per agent per item (>= 2)."""
    preference_pairs_per_sample: int | None = 4
    """At most this many pairs per item; None: every pair (required for pair_selection="all")."""
    pair_selection: str = "comparator_reward"
    """"comparator_reward" (highest comparator reward, then gap), "reward_gap", "all" or "random"."""
    reward_num_train_epochs: int = 2
    """Passes of each round's Bradley-Terry fit."""
    preference_scoring_reward: str = "task"
    """Labels of rounds after the first: "task" (the env's reward) or "reward_model" (the previous round's model)."""

    def normalize(self) -> None:
        super().normalize()
        value = str(self.preference_scoring_reward).strip().lower()
        self.preference_scoring_reward = {"env": "task", "environment": "task", "oracle": "task", "model": "reward_model", "learned": "reward_model"}.get(value, value)

    def validate(self) -> None:
        super().validate()
        self._check_iterative()
        _one_of(self, "preference_scoring_reward", SCORING_REWARDS)


class _Rounds:
    """The kept rounds' pairs (checkpointed as a state dict)."""

    def __init__(self) -> None:
        self.rounds: list[list[Any]] = []
        self.fitted = -1  # MARLHFIter: the round whose reward model is fit
        self.cut: dict[str, Any] | None = None  # MADPOIter: a round's training stopped by max_steps (round, chosen pairs, steps done)

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "fitted": self.fitted, "cut": self.cut}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds, self.fitted, self.cut = list(state["rounds"]), int(state["fitted"]), state.get("cut")


def _choose(args: Any, rounds: _Rounds, current: list[Any], round_: int) -> list[Any]:
    """Append ``current`` to the kept rounds and return the pairs to train on (replay mode)."""
    mode = args.preference_replay_mode
    rounds.rounds.append(current)
    if mode == "current":
        rounds.rounds = rounds.rounds[-1:]
        return list(current)
    if mode == "nearest_k":
        rounds.rounds = rounds.rounds[-args.preference_replay_k :]
    kept = rounds.rounds
    size = args.preference_replay_sample_size
    if size is None:
        size = len(current) or next((len(r) for r in reversed(kept) if r), 0)
    weights = pm.lambda_decay_weights(len(kept), float(args.preference_replay_lambda)) if mode == "lambda_decay" else None
    rng = random.Random(derive_seed(args.seed, "preference_replay", round_))
    return [kept[r][i] for r, i in pm.replay_sample([len(r) for r in kept], size, rng, weights)]


def _comparison_pairs(args: Any, rewards: Sequence[float], rng: random.Random) -> list[tuple[int, int]]:
    """Joint-answer indices (current k is k, comparator k is C + k) of an item's pairs."""
    c = args.preference_num_candidates
    index = {"current": lambda k: k, "comparator": lambda k: c + k}
    pairs = pm.select_comparison_pairs(rewards[:c], rewards[c:], args.pair_selection, args.preference_pairs_per_sample, rng)
    return [(index[w[0]](w[1]), index[l[0]](l[1])) for w, l in pairs]


class MADPOIterTrainer(MADPOTrainer):
    """Iterative MADPO (see the module docstring); env-native like :class:`MADPOTrainer`."""

    _fsdp_supported = False  # fsdp=True: refused with a one-line error (not sharded yet)

    config_class = MADPOIterConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.dist.enabled:
            raise ValueError("MADPOIterTrainer does not run distributed yet (each round's pairs are trained on one process)")
        self.rounds = _Rounds()

    def _num_epochs(self) -> int:
        return self.args.num_iterations

    def checkpoint_extras(self) -> dict[str, Any]:
        """The kept rounds' pairs."""
        return {"preference_rounds": self.rounds}

    def _candidates(self) -> int:
        """C current plus C' comparator answers per agent per item."""
        return self.args.preference_num_candidates + (self.args.comparator_num_candidates or self.args.preference_num_candidates)

    def _node_pairs(self, node: RolloutNode) -> list[tuple[int, int]]:
        return _comparison_pairs(self.args, node.rewards, self._pair_rng(node))

    def _buffers_full(self) -> bool:
        return False  # a round trains once all of its items are collected

    def _update_cut(self) -> bool:
        return self.rounds.cut is not None or super()._update_cut()

    def _end_epoch(self) -> None:
        """Train the round; the round counts as done unless ``max_steps`` cut its training (then
        ``train()`` with a higher ``max_steps``, or resumed without one, finishes it first)."""
        self._update()
        if self.rounds.cut is None:
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _update(self, full_only: bool = False) -> None:
        """The round's training (``full_only`` does not apply: a round trains at its end): its
        pairs (one sample per pair and agent) join the kept rounds, the replay mode chooses the
        pairs, then ``num_train_epochs`` shuffled passes of ``train_batch_size`` pairs per
        optimizer step. ``max_steps`` is checked before every optimizer step: reached, the rest
        of the round is kept (``rounds.cut``, checkpointed) for the next call. A step that raises
        (a non-finite loss) ends the round's training there (the steps before it stand, no agent
        takes that step); ``train()`` again goes on with the next round."""
        args = self.args
        if self.rounds.cut is not None:
            round_, chosen, done = self.rounds.cut["round"], self.rounds.cut["chosen"], self.rounds.cut["done"]
        else:
            if not any(self.buffers[a].samples for a in self.agent_ids):
                return
            current = _split_pairs({a: list(self.buffers[a].samples) for a in self.agent_ids}, self.agent_ids)
            for agent in self.agent_ids:
                self.buffers[agent] = RolloutBuffer()
            round_, done = self.state.epoch, 0
            chosen = _choose(args, self.rounds, current, round_)
            self._note("iter/round", float(round_))
            self._note("iter/current_preference_pairs", float(len(current)))
            self._note("iter/train_preference_pairs", float(len(chosen)))
        trained = [a for a in self.agent_ids if a in self.optimizer_by_agent]
        size = args.resolved_train_batch_size
        plan = []
        for epoch in range(args.num_train_epochs):
            order = list(range(len(chosen)))
            random.Random(derive_seed(args.seed, "preference_round_epoch", round_, epoch)).shuffle(order)
            plan += [order[start : start + size] for start in range(0, len(order), size)]
        self.rounds.cut = None
        for k in range(done, len(plan)):
            if self._reached_max_steps():
                self.rounds.cut = {"round": round_, "chosen": chosen, "done": k}
                return
            self._joint_optimizer_step({a: [chosen[j][a] for j in plan[k]] for a in trained})
            self.state.global_step += 1


def _split_pairs(samples: dict[str, list[PreferenceSample]], agents: Sequence[str]) -> list[dict[str, PreferenceSample]]:
    """One entry per pair: agent -> that agent's sample holding only the pair."""
    out = []
    for n in range(len(samples[agents[0]])):
        per_agent = {a: samples[a][n] for a in agents}
        for q in range(len(per_agent[agents[0]].pairs)):
            out.append({
                a: dataclasses.replace(
                    s, pairs=[s.pairs[q]], answer_pairs=[s.answer_pairs[q]], pair_rewards=[s.pair_rewards[q]],
                    reference_log_probs=[s.reference_log_probs[q]] if s.reference_log_probs else [], fixed_margins=[s.fixed_margins[q]],
                )
                for a, s in per_agent.items()
            })
    return out


class MARLHFIterTrainer(MARLHFTrainer):
    """Iterative MARLHF (see the module docstring); env-native like :class:`MARLHFTrainer`."""

    config_class = MARLHFIterConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rounds = _Rounds()
        self._initial_reward_state = {k: v.detach().clone() for k, v in self.reward_model.state_dict().items()}

    def _num_epochs(self) -> int:
        return self.args.num_iterations * self.args.num_train_epochs

    def checkpoint_extras(self) -> dict[str, Any]:
        """The reward model, its optimizer, the phase flag and the kept rounds' pairs."""
        return {**super().checkpoint_extras(), "preference_rounds": self.rounds}

    def _collection_candidates(self) -> int:
        return self.args.preference_num_candidates + (self.args.comparator_num_candidates or self.args.preference_num_candidates)

    def _item_pairs(self, node: RolloutNode, rng: random.Random) -> list[tuple[int, int]]:
        rewards = node.rewards
        if self.args.preference_scoring_reward == "reward_model" and self.rounds.fitted >= 0:
            rewards = self.reward_model_scores([node])[0]
        return _comparison_pairs(self.args, rewards, rng)

    def _collect(self, indices: list[int]) -> tuple[list[RolloutNode], list[Sample], float]:
        round_ = self.state.epoch // self.args.num_train_epochs
        if self.rounds.fitted != round_:
            self._fit_round(round_)
        return MARLHFTrainer._collect(self, indices)

    def _fit_round(self, round_: int) -> None:
        """Collect the round's pairs, choose the replayed ones, and fit a fresh reward model."""
        current = self.preference_pairs(round_)
        chosen = _choose(self.args, self.rounds, current, round_)
        self.logger.log({"iter/round": float(round_), "iter/current_preference_pairs": float(len(current)),
                         "iter/train_preference_pairs": float(len(chosen))}, self.state.batch_step)
        if not chosen:
            raise ValueError(f"MARLHFIter round {round_}: no preference pair (every candidate pair of every item tied); raise preference_num_candidates or check the reward")
        self.reward_model.load_state_dict(self._initial_reward_state)
        self.reward_optimizer.state.clear()
        self.reward_pairs = chosen
        self.fit_reward_model(chosen)
        self.reward_phase.done, self.reward_phase.pairs = True, len(chosen)
        self.rounds.fitted = round_
