"""Collapsed groups (issue 44): the stall metrics (``train/<agent>/zero_advantage_groups``,
``train/<agent>/entropy``) and the options against collapse — dynamic sampling, the entropy
bonus and its annealing, optimistic credit in turn-based trees, per-agent learning rates and
plain SGD (two timescales) — each against numbers computed by hand."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.advantages import aggregate_children, group_advantages  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.buffer import Sample  # noqa: E402
from llm_marl.learners.stalls import entropy_coefficient, note_stalls  # noqa: E402
from llm_marl.learners.tree import _compute_returns  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.rollouts import RolloutNode  # noqa: E402
from toy_tasks import MENU, ColourMatch  # noqa: E402
from resumed import uninterrupted_and_resumed  # noqa: E402


def trainer(**overrides):
    settings = dict(num_turns=1, num_train_epochs=1, num_generations=2, rollout_buffer_size=2, items_per_step=2,
                    eval_interval=0, progress_bar=False, seed=3, agent_learning_rate=0.3, early_termination_threshold=None)
    settings.update(overrides)
    return MAGRPOTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=settings["num_turns"])),
                         policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=MAGRPOConfig(**settings))


def group(agent, returns, index=0):
    answers = [Completion(MENU[k % 3], action=k % 3) for k in range(len(returns))]
    return Sample(agent, f"item {index}", answers, list(returns), group_advantages(returns), index, 0)


# --- the stall metrics ------------------------------------------------------------------------


def test_zero_advantage_share_is_exact_on_hand_built_groups():
    t = trainer()
    # left: 3 groups, one of them with equal returns (advantages exactly 0); right: 2 of 2 collapsed
    samples = [group("left", [1.0, 2.0]), group("right", [2.0, 2.0]), group("left", [3.0, 3.0]),
               group("right", [0.0, 0.0]), group("left", [0.0, 1.0])]
    assert samples[2].advantages == [0.0, 0.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        note_stalls(t, samples)
    assert t._pending["train/left/zero_advantage_groups"] == [pytest.approx(1 / 3, abs=0)]
    assert t._pending["train/right/zero_advantage_groups"] == [1.0]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "'right'" in messages[0] and "100% of its 2 groups" in messages[0]
    note_stalls(t, samples)  # warned once per agent only
    assert t._pending["train/right/zero_advantage_groups"] == [1.0, 1.0]


def test_entropy_of_a_tabular_policy_is_the_rows_entropy_and_the_bonus_enters_the_loss():
    t = trainer(entropy_coef=0.5)
    policy = t.policies["left"]
    observation = "item 0: left, name a colour"
    policy.add_observations([observation])
    with torch.no_grad():
        policy.logits[policy.rows[observation]] = torch.tensor([0.0, math.log(3.0), math.log(4.0)])  # p = 1/8, 3/8, 4/8
    p = [1 / 8, 3 / 8, 4 / 8]
    entropy = -sum(q * math.log(q) for q in p)
    sample = Sample("left", observation, [Completion("red", action=0), Completion("green", action=1)], [0.0, 1.0], [-1.0, 1.0], 0, 0)
    loss, _ = t._loss_sum("left", [sample])
    # policy gradient part: mean_k(-A_k log p_k) = (1 * log 1/8 - 1 * log 3/8) / 2; bonus: 0.5 * H
    by_hand = (math.log(1 / 8) - math.log(3 / 8)) / 2 - 0.5 * entropy
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    assert t._pending["train/left/entropy"] == [pytest.approx(entropy, rel=1e-6)]
    t.args.entropy_coef = 0.0
    loss, _ = t._loss_sum("left", [sample])
    assert loss.item() == pytest.approx((math.log(1 / 8) - math.log(3 / 8)) / 2, rel=1e-6)


@pytest.mark.parametrize("learner", ["MAGRPO", "MAREINFORCE", "IAC"])
def test_every_learner_logs_the_stall_metrics(tmp_path, learner):
    import llm_marl.learners as learners

    config = getattr(learners, f"{learner}Config")(
        num_turns=1, num_train_epochs=1, num_generations=2, rollout_buffer_size=2, items_per_step=2, eval_interval=0,
        progress_bar=False, seed=3, logging_steps=1, output_dir=str(tmp_path), early_termination_threshold=None)
    t = getattr(learners, f"{learner}Trainer")(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)),
                                                policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.train()
    with open(tmp_path / "metrics.jsonl") as f:
        names = {name for line in f for name in json.loads(line)}
    for agent in ("left", "right"):
        assert f"train/{agent}/zero_advantage_groups" in names
        assert f"train/{agent}/entropy" in names


# --- dynamic sampling -------------------------------------------------------------------------


def fed_groups(t):
    """Run ``t`` and return every group an optimizer step was given."""
    fed = []
    step = t._joint_optimizer_step

    def spy(batches):
        fed.extend(s for batch in batches.values() for s in batch)
        return step(batches)

    t._joint_optimizer_step = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.train()
    return fed


def test_dynamic_sampling_feeds_no_zero_advantage_group_while_its_budget_lasts():
    plain = fed_groups(trainer(num_train_epochs=3))
    assert any(all(a == 0 for a in s.advantages) for s in plain)  # the control: collapsed groups do reach updates
    t = trainer(num_train_epochs=3, dynamic_sampling=True, dynamic_sampling_budget=50)
    fed = fed_groups(t)
    assert len(fed) == len(plain)  # as many groups per update as without it
    assert not any(all(a == 0 for a in s.advantages) for s in fed)


def test_dynamic_sampling_budget_zero_changes_nothing():
    plain = trainer(num_train_epochs=2)
    off = trainer(num_train_epochs=2, dynamic_sampling=True, dynamic_sampling_budget=0)
    for t in (plain, off):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.train()
    for agent in ("left", "right"):
        assert torch.equal(plain.policies[agent].logits, off.policies[agent].logits)


def assert_stop_and_resume_is_exact(tmp_path, **options):
    """A run stopped after 2 optimizer steps and resumed ends with the uninterrupted run's logits."""
    def build(output_dir, **overrides):
        return trainer(num_train_epochs=2, output_dir=str(output_dir), save_steps=1, save_total_limit=None, **options, **overrides)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, resumed = uninterrupted_and_resumed(build, tmp_path, max_steps=2)
    for agent in ("left", "right"):
        assert torch.equal(resumed.policies[agent].logits, full.policies[agent].logits)


def test_dynamic_sampling_stops_and_resumes_exactly(tmp_path):
    assert_stop_and_resume_is_exact(tmp_path, dynamic_sampling=True)


# --- the annealed entropy bonus, two timescales ----------------------------------------------


def test_the_annealed_coefficient_is_linear_from_the_first_batch_to_the_last():
    # 0.4 -> 0 over 5 batches: 0.4 - 0.4 * b / 4
    assert [entropy_coefficient(0.4, 0.0, b, 5) for b in range(5)] == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.0], abs=1e-12)
    assert entropy_coefficient(0.4, 0.0, 5, 5) == 0.0  # an epoch's closing update after the last batch
    assert entropy_coefficient(0.1, 0.5, 1, 3) == pytest.approx(0.3, abs=1e-12)  # rising works too
    assert entropy_coefficient(0.4, None, 3, 5) == 0.4  # not annealed
    assert entropy_coefficient(0.4, 0.0, 0, 1) == 0.0  # a one-batch run: the final coefficient


def test_the_trainer_anneals_the_entropy_bonus_batch_by_batch(tmp_path):
    """2 epochs x 2 batches: the coefficient at batch b is 0.6 - 0.6 * b / 3 = 0.6, 0.4, 0.2, 0,
    logged as train/entropy_coef; the bonus in the loss uses it."""
    import llm_marl.learners.update as update

    t = trainer(num_train_epochs=2, entropy_coef=0.6, entropy_coef_final=0.0, logging_steps=1, output_dir=str(tmp_path))
    used, entropies = [], []
    bonus, per_answer = t._entropy_bonus, update.answer_entropies

    def entropy_spy(entropy, mask):
        entropies.append(per_answer(entropy, mask).detach())
        return entropies[-1]

    def spy(agent, batch):  # the coefficient the loss used: its bonus over the entropies it was given
        entropies.clear()
        result = bonus(agent, batch)
        sizes = [len(s.completions) for s in batch]
        total = float(sum(chunk.mean() for chunk in entropies[0].split(sizes))) if entropies else None
        used.append((t.state.batch_step, 0.0 if result is None else round(float(result) / total, 6)))
        return result

    t._entropy_bonus = spy
    update.answer_entropies = entropy_spy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.train()
    finally:
        update.answer_entropies = per_answer
    assert sorted(set(used)) == [(0, 0.6), (1, 0.4), (2, 0.2), (3, 0.0)]
    with open(tmp_path / "metrics.jsonl") as f:
        logged = [row["train/entropy_coef"] for row in map(json.loads, f) if "train/entropy_coef" in row]
    assert logged == pytest.approx([0.6, 0.4, 0.2, 0.0], abs=1e-6)


def test_per_agent_learning_rates_and_sgd_step_each_agent_by_hand():
    """One SGD step on one group (actions 0 and 1 of a uniform 3-way row, advantages -1, +1): the
    loss (log p0 - log p1) / 2 has gradient (0.5, -0.5, 0) in the row's logits, so each agent's
    row moves by its own rate times (-0.5, 0.5, 0)."""
    t = trainer(agent_learning_rates=[0.1, 0.3], optim="sgd")
    assert [type(t.optimizer_by_agent[a]).__name__ for a in ("left", "right")] == ["SGD", "SGD"]
    step = {}
    for agent in ("left", "right"):
        observation = f"item 0: {agent}"
        step[agent] = [Sample(agent, observation, [Completion("red", action=0), Completion("green", action=1)],
                              [0.0, 1.0], [-1.0, 1.0], 0, 0)]
    t._joint_optimizer_step(step)
    for agent, rate in (("left", 0.1), ("right", 0.3)):
        policy = t.policies[agent]
        row = policy.logits[policy.rows[f"item 0: {agent}"]].detach()
        assert row.tolist() == pytest.approx([-0.5 * rate, 0.5 * rate, 0.0], abs=1e-7)
    # the default: AdamW at agent_learning_rate for every agent
    plain = trainer()
    assert [(type(o).__name__, o.param_groups[0]["lr"]) for o in plain.optimizer_by_agent.values()] == [("AdamW", 0.3)] * 2
    # the actor-critic learners build their actors' optimizers the same way (critics: critic_learning_rate)
    from llm_marl.learners import IACConfig, IACTrainer

    iac = IACTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                     args=IACConfig(num_turns=1, num_generations=1, agent_learning_rates=[0.1, 0.3], optim="sgd", critic_learning_rate=0.05))
    assert [(type(o).__name__, o.param_groups[0]["lr"]) for o in iac.optimizer_by_agent.values()] == [("SGD", 0.1), ("SGD", 0.3)]
    assert {(type(o).__name__, o.param_groups[0]["lr"]) for o in iac.critic_optimizers.values()} == {("SGD", 0.05)}


def test_annealing_and_two_timescales_resume_exactly(tmp_path):
    assert_stop_and_resume_is_exact(tmp_path, entropy_coef=0.5, entropy_coef_final=0.0, agent_learning_rates=[0.1, 0.5], optim="sgd",
                                    agent_advantage_normalization=[False, True])


def test_per_agent_normalization_divides_only_the_named_agents_groups():
    """Two-turn trees of the real trainer, left unnormalized and right normalized: left's
    advantages are its returns minus their group mean, right's are also divided by the group's
    population std; the same trees with advantage_normalization for both differ in left only."""
    from llm_marl.learners.tree import collect_trees

    t = trainer(num_turns=2, num_generations=3, agent_advantage_normalization=[False, True])
    roots = collect_trees(t.env, t.policies, [0, 1], t.args, seed=1)
    samples = t._samples(roots)
    assert {s.agent for s in samples} == {"left", "right"}
    spread = 0
    for s in samples:
        mean = sum(s.returns) / len(s.returns)
        std = math.sqrt(sum((g - mean) ** 2 for g in s.returns) / len(s.returns))
        scale = max(std, 1e-6) if s.agent == "right" else 1.0
        assert s.advantages == pytest.approx([(g - mean) / scale for g in s.returns], abs=1e-9)
        spread += s.agent == "left" and abs(std - 1.0) > 0.1  # a left group whose std is not 1: normalization would show
    assert spread
    both = trainer(num_turns=2, num_generations=3)._samples(roots)
    changed = {a.agent for a, b in zip(samples, both) if a.advantages != pytest.approx(b.advantages, abs=1e-9)}
    assert changed == {"left"}


def test_per_agent_normalization_whitens_only_the_named_actor_critic_agents():
    """IAC whitens an agent's buffered advantages together at the update: only where that
    agent's entry of agent_advantage_normalization is true."""
    from llm_marl.learners import IACConfig, IACTrainer

    iac = IACTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                     args=IACConfig(num_turns=1, num_generations=1, rollout_buffer_size=3, agent_advantage_normalization=[True, False]))
    raw = [1.0, 2.0, 6.0]
    for agent in ("left", "right"):
        iac.buffers[agent].samples = [Sample(agent, f"item {i}", [Completion("red", action=0)], [a], [a], i, 0) for i, a in enumerate(raw)]
    (left,) = iac._minibatches("left", 3)
    (right,) = iac._minibatches("right", 3)
    std = math.sqrt(sum((a - 3.0) ** 2 for a in raw) / 3)  # mean 3, population std sqrt(14/3)
    assert [s.advantages[0] for s in left] == pytest.approx([(a - 3.0) / std for a in raw], rel=1e-5)
    assert [s.advantages[0] for s in right] == raw


# --- optimistic credit ------------------------------------------------------------------------


def two_step_tree():
    """Player 0 answers twice at the root (rewards 0 and 1); after each answer player 1 answers
    twice (rewards 3, 1 after the first; 0, 3 after the second)."""
    root = RolloutNode(0, 0, {}, completions={"p0": ["a", "b"]}, joint=[(0,), (1,)], rewards=[0.0, 1.0])
    first = RolloutNode(1, 0, {}, completions={"p1": ["c", "d"]}, joint=[(0,), (1,)], rewards=[3.0, 1.0], children=[None, None])
    second = RolloutNode(1, 0, {}, completions={"p1": ["c", "d"]}, joint=[(0,), (1,)], rewards=[0.0, 3.0], children=[None, None])
    root.children = [first, second]
    return root


@pytest.mark.parametrize("how, temperature, expected", [
    ("mean", 1.0, [0 + (3 + 1) / 2, 1 + (0 + 3) / 2]),
    ("max", 1.0, [0 + 3, 1 + 3]),
    # soft maximum t * log(mean exp(G / t)) at t = 1: log((e^3 + e^1) / 2) = 2.433781, 1 + log((1 + e^3) / 2) = 3.355440
    ("softmax", 1.0, [2.433781, 3.355440]),
    # at t = 2: 2 log((e^1.5 + e^0.5) / 2) = 2.240229, 1 + 2 log((1 + e^1.5) / 2) = 3.016532
    ("softmax", 2.0, [2.240229, 3.016532]),
])
def test_optimistic_credit_equals_a_hand_computation_on_a_two_step_tree(how, temperature, expected):
    root = two_step_tree()
    _compute_returns(root, 1.0, how, temperature)
    assert root.children[0].returns == [3.0, 1.0] and root.children[1].returns == [0.0, 3.0]  # leaves: their rewards
    assert root.returns == pytest.approx(expected, abs=1e-6)
    assert root.agent_returns("p0") == pytest.approx(expected, abs=1e-6)


def test_soft_maximum_goes_from_the_mean_to_the_max():
    values = [3.0, 1.0, 0.0, 2.0]
    assert aggregate_children(values, "softmax", 1e-3) == pytest.approx(3.0, abs=1e-2)
    assert aggregate_children(values, "softmax", 1e4) == pytest.approx(1.5, abs=1e-3)


def test_optimistic_credit_reaches_the_trees_through_the_config():
    t = trainer(num_turns=2, tree_return_aggregation="max")
    from llm_marl.learners.tree import collect_trees, iter_nodes

    roots = collect_trees(t.env, t.policies, [0, 1], t.args, seed=1)
    for node in iter_nodes(roots):
        for j, child in enumerate(node.children):
            if child is not None:
                assert node.returns[j] == node.rewards[j] + max(child.returns)


def test_bad_options_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="tree_return_aggregation"):
        MAGRPOConfig(tree_return_aggregation="best")
    with pytest.raises(ValueError, match="tree_return_temperature"):
        MAGRPOConfig(tree_return_temperature=0.0)
    with pytest.raises(ValueError, match="entropy_coef"):
        MAGRPOConfig(entropy_coef=-0.1)
    with pytest.raises(ValueError, match="dynamic_sampling_budget"):
        MAGRPOConfig(dynamic_sampling_budget=-1)
    with pytest.raises(ValueError, match="entropy_coef_final"):
        MAGRPOConfig(entropy_coef_final=-0.1)
    with pytest.raises(ValueError, match=r"agent_learning_rates must list one rate per agent \(2\)"):
        MAGRPOConfig(agent_learning_rates=[0.1])
    with pytest.raises(ValueError, match=r"agent_learning_rates\[1\] must be a number > 0"):
        MAGRPOConfig(agent_learning_rates=[0.1, 0.0])
    with pytest.raises(ValueError, match="optim must be one of 'adamw_torch', 'sgd'"):
        MAGRPOConfig(optim="adam")
    with pytest.raises(ValueError, match=r"agent_advantage_normalization must list one true/false per agent \(2\)"):
        MAGRPOConfig(agent_advantage_normalization=[True])
    with pytest.raises(ValueError, match="agent_advantage_normalization"):
        MAGRPOConfig(agent_advantage_normalization=[1, 0])


def test_the_shipped_tiny_hanabi_config_runs_from_the_command_without_actions(tmp_path):
    """`llm-marl train --config examples/configs/tiny_hanabi.yaml --env TinyHanabi-E-v0`: tabular
    policies over the game's three moves, the config's options in the run's config."""
    pytest.importorskip("pyspiel")
    import os

    from llm_marl.cli import main

    config = os.path.join(os.path.dirname(__file__), "..", "examples", "configs", "tiny_hanabi.yaml")
    out = tmp_path / "run"
    assert main(["train", "--config", config, "--env", "TinyHanabi-E-v0", "--seed", "1", "--num_train_epochs", "1", "--train-items", "8",
                 "--output_dir", str(out), "--threads", "1"]) == 0
    saved = json.loads((out / "run.json").read_text())
    text = json.dumps(saved)
    assert '"tree_return_aggregation": "softmax"' in text and '"num_turns": 2' in text
    assert '"agent_advantage_normalization": [false, true]' in text and '"agent_learning_rates": [0.3, 0.1]' in text
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/player_0/zero_advantage_groups" in row for row in rows)


# --- best-of-group imitation ------------------------------------------------------------------


def test_best_of_group_imitation_gives_each_groups_best_answers_one_share_in_the_real_trainer():
    """advantage_mode="best" without normalization, through the trainer's own trees: in every
    group the n answers at the top return get 1/n each when it beats another answer, the rest 0;
    a group whose returns coincide gets 0 everywhere and counts as a zero-advantage group."""
    from llm_marl.learners.tree import collect_trees

    t = trainer(num_turns=2, num_generations=3, advantage_mode="best", advantage_normalization=False)
    samples = t._samples(collect_trees(t.env, t.policies, [0, 1, 2, 3], t.args, seed=1))
    kinds = set()
    for s in samples:
        top, n = max(s.returns), s.returns.count(max(s.returns))
        expected = [0.0] * 3 if top == min(s.returns) else [1.0 / n if g == top else 0.0 for g in s.returns]
        assert s.advantages == pytest.approx(expected, abs=1e-12)
        kinds.add("flat" if top == min(s.returns) else f"{n} best")
    assert {"flat", "1 best"} <= kinds


def test_best_of_group_imitation_learns_each_items_colour_and_its_reward_blind_control_does_not():
    """Tabular ColourMatch (one turn, four items, each with its own target): imitating each group's
    best answers makes both agents name every item's target with probability above 0.95; the same
    run with each group's advantages shuffled (same seed) leaves them at 0.5 or less on average."""
    from controls import reward_blind

    def trained(blind: bool) -> list[float]:
        t = trainer(num_generations=4, num_train_epochs=15, advantage_mode="best", advantage_normalization=False)
        if blind:
            with reward_blind("shuffle", 0):
                t.train()
        else:
            t.train()
        chances = []
        for agent, policy in t.policies.items():
            for item in range(4):
                row = policy.logits[policy.rows[f"item {item}: {agent}, name a colour"]].detach()
                chances.append(float(torch.softmax(row, 0)[item % 3]))
        return chances

    learned, control = trained(False), trained(True)
    assert min(learned) > 0.95
    assert sum(control) / len(control) < 0.5  # shuffled advantages: a drift, about the uniform 1/3 on average
