"""Turn-based turns (CooperativeTask.acting_agents): only the acting agents answer, the trees
branch on them alone, and an agent that does not act at a turn gets no sample, log-prob or
gradient there — for the REINFORCE, actor-critic and preference learners.

The task: a two-turn signalling game. At turn 0 only the speaker acts: it sees a card (red or
blue) and says "x" or "y". At turn 1 only the listener acts: it sees the signal and guesses the
card; the shared reward is 1 for a right guess (0 at turn 0). The optimum (a signalling
convention) earns 1; a listener that ignores the signal earns 0.5.
"""

from __future__ import annotations

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.tree import grow_trees  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.base import CooperativeTask, TaskError  # noqa: E402


class Signal(CooperativeTask):
    agents = ("speaker", "listener")
    num_turns = 2

    def __init__(self, turns: int = 2):
        self.num_turns = turns

    def dataset(self, split):
        return datasets.Dataset.from_list([{"card": "red"}, {"card": "blue"}])

    def acting_agents(self, item, history):
        return ("speaker",) if len(history) == 0 else ("listener",)

    def initial_observations(self, item):
        return {"speaker": f"card {item['card']}", "listener": "wait"}

    def reward(self, item, actions, history):
        if len(history) == 0:
            assert set(actions) == {"speaker"}, actions
            if self.num_turns == 1:  # the one-turn variant: the speaker is paid for "x" on red, "y" on blue
                return float(actions["speaker"] == {"red": "x", "blue": "y"}[item["card"]])
            return 0.0
        assert set(actions) == {"listener"}, actions
        return float(actions["listener"] == item["card"])

    def transition(self, item, actions, history):
        return {"speaker": "wait", "listener": f"signal {actions['speaker']}"}


class Spy(TabularPolicy):
    """A TabularPolicy that records the observations it is asked to answer and to score."""

    def __init__(self, actions):
        super().__init__(actions)
        self.sampled: list = []
        self.scored: list = []

    def sample(self, observations, num_samples, generators=None):
        self.sampled += list(observations)
        return super().sample(observations, num_samples, generators)

    def log_probs(self, observations, completions, reduction="sum"):
        self.scored += list(observations)
        return super().log_probs(observations, completions, reduction)


def spies():
    return {"speaker": Spy(["x", "y"]), "listener": Spy(["red", "blue"])}


# --- the env ----------------------------------------------------------------------------------


def test_env_infos_say_who_acts_and_only_acting_agents_must_answer():
    env = DialogueEnv(Signal())
    obs, infos = env.reset(options={"index": 0})
    assert obs == {"speaker": "card red", "listener": "wait"}
    assert env.acting_agents == ["speaker"] and all(info["acting_agents"] == ["speaker"] for info in infos.values())
    with pytest.raises(ValueError, match=r"no action for acting agent\(s\) \['speaker'\]"):
        env.step({"listener": "red"})
    # the listener's answer is not required, and ignored where given
    obs, rewards, terms, truncs, infos = env.step({"speaker": "x", "listener": "ignored"})
    assert rewards == {"speaker": 0.0, "listener": 0.0} and obs["listener"] == "signal x"
    assert dict(env.history[0].actions) == {"speaker": "x"}
    assert env.acting_agents == ["listener"] and infos["speaker"]["acting_agents"] == ["listener"]
    obs, rewards, terms, truncs, infos = env.step({"listener": "red"})
    assert rewards == {"speaker": 1.0, "listener": 1.0} and all(terms.values())
    assert env.acting_agents == [] and infos["listener"]["acting_agents"] == []


def test_a_bad_acting_agents_raises_a_task_error_naming_the_turn():
    class Bad(Signal):
        def acting_agents(self, item, history):
            return ("nobody",)

    with pytest.raises(TaskError, match=r"item 0, turn 0: acting_agents must return a non-empty sequence of agents"):
        DialogueEnv(Bad()).reset(options={"index": 0})


# --- trees ------------------------------------------------------------------------------------


def test_trees_branch_on_the_acting_agents_only():
    policies = spies()
    [root] = grow_trees(DialogueEnv(Signal()), policies, [1], num_samples=3, num_turns=2, seed=0)
    assert root.agents == ["speaker"] and root.joint == [(0,), (1,), (2,)]
    assert [len(c.completions["listener"]) for c in root.children] == [3, 3, 3]
    assert all(child.agents == ["listener"] for child in root.children)
    # each agent was asked only where it acts: the speaker once (the root), the listener 3 times
    assert policies["speaker"].sampled == ["card blue"]
    assert sorted(policies["listener"].sampled) == sorted(f"signal {c.text}" for c in root.completions["speaker"])
    # the speaker's per-answer returns are its branch's mean listener reward (aligned, K=3)
    for k, child in enumerate(root.children):
        assert root.agent_returns("speaker")[k] == pytest.approx(sum(child.rewards) / 3)


# --- no sample, no log-prob, no gradient where an agent does not act ---------------------------

LEARNERS = {
    "magrpo": (MAGRPOTrainer, MAGRPOConfig, {}),
    "iac": (IACTrainer, IACConfig, {"critic_learning_rate": 0.1, "value_clip_range": None}),
    "madpo": (MADPOTrainer, MADPOConfig, {"preference_num_candidates": 2}),
}


@pytest.mark.parametrize("learner", sorted(LEARNERS))
def test_a_non_acting_agent_gets_no_sample_log_prob_or_gradient(learner):
    trainer_class, config_class, extra = LEARNERS[learner]
    turns = 1 if learner == "madpo" else 2  # the preference learners grow one-turn trees
    policies = spies()
    args = config_class(num_turns=turns, num_generations=2, num_train_epochs=2, agent_learning_rate=0.1,
                        rollout_buffer_size=1, eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None, **extra)
    trainer = trainer_class(env=DialogueEnv(Signal(turns)), policies=policies, args=args)
    trainer.train()
    assert trainer.state.global_step > 0
    speaker, listener = policies["speaker"], policies["listener"]
    # the speaker answered and was scored on its cards only; the listener never on "wait"
    assert set(speaker.sampled) <= {"card red", "card blue"} and set(speaker.scored) <= {"card red", "card blue"}
    assert "wait" not in listener.sampled + listener.scored
    assert speaker.scored  # the acting agent did learn
    if turns == 2:
        assert set(listener.sampled) <= {"signal x", "signal y"} and listener.scored
    else:
        assert listener.sampled == [] and listener.scored == []
        assert listener.logits.grad is None or not listener.logits.grad.any()
    assert "wait" not in listener.rows and "wait" not in speaker.rows  # no row: never a log-prob, never a gradient
    moved = speaker.logits.detach()[[speaker.rows[k] for k in speaker.rows]].abs().sum()
    assert moved > 0


def signal_trainer(turns, rollout_buffer_size):
    """MAGRPO on Signal, one item per batch, stopped after its first optimizer step."""
    policies = spies()
    args = MAGRPOConfig(num_turns=turns, num_generations=2, num_train_epochs=1, items_per_step=1, rollout_buffer_size=rollout_buffer_size,
                        max_steps=1, agent_learning_rate=0.1, eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None)
    return MAGRPOTrainer(env=DialogueEnv(Signal(turns)), policies=policies, args=args), policies


def test_an_agent_that_never_acts_does_not_hold_up_the_others_updates():
    """One-turn Signal: only the speaker acts, so the listener's buffer stays empty. The speaker's
    is full after the first item and updates then, not at the epoch's end (as it did while an
    update waited for every agent's buffer)."""
    trainer, policies = signal_trainer(turns=1, rollout_buffer_size=1)
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.state.batch_step == 1
    assert policies["speaker"].sampled == ["card red"] and policies["speaker"].scored == ["card red"] * 2  # item 2 not yet played


def test_a_full_buffer_updates_while_a_partly_filled_one_waits_for_the_epochs_end():
    """Two-turn Signal, K = 2: an item gives the speaker 1 sample (the root) and the listener 2 (its
    children). With rollout_buffer_size 2 the listener's buffer is full after the first item and is
    consumed alone; the speaker's one sample stays (docs/algorithms.md §4)."""
    trainer, policies = signal_trainer(turns=2, rollout_buffer_size=2)
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.state.batch_step == 1
    assert len(trainer.buffers["speaker"]) == 1 and len(trainer.buffers["listener"]) == 0
    assert policies["speaker"].scored == [] and len(policies["listener"].scored) == 4  # 2 samples of K = 2 answers
    assert set(policies["listener"].scored) <= {"signal x", "signal y"}


def test_iac_targets_bootstrap_through_the_partners_turn():
    """Hand-checked: the speaker acts at turn 0 (reward 0), the listener at turn 1. The speaker's
    critic value at turn 1 (where it does not act) is never used: its TD target for answer g is
    0 + γ · (mean of the listener's rewards on branch g); the listener's is its reward."""
    from llm_marl.learners.tree import collect_trees

    policies = spies()
    args = IACConfig(num_turns=2, num_generations=4, num_train_epochs=1, rollout_buffer_size=1, eval_interval=0,
                     progress_bar=False, seed=0, early_termination_threshold=None, discount=0.5, value_clip_range=None)
    trainer = IACTrainer(env=DialogueEnv(Signal()), policies=policies, args=args)
    roots = collect_trees(trainer.env, policies, [0, 1], args, seed=3)
    samples = trainer._samples(roots)
    speaker = [s for s in samples if s.agent == "speaker"]
    listener = [s for s in samples if s.agent == "listener"]
    assert len(speaker) == 2 and len(listener) == 8  # one per node where each acts
    for root, sample in zip(roots, speaker):
        expected = [0.5 * sum(child.rewards) / 4 for child in root.children]
        assert sample.targets == pytest.approx(expected)
        assert sample.returns == pytest.approx([sum(child.rewards) / 4 for child in root.children])  # logged: undiscounted
    assert any(t > 0 for s in speaker for t in s.targets)
    for sample in listener:
        assert sample.targets == pytest.approx(sample.rewards)


def test_magrpo_learns_the_signalling_convention_and_beats_a_reward_blind_control():
    from controls import reward_blind

    def final_value(blind, seed):
        policies = {"speaker": TabularPolicy(["x", "y"]), "listener": TabularPolicy(["red", "blue"])}
        args = MAGRPOConfig(num_turns=2, num_generations=4, num_train_epochs=30, agent_learning_rate=0.3,
                            rollout_buffer_size=2, eval_interval=0, progress_bar=False, seed=seed, early_termination_threshold=None)
        trainer = MAGRPOTrainer(env=DialogueEnv(Signal()), policies=policies, args=args)
        if blind:
            with reward_blind("shuffle", seed):
                trainer.train()
        else:
            trainer.train()
        value = 0.0  # the exact expected reward of the final policies
        for card in ("red", "blue"):
            p_say = policies["speaker"].probabilities(f"card {card}").tolist()
            for s, signal in enumerate(("x", "y")):
                p_guess = policies["listener"].probabilities(f"signal {signal}").tolist()
                value += 0.5 * p_say[s] * p_guess[("red", "blue").index(card)]
        return value

    trained = [final_value(False, seed) for seed in range(3)]
    control = [final_value(True, seed) for seed in range(3)]
    print("trained", trained, "control", control)
    assert sum(v > 0.95 for v in trained) >= 2
    assert sum(trained) / 3 > sum(control) / 3 + 0.2


# --- PettingZoo AEC envs through AECWrapper ------------------------------------------------------


def agree_env():
    """A cooperative AEC env: two players alternate for four moves, each 0 or 1; everyone earns 1
    at the end if all four moves agree. Observation: the moves so far (-1 not played yet)."""
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import AECEnv
    from pettingzoo.utils.agent_selector import AgentSelector

    class Agree(AECEnv):
        metadata = {"name": "agree_v0", "render_modes": [], "is_parallelizable": False}

        def __init__(self):
            self.possible_agents = ["p0", "p1"]
            self.render_mode = None

        def observation_space(self, agent):
            return spaces.Box(-1, 1, shape=(4,), dtype=np.int64)

        def action_space(self, agent):
            return spaces.Discrete(2)

        def observe(self, agent):
            return np.array(self.moves + [-1] * (4 - len(self.moves)), dtype=np.int64)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            self.moves = []
            self.rewards = {a: 0.0 for a in self.agents}
            self._cumulative_rewards = {a: 0.0 for a in self.agents}
            self.terminations = {a: False for a in self.agents}
            self.truncations = {a: False for a in self.agents}
            self.infos = {a: {} for a in self.agents}
            self._selector = AgentSelector(self.agents)
            self.agent_selection = self._selector.reset()

        def step(self, action):
            if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
                self._was_dead_step(action)
                return
            self._cumulative_rewards[self.agent_selection] = 0
            self.moves.append(int(action))
            done = len(self.moves) == 4
            value = float(done and len(set(self.moves)) == 1)
            self.rewards = {a: value for a in self.agents}
            if done:
                self.terminations = {a: True for a in self.agents}
            self.agent_selection = self._selector.next()
            self._accumulate_rewards()

    return Agree()


def test_aec_wrapper_passes_pettingzoo_parallel_api_test():
    from pettingzoo.test import parallel_api_test

    from llm_marl.envs.turn_based import AECWrapper

    parallel_api_test(AECWrapper(agree_env()), num_cycles=20)


def test_aec_wrapper_steps_the_selected_agent_and_trees_branch_on_it():
    from llm_marl.envs.turn_based import AECWrapper

    env = AECWrapper(agree_env())
    obs, infos = env.reset(seed=0)
    assert env.acting_agents == ["p0"] and infos["p1"]["acting_agents"] == ["p0"]
    with pytest.raises(ValueError, match="no action for the acting agent 'p0'"):
        env.step({"p1": 1})
    for t, mover in enumerate(["p0", "p1", "p0", "p1"]):
        assert env.acting_agents == [mover]
        obs, rewards, terms, truncs, infos = env.step({mover: 1, "p0" if mover == "p1" else "p1": 0})  # the other is ignored
        assert obs["p0"].tolist()[: t + 1] == [1] * (t + 1)
    assert rewards == {"p0": 1.0, "p1": 1.0} and all(terms.values()) and env.agents == []
    policies = {"p0": TabularPolicy(["0", "1"]), "p1": TabularPolicy(["0", "1"])}
    [root] = grow_trees(env, policies, [0], num_samples=2, num_turns=4, seed=0, joint_mode="aligned")
    level = [root]
    for t in range(4):
        assert all(node.agents == [("p0", "p1")[t % 2]] for node in level)
        level = [c for node in level for c in node.children if c is not None]
    assert level == []
