"""MARLHF: learn a joint reward model from preference pairs, then train the agents by RL against
it (docs/preference.md).

Phase 1, once, before the first training batch: every train item is rolled out as in MADPO
(``preference_num_candidates`` answers per agent, pairs chosen from the env's shared reward),
and a :class:`JointRewardModel` over the joint answer's text
(:func:`~llm_marl.policies.critic.joint_observation` with the answers) is fit to the pairs with
the Bradley–Terry loss −log σ(s(w) − s(l)) for ``reward_num_train_epochs`` epochs.

Phase 2: the loop of the configured ``rl_algorithm`` (MAGRPO, MAREINFORCE, MARLOO, MAReMax;
or IAC / MAAC, whose critics are then trained on the model's scores: :func:`actor_critic_form`),
with ``num_generations`` answers per agent; every joint action's reward is the reward
model's score instead of the env's. The env's reward is still what is logged as
``train/turn_1/reward_mean`` and what evaluation measures; the score is logged as
``train/reward_model/score_mean``.

The reward model, its optimizer and the phase flag are saved in checkpoints, so a resumed run
continues phase 2 exactly without refitting.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import random
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from llm_marl.learners.preference import math as pm
from llm_marl.learners.buffer import Sample
from llm_marl.learners.config import _at_least, _one_of, _positive
from llm_marl.learners.preference.madpo import MADPOConfig, centralize_if_asked
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer, _num_items
from llm_marl.learners.tree import RolloutNode, collect_trees, derive_seed, iter_nodes
from llm_marl.policies.base import Completion
from llm_marl.policies.critic import joint_observation
from llm_marl.policies.lm_runner import context_length
from llm_marl.policies.weight_changes import optimizer_parameters, weights_changed
from llm_marl.runs.fsdp import fitting_sharded, regather

__all__ = ["HashedNgramBackbone", "JointRewardModel", "JointText", "MARLHFConfig", "MARLHFTrainer", "comlrl_joint_text", "joint_answer_text"]

RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "marloo": "rloo", "maremax": "max"}
"""rl_algorithm -> the advantage_mode of its REINFORCE learner."""
ACTOR_CRITIC_ALGORITHMS = ("iac", "maac")


def joint_answer_text(observations: Any, agents: Sequence[str], answers: Sequence[str]) -> str:
    """The reward model's input: every agent's prompt, then every agent's answer."""
    return joint_observation(observations, agents, list(answers))


def comlrl_joint_text(prompts: Sequence[str], answers: Sequence[str]) -> str:
    """CoMLRL's reward-model text: each agent's prompt followed by its response, agent by agent
    ("Joint multi-agent response", then "Agent k prompt:" / "Agent k response:" blocks, k from 1)."""
    parts = ["Joint multi-agent response"]
    for k, (prompt, answer) in enumerate(zip(prompts, answers), start=1):
        parts += [f"Agent {k} prompt:\n{prompt}", f"Agent {k} response:\n{answer}"]
    return "\n\n".join(parts)


class JointText(str):
    """A joint answer's text (a ``str``: what is shown and compared) that also knows its pieces,
    ``(role, text, ids)`` with role "frame", "prompt" or "answer": ``ids`` are the token ids the
    agent's own model reads for that piece (its templated prompt, its generated answer), or None
    (the reward model tokenizes ``text``). :meth:`JointRewardModel.encode` reads the pieces, and
    cuts only prompts (from their left) to fit the model."""

    pieces: tuple[tuple[str, str, tuple[int, ...] | None], ...]

    def __new__(cls, pieces: Sequence[tuple[str, str, Sequence[int] | None]]) -> "JointText":
        pieces = tuple((role, text, None if ids is None else tuple(int(t) for t in ids)) for role, text, ids in pieces)
        bad = [role for role, _, _ in pieces if role not in ("frame", "prompt", "answer")]
        if bad:
            raise ValueError(f"JointText: piece role {bad[0]!r} is not 'frame', 'prompt' or 'answer'")
        self = super().__new__(cls, "".join(text for _, text, _ in pieces))
        self.pieces = pieces
        return self

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self.pieces,)


def _cap(lengths: Sequence[int], budget: int) -> int:
    """The largest c with sum(min(n, c) for n in lengths) <= budget."""
    low, high = 0, max(lengths, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def fit_pieces(pieces: Sequence[tuple[str, list[int]]], limit: int | None) -> list[int]:
    """The token ids of ``(role, ids)`` pieces joined, at most ``limit`` of them. When too long,
    prompts lose tokens from their left, the longest first (each keeps its last ``c`` tokens,
    ``c`` as large as fits); if even empty prompts do not fit, the frames are cut the same way.
    Answers are kept whole: ValueError when they alone exceed ``limit``."""
    total = sum(len(ids) for _, ids in pieces)
    if limit is None or total <= limit:
        return [t for _, ids in pieces for t in ids]
    answers = sum(len(ids) for role, ids in pieces if role == "answer")
    if answers > limit:
        raise ValueError(f"reward model: the joint answer's answers take {answers} tokens, over its limit of {limit} "
                         "(reward_max_length, or the model's positions); raise reward_max_length or lower max_new_tokens")
    frames = sum(len(ids) for role, ids in pieces if role == "frame")
    keep = {"prompt": _cap([len(ids) for role, ids in pieces if role == "prompt"], max(0, limit - answers - frames))}
    keep["frame"] = _cap([len(ids) for role, ids in pieces if role == "frame"], limit - answers) if frames + answers > limit else frames
    out: list[int] = []
    for role, ids in pieces:
        out += ids if role == "answer" else ids[len(ids) - min(len(ids), keep[role]) :]
    return out


class HashedNgramBackbone(nn.Module):
    """A small text backbone: the mean of learned embeddings of the text's hashed word 1- to
    ``max_n``-grams (CRC32 into ``buckets``); ``hidden_size`` features per text. For toy tasks
    and tests; language models are the backbone for real text."""

    def __init__(self, hidden_size: int = 16, buckets: int = 4096, max_n: int = 3, seed: int = 0):
        super().__init__()
        self.hidden_size, self.buckets, self.max_n = hidden_size, buckets, max_n
        generator = torch.Generator().manual_seed(seed)
        self.embedding = nn.EmbeddingBag(buckets, hidden_size, mode="mean")
        with torch.no_grad():
            self.embedding.weight.copy_(torch.randn(buckets, hidden_size, generator=generator))

    def ids(self, text: str) -> list[int]:
        words = text.lower().split()
        grams = [" ".join(words[i : i + n]) for n in range(1, self.max_n + 1) for i in range(len(words) - n + 1)]
        return [zlib.crc32(g.encode("utf-8")) % self.buckets for g in grams] or [0]

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        ids = [self.ids(t) for t in texts]
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long, device=self.embedding.weight.device)
        offsets = torch.tensor([0] + [len(r) for r in ids[:-1]], dtype=torch.long, device=flat.device).cumsum(0)
        return self.embedding(flat, offsets)


class JointRewardModel(nn.Module):
    """A backbone plus a scalar head over the joint answer.

    Args:
        backbone: a causal LM (with ``config.hidden_size``, ``n_embd`` or ``d_model``; then
            the head reads the last real token's final hidden state; scoring texts needs
            ``tokenizer``, calling the model on token ids does not), or a module mapping a list of texts to ``[len(texts), hidden_size]``
            features (with a ``hidden_size`` attribute), e.g. :class:`HashedNgramBackbone`.
        freeze_backbone: train only the head.
        tokenizer: the language-model backbone's tokenizer.
        max_length: at most this many tokens per text; None: the model's positions (when its
            config declares them). A :class:`JointText` loses prompt tokens only, from the left
            of each prompt; a plain text is cut on ``truncation_side``.
        seed: initialize the head from this seed (torch's default initialization otherwise,
            from the global RNG).
        truncation_side: where a plain text too long for the model is cut: "left" (keep its
            end, where llm_marl's joint text has the answers) or "right" (CoMLRL).

    A language-model backbone scores every text as it scores it alone: rows are left-padded
    with ``position_ids = cumsum(attention_mask) - 1``, whatever the tokenizer's padding side.
    The model is in eval mode except while :meth:`MARLHFTrainer.fit_reward_model` fits it.
    """

    def __init__(self, backbone: nn.Module, freeze_backbone: bool = False, *, tokenizer: Any = None, max_length: int | None = None,
                 seed: int | None = None, truncation_side: str = "left"):
        super().__init__()
        self.backbone = backbone
        config = getattr(backbone, "config", None)
        self.is_language_model = config is not None
        hidden = getattr(backbone, "hidden_size", None) if config is None else next(
            (getattr(config, n) for n in ("hidden_size", "n_embd", "d_model") if getattr(config, n, None)), None
        )
        if hidden is None:
            raise ValueError(f"JointRewardModel: cannot tell the hidden size of backbone {type(backbone).__name__} (config.hidden_size / n_embd / d_model, or a hidden_size attribute)")
        if truncation_side not in ("left", "right"):
            raise ValueError(f"JointRewardModel: truncation_side must be 'left' or 'right', got {truncation_side!r}")
        self.tokenizer, self.max_length, self.truncation_side = tokenizer, max_length, truncation_side
        self.takes_position_ids = self.is_language_model and "position_ids" in inspect.signature(backbone.forward).parameters
        self.context_length = context_length(backbone) if self.is_language_model else None
        reference = next(backbone.parameters())
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.reward_head = nn.Linear(int(hidden), 1)
        self.reward_head.to(device=reference.device, dtype=reference.dtype)
        if freeze_backbone:
            for p in self.backbone.parameters():
                p.requires_grad_(False)
        self.eval()

    @property
    def limit(self) -> int | None:
        """Most tokens a text may have: ``max_length`` and the model's positions, the smaller."""
        found = [n for n in (self.max_length, self.context_length) if n]
        return min(found) if found else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores of tokenized joint answers (language-model backbone): the head on the final
        hidden state of each row's last real token (left or right padding; positions count
        real tokens only, so a row scores as it does alone)."""
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "output_hidden_states": True, "use_cache": False}
        if self.takes_position_ids:
            inputs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(**inputs).hidden_states[-1]
        positions = torch.arange(attention_mask.size(1), device=hidden.device).expand_as(attention_mask)
        last = positions.masked_fill(attention_mask == 0, 0).max(dim=1).values
        pooled = hidden[torch.arange(hidden.size(0), device=hidden.device), last]
        return self.reward_head(pooled).squeeze(-1)

    def _ids(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids the language-model backbone reads for each text (at most :attr:`limit`)."""
        if self.tokenizer is None:
            raise ValueError("JointRewardModel: scoring texts with a language-model backbone needs its tokenizer= "
                             "(without one it scores token ids: model(input_ids, attention_mask))")
        limit, rows = self.limit, []
        for text in texts:
            pieces = getattr(text, "pieces", None)
            if pieces is not None:
                ids = fit_pieces([(role, list(ids) if ids is not None else self._ids(part, False)) for role, part, ids in pieces], limit)
            else:
                ids = self._ids(str(text), True)
                if limit and len(ids) > limit:
                    ids = ids[:limit] if self.truncation_side == "right" else ids[-limit:]
            rows.append(ids or [int(self.tokenizer.eos_token_id)])
        return rows

    def scores(self, texts: Sequence[str]) -> torch.Tensor:
        """One differentiable scalar score per joint-answer text, each as it scores alone."""
        device = self.reward_head.weight.device
        if not self.is_language_model:
            return self.reward_head(self.backbone(list(texts)).to(self.reward_head.weight)).squeeze(-1)
        rows = self.encode(texts)
        if not rows:
            return torch.zeros(0, device=device, dtype=self.reward_head.weight.dtype)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        return self.forward(input_ids.to(device), attention_mask.to(device))


@dataclass
class MARLHFConfig(MADPOConfig):
    """Configuration of :class:`MARLHFTrainer`: MADPOConfig's preference fields (phase 1), the
    reward model's, and the RL phase's (MAGRPOConfig's fields, ``num_generations`` answers)."""

    # --- the RL phase ---
    rl_algorithm: str = "magrpo"
    """RL against the reward model: "magrpo", "mareinforce", "marloo", "maremax" (sets advantage_mode), "iac" or "maac"."""
    num_generations: int = 4
    """K: answers per agent per item in the RL phase (>= 2; >= 1 with rl_algorithm "iac"/"maac", whose critics need no group)."""

    # --- the reward model ---
    reward_model_name: str | None = None
    """Backbone of the reward model: a causal-LM id or path; None: a copy of the first agent's model, or a HashedNgramBackbone for toy policies."""
    reward_model_device: str | None = None
    """Device of the reward model; None: the first agent's device (CPU for toy policies)."""
    reward_learning_rate: float = 1e-5
    """AdamW rate of the reward model (> 0)."""
    reward_num_train_epochs: int = 1
    """Passes of the Bradley-Terry fit over the preference pairs."""
    reward_train_batch_size: int = 1
    """Pairs per reward-model optimizer step."""
    reward_max_length: int | None = None
    """At most this many tokens of reward-model input (prompts are cut from their left, answers kept); None: the model's positions."""
    reward_freeze_backbone: bool = False
    """Train only the reward model's scalar head."""

    # --- the actor-critic RL phase (rl_algorithm "iac"/"maac"; docs/actor_critic.md) ---
    critic_model_name: str | None = None
    """iac/maac: the critics' model id or path (drop-in constructor); None: as IAC/MAAC choose (a copy of each actor's model, or a TabularCritic)."""
    critic_learning_rate: float | None = None
    """iac/maac: AdamW rate of the critics; None: agent_learning_rate."""
    critic_devices: Sequence[str] | str | None = None
    """iac/maac: device of each critic (one string: the same for all); default: its agent's device."""
    use_separate_critic: bool = True
    """iac: True: each critic is its own model; False: a value head on the agent's own model."""
    critic_type: str = "v"
    """iac/maac: "v" (state values) or "q" (action values)."""
    value_loss_coef: float = 0.6
    """iac/maac: weight of the value loss."""
    value_clip_range: float | None = 0.2
    """iac/maac: PPO-style value clipping range; None disables."""
    critic_value_head_hidden_dim: int | None = None
    """iac/maac: hidden width of a separate critic's value head; None: one linear layer."""
    value_head_hidden_dim: int | None = None
    """iac: hidden width of a shared (on-actor) value head; None: one linear layer."""

    @property
    def min_generations(self) -> int:  # type: ignore[override]
        """2 for the MAGRPO family's group baseline; 1 for the actor-critic RL phases (as IACConfig / MAACConfig)."""
        return 1 if str(self.rl_algorithm).strip().lower() in ACTOR_CRITIC_ALGORITHMS else 2

    def normalize(self) -> None:
        """As :meth:`MAGRPOConfig.normalize`; "mareforce" -> "mareinforce" (CoMLRL's alias), and
        advantage_mode follows rl_algorithm."""
        super().normalize()
        self.rl_algorithm = str(self.rl_algorithm).strip().lower()
        if self.rl_algorithm == "mareforce":
            self.rl_algorithm = "mareinforce"
        if self.rl_algorithm in RL_ALGORITHMS:
            self.advantage_mode = RL_ALGORITHMS[self.rl_algorithm]

    def validate(self) -> None:
        super().validate()
        _one_of(self, "rl_algorithm", tuple(RL_ALGORITHMS) + ACTOR_CRITIC_ALGORITHMS)
        _positive(self, "reward_learning_rate")
        _at_least(self, "reward_num_train_epochs", 1)
        _at_least(self, "reward_train_batch_size", 1)
        if self.reward_max_length is not None:
            _at_least(self, "reward_max_length", 1)

    def _check_reference_kl(self) -> None:
        """The RL phase may use the reference KL penalty."""


class _Phase:
    """Whether phase 1 is done (checkpointed as a state dict)."""

    def __init__(self) -> None:
        self.done, self.pairs = False, 0

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done, "pairs": self.pairs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.done, self.pairs = bool(state["done"]), int(state["pairs"])


class MARLHFTrainer(MAGRPOTrainer):
    """Multi-agent RLHF with a joint reward model (see the module docstring).

    Env-native: ``MARLHFTrainer(env=..., policies=..., args=MARLHFConfig(...), reward_model=None)``;
    ``reward_model`` a :class:`JointRewardModel` (default: see ``reward_model_name``).
    """

    _fsdp_supported = True  # fsdp=True: the reward model is built before the agents are sharded, then sharded too (runs/fsdp.py)

    config_class = MARLHFConfig
    reward_truncation_side = "left"
    """Where the default reward model cuts a plain text too long for it (JointText: prompts only)."""

    def __new__(cls, *positional: Any, **keywords: Any) -> "MARLHFTrainer":
        """An instance of the actor-critic form of ``cls`` (:func:`actor_critic_form`) when
        ``args.rl_algorithm`` is "iac" or "maac"."""
        args = keywords.get("args", positional[2] if len(positional) > 2 else None)
        algorithm = getattr(args, "rl_algorithm", None)
        if algorithm in ACTOR_CRITIC_ALGORITHMS and not getattr(cls, "actor_critic", False):
            cls = actor_critic_form(cls, algorithm)
        return super().__new__(cls)

    def __init__(self, env: Any = None, policies: Any = None, args: MARLHFConfig | None = None, eval_env: Any = None, *,
                 reward_model: JointRewardModel | None = None, reward_optimizer: torch.optim.Optimizer | None = None,
                 centralized_comparator_adapter: Any = None, **kwargs: Any):
        if args is not None and not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}")
        env, policies, args, eval_env, one = centralize_if_asked(env, policies, args, eval_env, centralized_comparator_adapter, type(self).__name__)
        self._reward_source, self.reward_model = reward_model, None
        super().__init__(env, policies, args, eval_env, **kwargs)  # fsdp=True: calls _make_reward_model before sharding
        if one is not None:
            one.attach(self)
        if self.reward_model is None:
            self._make_reward_model()
        params = [p for p in self.reward_model.parameters() if p.requires_grad]
        shards = [p for p in params if type(p).__name__ == "DTensor"]  # fsdp: a sharded backbone beside a whole head
        groups = [{"params": shards}, {"params": [p for p in params if type(p).__name__ != "DTensor"]}] if shards else params
        self.reward_optimizer = reward_optimizer or torch.optim.AdamW(groups, lr=self.args.reward_learning_rate, weight_decay=self.args.weight_decay)
        self.reward_phase = _Phase()
        self.reward_pairs: list[tuple[str, str]] = []
        """The (winner, loser) texts the reward model was fit to (this process only; not checkpointed)."""

    def _make_reward_model(self) -> None:
        """The reward model given to the constructor, or the default one, on ``reward_model_device``."""
        self.reward_model = self._reward_source if self._reward_source is not None else self._default_reward_model()
        if self.args.reward_model_device is not None:
            self.reward_model.to(self.args.reward_model_device)

    def _default_reward_model(self) -> JointRewardModel:
        args = self.args
        seed = derive_seed(args.seed, "reward_head")
        if args.reward_model_name is not None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            backbone = AutoModelForCausalLM.from_pretrained(args.reward_model_name)
            tokenizer = AutoTokenizer.from_pretrained(args.reward_model_name)
            return JointRewardModel(backbone.float(), args.reward_freeze_backbone, tokenizer=tokenizer, max_length=args.reward_max_length,
                                    seed=seed, truncation_side=self.reward_truncation_side)
        first = self.policies[self.agent_ids[0]]
        model, tokenizer = getattr(first, "model", None), getattr(first, "tokenizer", None)
        if model is not None and tokenizer is not None:
            backbone = copy.deepcopy(model)
            if callable(getattr(backbone, "unload", None)):  # a peft model (adapter team): the base without adapters
                backbone = backbone.unload()
            backbone.float()  # trained in float32 whatever the agent's dtype: a bf16 copy at lr 1e-5 barely moves
            for p in backbone.parameters():
                p.requires_grad_(True)
            return JointRewardModel(backbone, args.reward_freeze_backbone, tokenizer=tokenizer, max_length=args.reward_max_length, seed=seed,
                                    truncation_side=self.reward_truncation_side)
        return JointRewardModel(HashedNgramBackbone(seed=derive_seed(args.seed, "reward_model")), args.reward_freeze_backbone, seed=seed)

    def checkpoint_extras(self) -> dict[str, Any]:
        """The reward model, its optimizer and the phase flag (fsdp, a sharded reward model: the
        flag; its shards, head and optimizer state go through torch.distributed.checkpoint)."""
        if getattr(self, "sharded_reward_model", None) is not None:
            return {"reward_phase": self.reward_phase}
        return {"reward_model": self.reward_model, "reward_optimizer": self.reward_optimizer, "reward_phase": self.reward_phase}

    def save_model(self, output_dir: str) -> None:
        """Agents as :meth:`MAGRPOTrainer.save_model`; the reward model's state dict to
        ``reward_model/reward_model.pt``."""
        import os

        super().save_model(output_dir)
        target = os.path.join(output_dir, "reward_model")
        os.makedirs(target, exist_ok=True)
        state = self.reward_model.state_dict()
        if getattr(self, "sharded_reward_model", None) is not None:  # fsdp: every rank gathers, rank 0 writes
            from llm_marl.runs.fsdp import full_state_dict

            state = full_state_dict(self.reward_model)
        if self.dist.is_main or not self.sharded:
            torch.save(state, os.path.join(target, "reward_model.pt"))

    # --- phase 1: preference pairs -> reward model ---------------------------------------------

    def preference_pairs(self, round_: int = 0) -> list[tuple[str, str]]:
        """(winner text, loser text) of every train item, from ``preference_num_candidates``
        answers per agent scored with the env's reward (as MADPO chooses its pairs); ``round_``
        keys the random streams (the iterative learner's round)."""
        args = self.args
        saved = args.num_generations
        args.num_generations = self._collection_candidates()
        try:
            texts: list[tuple[str, str]] = []
            n = _num_items(self.env)
            for start in range(0, n, args.items_per_step):
                indices = list(range(start, min(start + args.items_per_step, n)))
                roots = collect_trees(self.env, self.policies, indices, args, seed=derive_seed(args.seed, "preference_data", *([round_] if round_ else [])))
                for node in iter_nodes(roots):
                    rng = random.Random(derive_seed(args.seed, "preference_pairs", *([round_] if round_ else []), node.index))
                    for w, l in self._item_pairs(node, rng):
                        texts.append((self._joint_text(node, w), self._joint_text(node, l)))
        finally:
            args.num_generations = saved
        return texts

    def _collection_candidates(self) -> int:
        return self.args.preference_num_candidates

    def _item_pairs(self, node: RolloutNode, rng: random.Random) -> list[tuple[int, int]]:
        """(winner, loser) joint-action indices of one item's candidates."""
        args = self.args
        return select_pairs(node.rewards, args.pair_selection, args.preference_pairs_per_sample, rng)

    def _joint_text(self, node: RolloutNode, j: int) -> str:
        """Joint answer ``j`` of ``node`` as the reward model reads it: a :class:`JointText` with
        the layout of :func:`joint_answer_text` whose prompts are each agent's prompt as its
        actor reads it (chat template and system prompt included: the same token ids where the
        reward model shares the agent's tokenizer) and whose answers are the generated tokens."""
        acting = node.agents  # an agent that does not act at this node (turn-based envs) answers ""
        completions = [node.completions[a][node.joint[j][acting.index(a)]] if a in acting else Completion("") for a in self.agent_ids]
        if not getattr(self.reward_model, "is_language_model", False):
            return joint_answer_text(node.observations, self.agent_ids, [c.text for c in completions])
        pieces: list[tuple[str, str, Any]] = []
        for k, agent in enumerate(self.agent_ids):
            text, ids = self._agent_prompt(agent, node.observations[agent])
            pieces += [("frame", ("\n\n" if k else "") + f"[Agent {k}] ", None), ("prompt", text, ids)]
        pieces.append(("frame", "\n\n[Joint Action]\n\n", None))
        for k, (agent, completion) in enumerate(zip(self.agent_ids, completions)):
            same = self._shares_tokenizer(agent) and completion.token_ids is not None
            pieces += [("frame", ("\n\n" if k else "") + f"[Agent {k} action]\n", None), ("answer", completion.text, completion.token_ids if same else None)]
        return JointText(pieces)

    def _shares_tokenizer(self, agent: str) -> bool:
        """Whether the reward model reads ``agent``'s token ids (one tokenizer, or one vocabulary)."""
        mine, theirs = getattr(self.reward_model, "tokenizer", None), getattr(self.policies[agent], "tokenizer", None)
        if mine is None or theirs is None:
            return False
        if mine is theirs:
            return True
        name = getattr(mine, "name_or_path", None)
        return bool(name) and name == getattr(theirs, "name_or_path", None) and len(mine) == len(theirs)

    def _agent_prompt(self, agent: str, observation: Any) -> tuple[str, list[int] | None]:
        """``agent``'s prompt as its actor reads it: the rendered text and (when the reward model
        shares its tokenizer) its token ids; else the observation's text."""
        policy = self.policies[agent]
        if callable(getattr(policy, "render_prompt", None)) and callable(getattr(policy, "encode_prompts", None)):
            text = policy.render_prompt(observation)
            return text, (policy.encode_prompts([observation])[0] if self._shares_tokenizer(agent) else None)
        return str(observation), None

    def reward_model_loss(self, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, float]:
        """Mean Bradley–Terry loss of ``pairs`` (differentiable) and the pairs' accuracy."""
        scores = self.reward_model.scores([w for w, _ in pairs] + [l for _, l in pairs])
        chosen, rejected = scores[: len(pairs)], scores[len(pairs) :]
        accuracy = pm.pair_accuracy(chosen.detach().tolist(), rejected.detach().tolist())
        return pm.bradley_terry_losses(chosen, rejected).mean(), accuracy

    def fit_reward_model(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, float]]:
        """``reward_num_train_epochs`` shuffled passes of the Bradley–Terry fit; per-epoch metrics.
        Logged once per fit at the index of the batch being trained (the x-axis of ``train/``):
        ``reward_model/loss`` and ``reward_model/accuracy`` of the last epoch,
        ``reward_model/first_epoch_loss`` and ``reward_model/pairs``."""
        args, history = self.args, []
        self.reward_model.train()
        for epoch in range(args.reward_num_train_epochs):
            order = list(range(len(pairs)))
            random.Random(derive_seed(args.seed, "reward_model_epoch", epoch)).shuffle(order)
            losses, accuracies = [], []
            for start in range(0, len(order), args.reward_train_batch_size):
                batch = [pairs[i] for i in order[start : start + args.reward_train_batch_size]]
                self.reward_optimizer.zero_grad(set_to_none=True)
                with fitting_sharded(self):  # fsdp: every rank fits on all pairs alike
                    loss, accuracy = self.reward_model_loss(batch)
                    if not torch.isfinite(loss):
                        self.reward_optimizer.zero_grad(set_to_none=True)
                        raise FloatingPointError(f"reward model: Bradley-Terry loss is {loss.item()} at epoch {epoch}, pairs {start}..{start + len(batch) - 1}")
                    loss.backward()
                self.reward_optimizer.step()
                weights_changed(optimizer_parameters(self.reward_optimizer))
                losses.append(loss.item())
                accuracies.append(accuracy)
            history.append({"reward_model/loss": float(np.mean(losses)), "reward_model/accuracy": float(np.mean(accuracies))})
        self.reward_optimizer.zero_grad(set_to_none=True)
        regather(self)  # fsdp: the stepped weights, for the rest of the sampling window
        self.reward_model.eval()
        if history:  # one point per fit, on the run's x-axis (the batch being trained): steps never go back
            self.logger.log({**history[-1], "reward_model/first_epoch_loss": history[0]["reward_model/loss"],
                             "reward_model/pairs": float(len(pairs))}, self.state.batch_step)
        return history

    def _learn_reward_model(self) -> None:
        pairs = self.preference_pairs()
        if self.sharded:  # fsdp: every rank fits the one reward model on rank 0's pairs
            from llm_marl.runs.fsdp import shared_value

            pairs = shared_value(pairs)
        if not pairs:
            raise ValueError(
                f"MARLHF: the {_num_items(self.env)} train items gave no preference pair (every candidate "
                "joint answer of every item earned the same reward); raise preference_num_candidates or check the reward"
            )
        self.reward_pairs = pairs
        self.fit_reward_model(pairs)
        self.reward_phase.done, self.reward_phase.pairs = True, len(pairs)

    # --- phase 2: RL against the reward model ---------------------------------------------------

    def _collect(self, indices: list[int]) -> tuple[list[RolloutNode], list[Sample], float]:
        if not self.reward_phase.done:
            self._learn_reward_model()
        return super()._collect(indices)

    def reward_model_scores(self, nodes: Sequence[RolloutNode]) -> list[list[float]]:
        """The reward model's score of every joint action of ``nodes`` (one batched call)."""
        texts = [self._joint_text(node, j) for node in nodes for j in range(len(node.joint))]
        with torch.no_grad():
            flat = self.reward_model.scores(texts).float().cpu().tolist() if texts else []
        out, offset = [], 0
        for node in nodes:
            out.append(flat[offset : offset + len(node.joint)])
            offset += len(node.joint)
        for node, scores in zip(nodes, out):
            bad = [s for s in scores if not math.isfinite(s)]
            if bad:
                raise FloatingPointError(f"reward model: score {bad[0]} for item {node.index}, turn {node.turn}")
        return out

    def _samples(self, roots: list[RolloutNode]) -> list[Sample]:
        """The RL learner's samples with every joint action's reward (and return: one turn)
        replaced by the reward model's score; the trees keep the env's rewards."""
        nodes = list(iter_nodes(roots))
        scores = self.reward_model_scores(nodes)
        kept = [(node.rewards, node.returns, node.agent_rewards) for node in nodes]
        try:
            for node, values in zip(nodes, scores):
                node.rewards, node.returns, node.agent_rewards = list(values), list(values), None
            samples = super()._samples(roots)
        finally:
            for node, (rewards, returns, agent_rewards) in zip(nodes, kept):
                node.rewards, node.returns, node.agent_rewards = rewards, returns, agent_rewards
        flat = [s for values in scores for s in values]
        if flat:
            self._note("train/reward_model/score_mean", float(np.mean(flat)))
        return samples


_FORMS: dict[tuple[type, str], type] = {}


def actor_critic_form(trainer_class: type, algorithm: str) -> type:
    """``trainer_class`` whose RL phase is IAC ("iac") or MAAC ("maac"): a subclass of it and of
    :class:`~llm_marl.learners.actor_critic.trainer.IACTrainer` / ``MAACTrainer``, with a config class
    that is both its config and IACConfig / MAACConfig (built from the given config's values)."""
    key = (trainer_class, algorithm)
    if key in _FORMS:
        return _FORMS[key]
    from llm_marl.learners.actor_critic.trainer import IACTrainer, MAACTrainer

    learner = IACTrainer if algorithm == "iac" else MAACTrainer
    short = learner.__name__[: -len("Trainer")]
    # One shared reward: phase 1 ranks joint answers by it and every critic learns the model's one score.
    name = f"{trainer_class.config_class.__name__.removesuffix('Config')}{short}Config"
    config = dataclasses.dataclass(type(name, (trainer_class.config_class, learner.config_class), {"per_agent_rewards": False}))

    def __init__(self: Any, env: Any = None, policies: Any = None, args: Any = None, eval_env: Any = None, **kwargs: Any) -> None:
        if args is not None and not isinstance(args, config):
            names = {f.name for f in dataclasses.fields(config)}
            args = config(**{k: v for k, v in dataclasses.asdict(args).items() if k in names})
        # by keyword, leaving out what is not given: CoMLRL's keywords (a centralized team's among them) are read from them
        given = {k: v for k, v in (("env", env), ("policies", policies), ("eval_env", eval_env)) if v is not None}
        trainer_class.__init__(self, args=args, **given, **kwargs)

    def checkpoint_extras(self: Any) -> dict[str, Any]:
        return {**learner.checkpoint_extras(self), **trainer_class.checkpoint_extras(self)}

    def save_model(self: Any, output_dir: str) -> None:
        learner.save_model(self, output_dir)
        trainer_class.save_model(self, output_dir)

    form = type(f"{trainer_class.__name__}{short}", (trainer_class, learner), {
        "config_class": config, "actor_critic": True, "__init__": __init__, "checkpoint_extras": checkpoint_extras,
        "save_model": save_model, "__doc__": f"{trainer_class.__name__} with {short} as its RL phase.",
    })
    form.__module__ = trainer_class.__module__
    _FORMS[key] = form
    return form


def select_pairs(rewards: Sequence[float], mode: str, limit: int | None, rng: random.Random) -> list[tuple[int, int]]:
    """:func:`~llm_marl.learners.preference.math.select_pairs` (looked up here, so a test's
    control can replace it)."""
    return pm.select_pairs(rewards, mode, limit, rng)
