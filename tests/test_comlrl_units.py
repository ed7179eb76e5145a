"""CoMLRL's units on the CoMLRL path (issue 22.4): ``rollout_buffer_size`` and ``train_batch_size``
count answers (per agent) in CoMLRL 1.4.3's actor-critic trainers, groups of G answers in the
env-native actor-critic learners here. A script written for CoMLRL takes its optimizer steps at
the answer counts its author set.

CoMLRL's schedule (SPEC-actor-critic §4.1), derived by hand: items one by one, each appending
G × turns answers per agent; after the WHOLE item, an agent holding >= rollout_buffer_size answers
is drained: one update per turn (ascending), each cut into mini-batches of train_batch_size
answers, one optimizer step per mini-batch; at the epoch's end whatever is left is drained too.

- buffer 4, G = 2, 5 items, 1 turn (train_batch_size None = 4): buffers 2, 4 → drain [4] after
  item 2; 2, 4 → [4] after item 4; 2 left → [2] at the end: steps after 4, 8, 10 answers, of
  4, 4, 2 answers. (The previous main counted groups: one step after 8 answers of 8, one of 2.)
- buffer 3, G = 2, train_batch_size 3 (SPEC's "drains of 4, then 2"): after item 2, 4 answers:
  [3, 1]; after item 4: [3, 1]; end: [2].
- buffer 3, G = 1, 2 turns, 3 items, train_batch_size None = 3: after item 2 (2 answers per
  turn): turn 0 [2], turn 1 [2]; end (1 per turn): [1], [1].

All three schedules were also observed by running CoMLRL 1.4.3's IACTrainer on the same tiny
model, recording its ``_ac_step`` calls (not part of the suite: it needs the comlrl package).
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.learners import IACConfig as NativeIACConfig  # noqa: E402
from llm_marl.learners import IACTrainer as NativeIACTrainer  # noqa: E402
from llm_marl.policies.tiny import build_tiny_model  # noqa: E402

ROWS = [{"prompt": f"item {i}"} for i in range(5)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


def schedule(trainer_class, config_class, model_path, rows=ROWS, **settings):
    """(answers per agent collected so far, answers in agent_0's mini-batch) at every optimizer step."""
    calls = []

    def reward_func(first, second):
        calls.append(1)  # once per joint answer: one answer per agent
        return [float(len(first[0]) % 3)]

    def transition(prompt, agent_completions, num_agents, **_):
        return [f"{prompt} again" for _ in agent_completions]

    args = config_class(num_train_epochs=1, max_new_tokens=2, temperature=1.0, top_p=1.0, eval_interval=0,
                        progress_bar=False, agent_learning_rate=1e-4, critic_learning_rate=1e-4, seed=0, **settings)
    trainer = trainer_class(agent_model=model_path, reward_func=reward_func, train_dataset=rows, args=args,
                            external_transition=transition if args.num_turns > 1 else None)
    steps = []
    original = trainer._joint_optimizer_step

    def record(step):
        steps.append((len(calls), sum(len(s.completions) for s in step["agent_0"])))
        return original(step)

    trainer._joint_optimizer_step = record
    trainer.train()
    assert trainer.state.global_step == len(steps)
    return steps


@pytest.mark.parametrize("trainer_class, config_class", [(IACTrainer, IACConfig), (MAACTrainer, MAACConfig)])
def test_buffer_4_of_2_generations_steps_at_comlrls_answer_counts(model_path, trainer_class, config_class):
    steps = schedule(trainer_class, config_class, model_path, rollout_buffer_size=4, num_generations=2, num_turns=1)
    assert steps == [(4, 4), (8, 4), (10, 2)]


def test_a_drain_can_exceed_the_buffer_and_is_cut_into_answer_minibatches(model_path):
    steps = schedule(IACTrainer, IACConfig, model_path, rollout_buffer_size=3, train_batch_size=3, num_generations=2, num_turns=1)
    assert steps == [(4, 3), (4, 1), (8, 3), (8, 1), (10, 2)]


def test_several_turns_update_one_turn_after_another(model_path):
    steps = schedule(IACTrainer, IACConfig, model_path, rows=ROWS[:3], rollout_buffer_size=3, num_generations=1,
                     num_turns=2, early_termination_threshold=None)
    # answers counted per agent: 2 turns per item, one reward call each
    assert steps == [(4, 2), (4, 2), (6, 1), (6, 1)]


def test_the_anchor_keywords_count_answers_and_env_native_groups_unless_told(model_path):
    # llm_marl's own IACConfig through the anchor keywords: CoMLRL's unit too
    assert schedule(NativeIACTrainer, NativeIACConfig, model_path, rollout_buffer_size=4, num_generations=2, num_turns=1) == [(4, 4), (8, 4), (10, 2)]
    # told to count groups: one step after 4 groups (8 answers), then the rest
    steps = schedule(NativeIACTrainer, NativeIACConfig, model_path, rollout_buffer_size=4, num_generations=2, num_turns=1, sample_unit="group")
    assert steps == [(8, 8), (10, 2)]


def test_sample_unit_is_validated():
    with pytest.raises(ValueError, match="sample_unit must be None, 'group' or 'answer'"):
        NativeIACConfig(sample_unit="answers")
