"""Scorers are batch-invariant (issue 34; docs/DESIGN contract): a log-prob, value or reward
computed for one item does not depend on what else is in its batch.

One property over random batch compositions (hypothesis): an item scored among random
neighbours — in any order, in chunks of any ``max_batch_size`` and under any
``max_batch_tokens`` — scores what it scores alone. It covers the policy's scoring, its frozen
reference, every critic kind (a separate and a shared CausalLMCritic, V and Q; MAAC's central
critic on joint text; a LoRA team's AdapterCritic) and MARLHF's reward model, on the tiny GPT-2
(absolute positions, a left-padding tokenizer) and a tiny Llama (rotary positions, a
right-padding tokenizer). Models are built once per module; a few examples keep it to seconds.

On the main before issue 34 the reward model failed it (its scores moved with its neighbours:
left padding without position ids on the absolute-position GPT-2).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch.set_num_threads(1)

from llm_marl.learners.preference.reward_model import JointRewardModel, JointText  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.critic import joint_observation  # noqa: E402
from llm_marl.policies.lm_critic import CausalLMCritic  # noqa: E402
from llm_marl.policies.reference import frozen_references  # noqa: E402
from llm_marl.policies.tiny import load_tiny  # noqa: E402
from tiny_chat_model import chat_tokenizer, tiny_llama  # noqa: E402

WORDS = "the sea is wide and the ship is small write one sentence about weather today agents cooperate".split()
POOL = 7
TOLERANCE = 2e-4


def _pool(tokenizer, seed):
    """POOL (observation, completion) items of varied lengths; answers are random token ids
    ending in eos (as sampled answers do)."""
    rng = random.Random(seed)
    eos = int(tokenizer.eos_token_id)
    items = []
    for i in range(POOL):
        observation = " ".join(rng.choice(WORDS) for _ in range(1 + 3 * i % 11))
        ids = tuple(rng.randrange(5, len(tokenizer) - 5) for _ in range(rng.randrange(0, 7))) + (eos,)
        items.append((observation, Completion(tokenizer.decode(list(ids[:-1])), token_ids=ids)))
    return items


class Scorers:
    """Every scorer of one model, and what each gives an item of the pool alone."""

    def __init__(self, model, tokenizer, team=None):
        self.items = _pool(tokenizer, seed=len(tokenizer))
        policy = CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=4)
        other = CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=4)
        self.policy = policy
        reference = frozen_references({"a": policy}, ["a"])["a"]
        separate = CausalLMCritic.for_policy(policy, shared=False, seed=0)
        shared = CausalLMCritic.for_policy(policy, shared=True, seed=1)
        central = CausalLMCritic.for_policy(policy, shared=False, num_outputs=2, seed=2, actor_prompts=False)
        reward_model = JointRewardModel(copy.deepcopy(model), tokenizer=tokenizer, seed=3)
        self.scorers = {
            "policy": ("lp", policy),
            "reference": ("lp", reference),
            "critic V (separate)": ("v", separate),
            "critic Q (separate)": ("q", separate),
            "critic V (shared)": ("v", shared),
            "critic Q (shared)": ("q", shared),
            "central critic (MAAC)": ("joint", central),
            "reward model": ("reward", reward_model),
        }
        if team is not None:
            from llm_marl.policies.adapter_critic import AdapterCritic

            member = team.policies["left"]
            self.scorers["team policy"] = ("lp", member)
            self.scorers["adapter critic Q"] = ("q", AdapterCritic.for_agent(member, shared=False, seed=4))
        self.other = other
        self.alone = {name: [self.score(name, [i]) [0] for i in range(POOL)] for name in self.scorers}

    def _joint(self, i):
        observation, completion = self.items[i]
        partner, answer = self.items[(i + 3) % POOL]
        return {"left": observation, "right": partner}, [completion.text, answer.text]

    def score(self, name, rows, max_batch_size=None, max_batch_tokens=None):
        kind, scorer = self.scorers[name]
        observations = [self.items[i][0] for i in rows]
        completions = [self.items[i][1] for i in rows]
        with torch.no_grad():
            if kind == "lp":
                scorer.max_batch_size, scorer.max_batch_tokens = max_batch_size, max_batch_tokens
                try:
                    return scorer.log_probs(observations, completions).tolist()
                finally:
                    scorer.max_batch_size = scorer.max_batch_tokens = None
            if kind in ("v", "q", "joint"):
                scorer.max_batch_size = max_batch_size
                try:
                    if kind == "joint":
                        texts = [joint_observation(self._joint(i)[0], ["left", "right"], self._joint(i)[1]) for i in rows]
                        return [row for row in scorer.values(texts).tolist()]
                    return scorer.values(observations, completions if kind == "q" else None)[:, 0].tolist()
                finally:
                    scorer.max_batch_size = None
            texts = []
            for i in rows:
                observations_, answers = self._joint(i)
                pieces = [("frame", "[Agent 0] ", None), ("prompt", observations_["left"], None), ("frame", "\n\n[Agent 1] ", None),
                          ("prompt", observations_["right"], None), ("frame", "\n\n[Joint Action]\n\n", None)]
                pieces += [("answer", answers[0], self.items[i][1].token_ids), ("frame", "\n\n", None), ("answer", answers[1], None)]
                texts.append(JointText(pieces))
            return scorer.scores(texts).tolist()


@pytest.fixture(scope="module")
def gpt2():
    model, tokenizer = load_tiny()
    assert tokenizer.padding_side == "left"
    return Scorers(model, tokenizer)


@pytest.fixture(scope="module")
def llama():
    from llm_marl.policies.lora_team import LoRATeam

    tokenizer = chat_tokenizer()
    assert tokenizer.padding_side == "right"
    team = LoRATeam.from_model(tiny_llama(tokenizer, seed=1), tokenizer, ["left", "right"], r=2, target_modules=["q_proj", "v_proj"], max_new_tokens=4)
    return Scorers(tiny_llama(tokenizer), tokenizer, team=team)


batches = st.fixed_dictionaries({
    "target": st.integers(0, POOL - 1),
    "neighbours": st.lists(st.integers(0, POOL - 1), min_size=1, max_size=6),
    "position": st.integers(0, 6),
    "max_batch_size": st.sampled_from([None, 1, 2, 3]),
    "max_batch_tokens": st.sampled_from([None, 12, 40, 400]),
})


def check(scorers, draw):
    rows = list(draw["neighbours"])
    where = min(draw["position"], len(rows))
    rows.insert(where, draw["target"])
    for name in scorers.scorers:
        got = scorers.score(name, rows, draw["max_batch_size"], draw["max_batch_tokens"])[where]
        want = scorers.alone[name][draw["target"]]
        assert got == pytest.approx(want, abs=TOLERANCE), (name, rows, draw)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(draw=batches)
def test_every_scorer_on_the_tiny_gpt2_ignores_its_batch_neighbours(gpt2, draw):
    check(gpt2, draw)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(draw=batches)
def test_every_scorer_on_a_tiny_llama_ignores_its_batch_neighbours(llama, draw):
    check(llama, draw)


def test_the_pool_really_differs(gpt2, llama):
    """The property is not vacuous: items score differently, and batches pad."""
    for scorers in (gpt2, llama):
        for name, values in scorers.alone.items():
            flat = [tuple(v) if isinstance(v, list) else v for v in values]
            assert len({round(v, 3) if isinstance(v, float) else tuple(round(x, 3) for x in v) for v in flat}) > 2, name
