"""The Hugging Face-compatible constructor of the anchor library (docs/algorithms.md §7, ANCHORS.md).

``MAGRPOTrainer(agent_model=..., reward_func=..., formatters=..., external_transition=...,
train_dataset=..., eval_dataset=..., args=MAGRPOConfig(...))`` — and ``agents=[...]`` with or
without ``tokenizer=`` — trains tiny local GPT-2s saved with ``save_pretrained``, honouring
CoMLRL's call conventions; ``save_model`` writes models loadable by ``from_pretrained``; and
every misuse is a clear error.
"""

from __future__ import annotations

import os

import datasets
import pytest
import torch

torch.set_num_threads(1)

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_marl import (  # noqa: E402
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MARLOOConfig,
    MARLOOTrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
)
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.tiny import build_tiny_model  # noqa: E402
from llm_marl.tasks.base import TaskError  # noqa: E402

TRAIN = [
    {"prompt": "The assert statement", "topic": "assert"},
    {"prompt": "A module can contain executable statements", "topic": "modules"},
    {"prompt": "The import statement", "topic": "import"},
]
EVAL = [
    {"prompt": "Exceptions are raised", "topic": "exceptions"},
    {"prompt": "A class definition", "topic": "classes"},
]
TRAINERS = [
    (MAGRPOTrainer, MAGRPOConfig, "mean"),
    (MAREINFORCETrainer, MAREINFORCEConfig, "raw"),
    (MARLOOTrainer, MARLOOConfig, "rloo"),
    (MAReMaxTrainer, MAReMaxConfig, "max"),
]


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path, monkeypatch):
    """Runs without output_dir get a default run directory under the current one: keep it in tmp."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def model_a(tmp_path_factory):
    """A tiny GPT-2 saved with save_pretrained (1,000-token BPE, seed 0)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "a", pretrain_steps=20, batch_size=8))


@pytest.fixture(scope="module")
def model_b(tmp_path_factory):
    """A different tiny GPT-2 with a different tokenizer (600-token BPE, seed 1)."""
    return str(
        build_tiny_model(tmp_path_factory.mktemp("tiny") / "b", vocab_size=600, seed=1, pretrain_steps=20, batch_size=8)
    )


def config(config_class=MAGRPOConfig, **overrides):
    settings = dict(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        num_generations=2,
        max_new_tokens=6,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        rollout_buffer_size=2,
        agent_learning_rate=1e-3,
        eval_interval=0,
        eval_num_samples=2,
        eval_batch_size=2,
        logging_steps=1,
        progress_bar=False,
        early_termination_threshold=None,
    )
    settings.update(overrides)
    return config_class(**settings)


class Recorder:
    """reward_func / formatter / transition / eval hooks that record how they are called."""

    def __init__(self):
        self.reward_calls: list[tuple[tuple, dict]] = []
        self.processed: list[tuple[float, float]] = []
        self.transition_calls: list[dict] = []
        self.formatter_calls: list[tuple] = []
        self.eval_logger_calls: list[dict] = []
        self.eval_aggregator_calls: list[tuple] = []

    # reward_func with batch_items in its signature
    def reward_with_items(self, answers_0, answers_1, batch_items=None):
        self.reward_calls.append(((answers_0, answers_1), {"batch_items": batch_items}))
        return [len(answers_0[0].split()) + 0.5 * len(answers_1[0].split())]

    # reward_func without it: batch_items must not be passed
    def reward_plain(self, *answers):
        self.reward_calls.append((answers, {}))
        return [float(sum(len(a[0]) for a in answers))]

    def processor(self, value):
        out = value / 10.0 - 100.0
        self.processed.append((value, out))
        return out

    def formatter_keyword(self, item, external_prompts=None):
        self.formatter_calls.append((0, dict(item), external_prompts))
        return item["prompt"] if external_prompts is None else f"{external_prompts} Then"

    def formatter_plain(self, item):
        self.formatter_calls.append((1, dict(item)))
        return item["prompt"]

    def transition(self, **kwargs):
        self.transition_calls.append(kwargs)
        return [f"Your partner wrote {len(kwargs['agent_completions'][1 - i])} characters." for i in range(2)]

    def eval_logger(self, **kwargs):
        self.eval_logger_calls.append(kwargs)
        completions = kwargs["agent_completions_turns"]
        return [
            {"words": float(sum(len(completions[a][i][0].split()) for a in range(len(completions))))}
            for i in range(len(kwargs["batch_items"]))
        ]

    def eval_aggregator(self, metrics, num_turns=1):
        self.eval_aggregator_calls.append((metrics, num_turns))
        return {"turn_1/words_mean": sum(m["words"] for m in metrics) / len(metrics), "num_items": len(metrics)}


def assert_saved_models_load(trainer, tmp_path):
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    assert sorted(os.listdir(out)) == [f"agent_{i}" for i in range(len(trainer.agents))]
    for i, agent in enumerate(trainer.agents):
        policy = trainer.policies[agent]
        model = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        tokenizer = AutoTokenizer.from_pretrained(out / f"agent_{i}")
        mine = policy.model.state_dict()
        loaded = model.state_dict()
        assert set(loaded) == set(mine)
        assert all(torch.equal(loaded[k], mine[k]) for k in mine), f"{agent}: weights differ after save/load"
        assert len(tokenizer) == len(policy.tokenizer)
        text = "The assert statement is used"
        assert tokenizer(text)["input_ids"] == policy.tokenizer(text)["input_ids"]


def weights(trainer):
    return {a: {n: p.detach().clone() for n, p in trainer.policies[a].named_parameters()} for a in trainer.agents}


def changed(before, trainer):
    return {
        a: any(not torch.equal(before[a][n], p) for n, p in trainer.policies[a].named_parameters())
        for a in trainer.agents
    }


# --- the drop-in constructor trains (single turn, all four trainers) -------------------------


@pytest.mark.parametrize("trainer_class, config_class, mode", TRAINERS, ids=[t[0].__name__ for t in TRAINERS])
def test_agent_model_path_single_turn(trainer_class, config_class, mode, model_a, tmp_path):
    rec = Recorder()
    args = config(config_class, items_per_step=len(TRAIN), generation_batch_size=4)
    trainer = trainer_class(
        agent_model=model_a,
        reward_func=rec.reward_with_items,
        reward_processor=rec.processor,
        formatters=rec.formatter_plain,
        train_dataset=datasets.Dataset.from_list(TRAIN),
        eval_dataset=datasets.Dataset.from_list(EVAL),
        eval_logger=rec.eval_logger,
        eval_aggregator=rec.eval_aggregator,
        args=args,
    )
    assert trainer.args.advantage_mode == mode
    assert trainer.agents == ["agent_0", "agent_1"]
    assert all(isinstance(p, CausalLMPolicy) for p in trainer.policies.values())
    models = [trainer.policies[a].model for a in trainer.agents]
    assert models[0] is not models[1]  # homogeneous agents never share weights
    assert trainer.policies["agent_0"].max_new_tokens == 6 and trainer.policies["agent_0"].top_k is None
    assert trainer.policies["agent_0"].max_batch_size == args.generation_batch_size == 4
    before = weights(trainer)

    trainer.train()
    assert trainer.state.epoch == 1 and trainer.state.global_step >= 1
    assert all(changed(before, trainer).values())

    # reward_func: once per joint action (K aligned joint actions per item), positionally, one
    # single-element list of str per agent, and batch_items=[the original item]
    assert len(rec.reward_calls) == len(TRAIN) * args.num_generations
    for answers, kwargs in rec.reward_calls:
        assert len(answers) == 2
        assert all(isinstance(a, list) and len(a) == 1 and isinstance(a[0], str) for a in answers)
        assert kwargs["batch_items"] is not None and len(kwargs["batch_items"]) == 1
        assert dict(kwargs["batch_items"][0]) in TRAIN
    assert [dict(kw["batch_items"][0]) for _, kw in rec.reward_calls[:: args.num_generations]] == TRAIN
    # the one shared value is the reward, then reward_processor; the trainer saw the processed values
    raw = [len(a0[0].split()) + 0.5 * len(a1[0].split()) for (a0, a1), _ in rec.reward_calls]
    assert [value for value, _ in rec.processed] == pytest.approx(raw)
    logged = dict(trainer.logger.history)[0]
    processed = [out for _, out in rec.processed]
    assert logged["train/turn_1/reward_mean"] == pytest.approx(sum(processed) / len(processed))
    assert logged["train/turn_1/reward_mean"] < -90  # the processed value, not the raw one
    # formatter(item) at turn 0 for both agents
    assert all(len(call) == 2 for call in rec.formatter_calls)

    metrics = trainer.evaluate()
    assert {"eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_1/words_mean", "eval/num_items"} <= set(metrics)
    assert metrics["eval/num_items"] == len(EVAL)
    [call] = rec.eval_logger_calls
    assert set(call) == {"agent_completions_turns", "batch_items", "prompts"}
    assert [dict(item) for item in call["batch_items"]] == EVAL
    assert call["prompts"] == [item["prompt"] for item in EVAL]
    assert len(call["agent_completions_turns"]) == 2  # [agent][item][turn]
    assert all(len(per_item) == len(EVAL) and all(len(turns) == 1 for turns in per_item) for per_item in call["agent_completions_turns"])
    assert rec.eval_aggregator_calls[0][1] == 1  # num_turns

    assert_saved_models_load(trainer, tmp_path)


def test_multi_turn_transition_and_formatter_conventions(model_a, tmp_path):
    rec = Recorder()
    args = config(num_turns=2, rollout_buffer_size=3)
    trainer = MAGRPOTrainer(
        agent_model=model_a,
        reward_func=rec.reward_plain,
        formatters=[rec.formatter_keyword, rec.formatter_plain],
        external_transition=rec.transition,
        train_dataset=TRAIN[:2],
        eval_dataset=EVAL,
        args=args,
    )
    before = weights(trainer)
    trainer.train()
    assert all(changed(before, trainer).values())
    k = args.num_generations
    # aligned tree without early termination: K joint actions at the root, K per child
    assert len(rec.reward_calls) == 2 * (k + k * k)
    assert all(kwargs == {} for _, kwargs in rec.reward_calls)  # no batch_items: not in the signature
    assert len(rec.transition_calls) == 2 * k  # once per root joint action, never after the last turn
    originals = [item["prompt"] for item in TRAIN[:2]]
    for call in rec.transition_calls:
        assert set(call) == {
            "prompt",
            "agent_completions",
            "num_agents",
            "prompt_history_per_agent",
            "response_history_per_agent",
        }
        assert call["prompt"] in originals and call["num_agents"] == 2
        assert len(call["agent_completions"]) == 2 and all(isinstance(c, str) for c in call["agent_completions"])
        assert call["prompt_history_per_agent"] == [[call["prompt"]], [call["prompt"]]]
        assert call["response_history_per_agent"] == [[c] for c in call["agent_completions"]]
    # later turns: item["prompt"] is the transition's text; external_prompts= where accepted
    later = [c for c in rec.formatter_calls if c[1]["prompt"] not in originals]
    assert len(later) == 2 * 2 * k  # two agents per child node
    for call in later:
        assert call[1]["prompt"].startswith("Your partner wrote")
        assert call[1]["topic"] in {item["topic"] for item in TRAIN}  # other fields kept
        if call[0] == 0:
            assert call[2] == call[1]["prompt"]
        else:
            assert len(call) == 2
    metrics = trainer.evaluate()
    assert {"eval/turn_1/reward_mean", "eval/turn_2/reward_mean", "eval/turn_1/expected_return"} <= set(metrics)
    assert metrics["eval/turn_1/expected_return"] == pytest.approx(
        metrics["eval/turn_1/reward_mean"] + metrics["eval/turn_2/reward_mean"]
    )
    assert_saved_models_load(trainer, tmp_path)


def test_external_prompt_passthrough_uses_the_transition_text(model_a):
    rec = Recorder()
    seen: list[str] = []
    trainer = MAGRPOTrainer(
        agent_model=model_a,
        reward_func=rec.reward_plain,
        formatters=rec.formatter_keyword,
        external_transition=rec.transition,
        train_dataset=TRAIN[:1],
        args=config(num_turns=2, external_prompt_passthrough=True, rollout_buffer_size=3),
    )
    sample = trainer.policies["agent_0"].sample

    def recording_sample(observations, n):
        seen.extend(observations)
        return sample(observations, n)

    trainer.policies["agent_0"].sample = recording_sample
    trainer.train()
    later = [o for o in seen if o != TRAIN[0]["prompt"]]
    assert later and all(o.startswith("Your partner wrote") and o.endswith("characters.") for o in later)
    assert all(len(call) == 3 and call[2] is None for call in rec.formatter_calls)  # turn 0 only


# --- agents=[...]: paths, loaded models, heterogeneous models and tokenizers ------------------


def _variant(name, model_a, model_b):
    if name == "paths+shared tokenizer":
        return dict(agents=[model_a, model_a], tokenizer=AutoTokenizer.from_pretrained(model_a)), (1000, 1000)
    if name == "loaded models+tokenizer":
        models = [AutoModelForCausalLM.from_pretrained(model_a) for _ in range(2)]
        return dict(agents=models, tokenizer=AutoTokenizer.from_pretrained(model_a)), (1000, 1000)
    if name == "agent_model loaded+tokenizer":
        return (
            dict(agent_model=AutoModelForCausalLM.from_pretrained(model_a), tokenizer=AutoTokenizer.from_pretrained(model_a)),
            (1000, 1000),
        )
    if name == "heterogeneous paths":
        return dict(agents=[model_a, model_b]), (1000, 600)
    if name == "heterogeneous loaded+tokenizers":
        models = [AutoModelForCausalLM.from_pretrained(p) for p in (model_a, model_b)]
        tokenizers = [AutoTokenizer.from_pretrained(p) for p in (model_a, model_b)]
        return dict(agents=models, tokenizer=tokenizers), (1000, 600)
    raise AssertionError(name)


VARIANTS = [
    "paths+shared tokenizer",
    "loaded models+tokenizer",
    "agent_model loaded+tokenizer",
    "heterogeneous paths",
    "heterogeneous loaded+tokenizers",
]


# multi-turn is covered by the heterogeneous variants and the agent_model test
@pytest.mark.parametrize(
    "num_turns, variant",
    [(n, v) for n in (1, 2) for v in VARIANTS if n == 1 or v.startswith("heterogeneous")],
)
def test_agents_variants_train(variant, num_turns, model_a, model_b, tmp_path):
    rec = Recorder()
    kwargs, vocab_sizes = _variant(variant, model_a, model_b)
    trainer = MAGRPOTrainer(
        **kwargs,
        reward_func=rec.reward_with_items,
        formatters=rec.formatter_keyword,
        external_transition=rec.transition if num_turns > 1 else None,
        train_dataset=TRAIN[:2],
        eval_dataset=EVAL,
        args=config(num_turns=num_turns),
    )
    policies = [trainer.policies[a] for a in trainer.agents]
    assert tuple(len(p.tokenizer) for p in policies) == vocab_sizes
    assert policies[0].model is not policies[1].model
    assert policies[0].tokenizer is not policies[1].tokenizer
    if variant.startswith("heterogeneous"):
        assert policies[0].model.config.vocab_size != policies[1].model.config.vocab_size
    before = weights(trainer)
    trainer.train()
    assert trainer.state.epoch == 1
    assert all(changed(before, trainer).values())
    assert len(rec.reward_calls) >= 2 * 2
    metrics = trainer.evaluate()
    assert f"eval/turn_{num_turns}/reward_mean" in metrics
    assert_saved_models_load(trainer, tmp_path)


def test_args_default_and_model_config(model_a):
    rec = Recorder()
    trainer = MAGRPOTrainer(
        agents=[model_a, model_a, model_a],
        reward_func=lambda a, b, c: [1.0],
        formatters=rec.formatter_plain,
        external_transition=lambda **kwargs: ["next"] * 3,  # the default config has num_turns=2
        train_dataset=TRAIN,
        model_config={"dtype": torch.float64, "special_tokens": {"additional_special_tokens": ["<|sep|>"]}},
    )
    assert isinstance(trainer.args, MAGRPOConfig) and trainer.args.num_agents == 3
    for policy in trainer.policies.values():
        assert "<|sep|>" in policy.tokenizer.all_special_tokens
        sep = policy.tokenizer.convert_tokens_to_ids("<|sep|>")
        assert sep == 1000 and policy.tokenizer("x<|sep|>y")["input_ids"][1] == sep  # one token
        assert policy.model.get_input_embeddings().weight.shape[0] == len(policy.tokenizer) == 1001
        assert policy.model.dtype == torch.float64  # model_config's dtype reached from_pretrained


# --- errors ------------------------------------------------------------------------------------


def build(model_a, **overrides):
    kwargs = dict(
        agent_model=model_a,
        reward_func=lambda a, b: [1.0],
        formatters=lambda item: item["prompt"],
        train_dataset=TRAIN[:2],
        args=config(),
    )
    kwargs.update(overrides)
    return MAGRPOTrainer(**{k: v for k, v in kwargs.items() if v is not None})


@pytest.mark.parametrize(
    "result, pattern",
    [
        ("0.5", "reward_func must return a non-empty list of floats"),
        ([], "reward_func must return a non-empty list of floats"),
        (None, "reward_func must return a non-empty list of floats"),
        ({"reward": 1.0}, "reward_func must return a non-empty list of floats"),
        (["high"], r"reward_func must return a list of floats; its element \[0\] is str 'high'"),
        ([float("nan")], "reward is nan"),
    ],
)
def test_reward_func_returning_the_wrong_type(model_a, result, pattern):
    trainer = build(model_a, reward_func=lambda a, b: result)
    with pytest.raises(TaskError, match=r"task FunctionTask, item 0, turn 0[:,] .*" + pattern):
        trainer.train()


def test_reward_func_that_raises(model_a):
    def reward_func(a, b):
        raise ZeroDivisionError("boom in my reward")

    trainer = build(model_a, reward_func=reward_func)
    with pytest.raises(TaskError, match="task FunctionTask, item 0, turn 0: reward raised ZeroDivisionError: boom in my reward") as info:
        trainer.train()
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("texts", [["only one"], ["a", "b", "c"], "a string"])
def test_transition_returning_the_wrong_number_of_prompts(model_a, texts):
    trainer = build(model_a, external_transition=lambda **kw: texts, args=config(num_turns=2))
    with pytest.raises(TaskError, match=r"task FunctionTask, item 0, turn 0: transition raised TypeError: external_transition must return a list of 2 strings"):
        trainer.train()


def test_transition_that_raises(model_a):
    def transition(**kwargs):
        raise KeyError("missing field")

    trainer = build(model_a, external_transition=transition, args=config(num_turns=2))
    with pytest.raises(TaskError, match="item 0, turn 0: transition raised KeyError"):
        trainer.train()


def test_multi_turn_without_transition(model_a):
    with pytest.raises(ValueError, match="num_turns=2 needs an external_transition"):
        build(model_a, args=config(num_turns=2))


def test_agent_model_and_agents_both_or_neither(model_a, tmp_path):
    both = build(model_a, agents=[model_a, model_a])  # agents naming agent_model once per agent: accepted, as CoMLRL
    assert both.policies["agent_0"].model is not both.policies["agent_1"].model
    with pytest.raises(ValueError, match="agent_model and agents conflict"):
        build(model_a, agents=[model_a, str(tmp_path)])
    with pytest.raises(ValueError, match="Either agent_model or agents must be provided"):
        build(model_a, agent_model=None)
    with pytest.raises(ValueError, match="Either agent_model or agents"):
        MAGRPOTrainer()


def test_loaded_model_without_tokenizer(model_a):
    model = AutoModelForCausalLM.from_pretrained(model_a)
    with pytest.raises(ValueError, match="agent 0 is a loaded model: pass tokenizer="):
        build(model_a, agent_model=model)
    with pytest.raises(ValueError, match="agent 1 is a loaded model: pass tokenizer="):
        build(model_a, agent_model=None, agents=[model_a, model])
    with pytest.raises(ValueError, match="tokenizer: got 3 tokenizers for 2 agents"):
        build(model_a, agent_model=model, tokenizer=[AutoTokenizer.from_pretrained(model_a)] * 3)
    with pytest.raises(TypeError, match="agent 0: expected a model id/path or a causal LM, got int"):
        build(model_a, agent_model=None, agents=[7, 8], tokenizer=AutoTokenizer.from_pretrained(model_a))


def test_num_agents_mismatch(model_a):
    with pytest.raises(ValueError, match="args.num_agents is 2 but 3 agents were given"):
        build(model_a, agent_model=None, agents=[model_a] * 3)
    with pytest.raises(ValueError, match="args.num_agents is 3 but 2 agents were given"):
        build(model_a, agent_model=None, agents=[model_a] * 2, args=config(num_agents=3))
    with pytest.raises(ValueError, match="args.num_agents is 2 but 3 agents were given"):
        build(model_a, num_agents=3)  # agent_model= with num_agents= disagreeing with args
    # agent_model= alone takes its count from args.num_agents
    trainer = build(model_a, reward_func=lambda a, b, c: [1.0], args=config(num_agents=3))
    assert trainer.agents == ["agent_0", "agent_1", "agent_2"]


def test_missing_required_keywords(model_a):
    with pytest.raises(ValueError, match="reward_func is required"):
        build(model_a, reward_func=None)
    without_data = build(model_a, train_dataset=None)  # built, as CoMLRL builds it
    with pytest.raises(ValueError, match="train_dataset is required"):
        without_data.train()
    with pytest.raises(TypeError, match="not both"):
        MAGRPOTrainer(env=object(), agent_model=model_a, reward_func=lambda a, b: [1.0], train_dataset=TRAIN)
    with pytest.raises(TypeError, match="unexpected keyword argument 'reward_fn'"):
        build(model_a, reward_fn=lambda a, b: [1.0])
