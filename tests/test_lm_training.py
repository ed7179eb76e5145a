"""Training real (tiny) language models with the MAREINFORCE family (docs/algorithms.md §4, §6).

* The loss of one node equals -mean_k(A_k · Σ_t log p(token_t)) computed by hand, one plain
  forward pass per answer, for answers of different lengths (eos included, padding excluded).
* One optimizer step changes every parameter of every agent (TRL-style: large learning rate).
* A model against itself has KL exactly 0; the frozen reference never changes while the policy
  trains.
* On the writing task, training the default tiny models raises the mean eval reward, by more
  than the same run with reward-blind advantages (a control) does.
"""

from __future__ import annotations

import copy

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.advantages import k3_kl, policy_gradient_loss  # noqa: E402
from llm_marl.learners.buffer import Sample  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer  # noqa: E402
from llm_marl.policies.base import Completion, token_log_probs_of  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.tiny import build_tiny_model  # noqa: E402
from llm_marl.tasks.function_task import FunctionTask  # noqa: E402
from controls import reward_blind  # noqa: E402
from writing_run import default_run, default_run_options, mean_eval_reward  # noqa: E402

PROMPTS = [
    "The assert statement",
    "If the module being imported is not a top level module,",
    "A",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=30, batch_size=8)


def policy_of(model_dir, **settings):
    settings.setdefault("max_new_tokens", 8)
    settings.setdefault("temperature", 1.0)
    settings.setdefault("top_p", None)
    settings.setdefault("top_k", None)
    return CausalLMPolicy.from_pretrained(model_dir, **settings)


def length_reward(a, b):
    """A reward with variance across samples: the characters of both answers."""
    return [float(len(a[0]) + len(b[0]))]


def prompt_formatter(item):
    return item["prompt"]


def trainer_on(model_dir, items=1, *, policies=None, **config):
    task = FunctionTask(
        length_reward,
        prompt_formatter,
        dataset=[{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(items)],
        num_agents=2,
        num_turns=1,
    )
    settings = dict(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        num_generations=4,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        rollout_buffer_size=1,
        eval_interval=0,
        logging_steps=1,
        progress_bar=False,
        early_termination_threshold=None,
        agent_learning_rate=1e-2,
    )
    settings.update(config)
    args = MAGRPOConfig(**settings)
    if policies is None:
        policies = [
            policy_of(model_dir, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
            for _ in range(2)
        ]
    return MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)


def snapshot(policy):
    return {name: p.detach().clone() for name, p in policy.named_parameters()}


# --- the loss (docs/algorithms.md §4) --------------------------------------------------------------------


def hand_answer_log_prob(model, prompt_ids, answer_ids, temperature):
    """Σ_t log p(answer_t | prompt, answer_<t): ONE sequence, no padding, default positions,
    log_softmax of the logits at each answer position divided by the score temperature."""
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    positions = range(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(answer_ids))
    total = 0.0
    for position, token in zip(positions, answer_ids):
        total += torch.log_softmax(logits[position] / temperature, dim=-1)[token].item()
    return total


def controlled_samples(policy):
    """Two nodes, K=3 answers each, of different lengths: with eos, cut without eos, eos only."""
    eos = policy.eos_token_ids[0]

    def encode(text):
        return tuple(policy.tokenizer(text, add_special_tokens=False)["input_ids"])

    answers = [
        [
            Completion("", encode(" is used to check a condition") + (eos,)),
            Completion("", encode(" a")),  # cut by max_new_tokens: no eos
            Completion("", (eos,)),  # an empty answer: only the eos is scored
        ],
        [
            Completion("", encode(" then the") + (eos,)),
            Completion("", encode(" the name of the package is searched for in the list of the")),
            Completion("", encode(" it") + (eos,)),
        ],
    ]
    advantages = [[1.25, -0.5, -0.75], [-1.0, 0.3, 0.7]]
    return [
        Sample("agent_0", prompt, group, [0.0] * 3, adv, index=i, turn=0)
        for i, (prompt, group, adv) in enumerate(zip(PROMPTS[:2], answers, advantages))
    ]


@pytest.mark.parametrize("score_temperature", ["sampling", 1.0])
def test_loss_equals_hand_computation_for_answers_of_different_lengths(model_dir, score_temperature):
    trainer = trainer_on(model_dir, rollout_buffer_size=2, temperature=0.7)
    policy = trainer.policies["agent_0"]
    policy.score_temperature = score_temperature
    temperature = 0.7 if score_temperature == "sampling" else 1.0  # see CausalLMPolicy's doc
    assert policy.effective_score_temperature == temperature
    samples = controlled_samples(policy)
    lengths = [len(c.token_ids) for s in samples for c in s.completions]
    assert len(set(lengths)) >= 4  # batched scoring pads: padding must not count

    # by hand: one plain forward pass per answer, no padding
    per_sample = []
    for s in samples:
        prompt = policy.tokenizer(s.observation)["input_ids"]
        logps = [hand_answer_log_prob(policy.model, prompt, list(c.token_ids), temperature) for c in s.completions]
        per_sample.append(-sum(a * lp for a, lp in zip(s.advantages, logps)) / len(logps))
    hand_node_losses = per_sample
    hand_loss = sum(per_sample) / len(per_sample)

    # the trainer's own building blocks, one node at a time and as a mini-batch
    for s, expected in zip(samples, hand_node_losses):
        node = policy_gradient_loss(
            policy.log_probs([s.observation] * 3, s.completions)[None], torch.tensor([s.advantages])
        )
        assert node.item() == pytest.approx(expected, abs=1e-5)

    # the trainer's update: one optimizer step on a controlled buffer, loss read from the log
    before = snapshot(policy)
    for s in samples:
        trainer.buffers["agent_0"].append(s)
    trainer._update()
    trainer._flush_metrics(force=True)
    assert trainer.state.global_step == 1
    logged = trainer.logger.history[-1][1]
    assert logged["train/agent_0/loss"] == pytest.approx(hand_loss, abs=1e-5)
    assert "train/agent_1/loss" not in logged  # agent_1's buffer was empty: no step
    after = snapshot(policy)
    assert all(not torch.equal(before[n], after[n]) for n in before)


def test_per_token_mean_reduction_divides_by_answer_length(model_dir):
    trainer = trainer_on(model_dir, rollout_buffer_size=2, logprob_reduction="mean")
    policy = trainer.policies["agent_0"]
    samples = controlled_samples(policy)
    expected = []
    for s in samples:
        prompt = policy.tokenizer(s.observation)["input_ids"]
        terms = [
            a * hand_answer_log_prob(policy.model, prompt, list(c.token_ids), 1.0) / len(c.token_ids)
            for a, c in zip(s.advantages, s.completions)
        ]
        expected.append(-sum(terms) / len(terms))
    for s in samples:
        trainer.buffers["agent_0"].append(s)
    trainer._update()
    trainer._flush_metrics(force=True)
    assert trainer.logger.history[-1][1]["train/agent_0/loss"] == pytest.approx(sum(expected) / 2, abs=1e-5)


# --- one step changes everything; KL and the frozen reference (docs/algorithms.md §6) ------------------


def test_one_training_step_changes_every_parameter_of_every_agent(model_dir):
    trainer = trainer_on(model_dir, items=1)
    before = {agent: snapshot(policy) for agent, policy in trainer.policies.items()}
    trainer.train()
    assert trainer.state.global_step == 1
    history = dict(trainer.logger.history)[0]
    for agent, policy in trainer.policies.items():
        assert history[f"train/{agent}/advantage_std"] > 0  # the reward had a signal to follow
        trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
        assert len(trainable) == len(before[agent])
        unchanged = [name for name, p in policy.named_parameters() if torch.equal(before[agent][name], p)]
        assert unchanged == [], f"{agent}: parameters not updated: {unchanged}"


def test_kl_of_a_model_against_itself_is_exactly_zero(model_dir):
    policy = policy_of(model_dir, max_new_tokens=10)
    twin = copy.deepcopy(policy)
    torch.manual_seed(0)
    completions = [c for group in policy.sample(PROMPTS, 3) for c in group]
    observations = [p for p in PROMPTS for _ in range(3)]
    with torch.no_grad():
        mine, mask = token_log_probs_of(policy, observations, completions)
        theirs, _ = token_log_probs_of(twin, observations, completions)
    kl = k3_kl(mine, theirs, mask)
    assert kl.shape == (len(completions),)
    assert torch.equal(kl, torch.zeros_like(kl))

    trainer = trainer_on(model_dir, reference_kl_enabled=True)
    penalty = trainer._kl_penalty("agent_0", observations, completions)
    assert penalty == [0.0] * len(completions)
    # a different model gives a positive KL
    with torch.no_grad():
        for p in trainer.policies["agent_0"].parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert all(value > 0 for value in trainer._kl_penalty("agent_0", observations, completions))


def test_frozen_reference_does_not_change_while_the_policy_trains(model_dir):
    trainer = trainer_on(
        model_dir, items=3, reference_kl_enabled=True, reference_kl_coef=0.1, reference_devices=["cpu", "cpu"]
    )
    assert trainer.args.reference_devices == ["cpu", "cpu"]
    references = trainer.reference_policies
    assert set(references) == {"agent_0", "agent_1"}
    ref_before = {agent: snapshot(ref) for agent, ref in references.items()}
    pol_before = {agent: snapshot(policy) for agent, policy in trainer.policies.items()}
    for agent, ref in references.items():
        assert ref is not trainer.policies[agent] and ref.model is not trainer.policies[agent].model
        assert all(not p.requires_grad for p in ref.parameters())
        assert ref.device == torch.device("cpu")
        optimized = {id(p) for group in trainer.optimizers[agent].param_groups for p in group["params"]}
        assert not optimized & {id(p) for p in ref.parameters()}
    trainer.train()
    assert trainer.state.global_step == 3
    history = dict(trainer.logger.history)
    for agent in trainer.agents:
        for name, p in references[agent].named_parameters():
            assert torch.equal(ref_before[agent][name], p), f"reference of {agent} changed: {name}"
        assert all(not torch.equal(pol_before[agent][n], p) for n, p in trainer.policies[agent].named_parameters())
        # batch 0 is scored before any update: policy == reference, KL exactly 0; later batches: > 0
        assert history[0][f"train/{agent}/kl_mean"] == 0.0
        assert history[1][f"train/{agent}/kl_mean"] > 0.0
        assert history[2][f"train/{agent}/kl_mean"] > 0.0


# --- learning on the writing task -------------------------------------------------------------

# Measured (torch 2.13 CPU, one thread, 2 shared cores): the default tiny model and the settings of
# llm_marl.cli.DEFAULT_RUN (agent_learning_rate 3e-4) on 48 train items: 6 batches of 8 items, 6
# optimizer steps per agent, 20-45 s of training. Eval: mean over 4 sampling seeds of the mean
# reward of the 32 eval items. Untrained: 0.115. Trained, training seeds 0-8: 0.197 0.220 0.235
# 0.212 0.233 0.196 0.237 0.244 0.260, i.e. +0.081 to +0.145 (mean +0.111); 96 items instead of
# 48 gain no more (+0.124, +0.080, +0.104 for seeds 0, 3, 7). With agent_learning_rate 1e-3 (the
# default run's value before this measurement) the same measurement gave +0.067, +0.028, -0.097
# (seeds 0, 3, 7): one Adam step at 1e-3 moves the tiny model so far that the reference KL reaches
# 5-25 nats per answer, the KL penalty (coef 0.05) outweighs the [0, 1] reward and favours short
# answers, and some seeds collapse to punctuation. The margin is half the smallest gain measured.
LEARNING_MARGIN = 0.04


# The control (issue 19): the same run with reward-blind advantages, same seeds (tests/controls.py).
# Measured for training seed 0 (before 0.1089): real advantages 0.1953 (+0.086); every advantage 1
# ("constant": maximum likelihood on the model's own samples) 0.1500 (+0.041); each group's
# advantages shuffled 0.0866 (-0.022). Sharpening the model on its own samples alone thus gains
# about the old bar; the real run must beat the constant control by CONTROL_MARGIN (measured
# +0.045, the margin about half of it).
CONTROL_MARGIN = 0.02


def test_training_raises_the_writing_reward():
    """The default run on fewer items: the default cached tiny model (built on first use), MAGRPO,
    WritingCollab-v0, reference KL; the mean eval reward rises by more than the margin, and by
    more than a reward-blind control run's rise (constant advantages) plus CONTROL_MARGIN."""
    from llm_marl.cli import build_trainer

    before, after, seconds = default_run(0)  # tests/writing_run.py: trained once a session (test_lora_learning.py uses it too)
    control = build_trainer(default_run_options(0))  # the same untrained model and seeds: its "before" is `before`
    with reward_blind("constant"):
        control.train()
    assert control.state.global_step == 6
    control_after = mean_eval_reward(control)
    print(
        f"writing reward before {before:.4f} after {after:.4f} ({seconds:.1f} s of training); "
        f"reward-blind control after {control_after:.4f}"
    )
    assert after > before + LEARNING_MARGIN, f"mean eval reward before {before:.4f}, after {after:.4f}"
    assert after - before > control_after - before + CONTROL_MARGIN, (
        f"gain {after - before:.4f} vs reward-blind control's {control_after - before:.4f}"
    )
