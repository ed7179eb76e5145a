"""natural_gradient (llm_marl/learners/natural_gradient.py): the damped Gauss-Newton direction by
hand, its tabular twin (a table's step is SGD's divided by 1 + damping) inside a real trainer run,
a step that moves coupled logits as a table's would, and game E learned by a policy whose
observations share their logits, where the same run without the preconditioner stalls at the
safe convention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

torch.set_num_threads(1)

from llm_marl.envs.openspiel import tiny_hanabi  # noqa: E402
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.natural_gradient import fisher_factor, gauss_newton_direction, logit_jacobian, precondition  # noqa: E402
from llm_marl.policies.base import Completion, GapMeter, sampler_record  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402


class CoupledTable(nn.Module):
    """A softmax policy whose observations share most of their logits, as a language model's
    prompts one token apart do: ``logits(o) = shared + coupling * own[o]``. Plain gradient steps
    move every observation by about the sum of what each asked for."""

    def __init__(self, actions, coupling: float = 0.1, capacity: int = 16):
        super().__init__()
        self.actions = list(actions)
        self.coupling = coupling
        self.shared = nn.Parameter(torch.zeros(len(self.actions)))
        self.own = nn.Parameter(torch.zeros(capacity, len(self.actions)))
        self.rows: dict[str, int] = {}
        self.sampler_gap = GapMeter("float32")

    def get_extra_state(self):
        return {"rows": dict(self.rows)}

    def set_extra_state(self, state):
        self.rows = dict(state["rows"])

    def menu_logits(self, observation):
        row = self.rows.setdefault(observation, len(self.rows))
        return self.shared + self.coupling * self.own[row]

    def probabilities(self, observation):
        with torch.no_grad():
            return torch.softmax(self.menu_logits(observation), dim=-1)

    def sample(self, observations, num_samples):
        out = []
        for o in observations:
            with torch.no_grad():
                table = torch.log_softmax(self.menu_logits(o), dim=-1)
            picks = torch.multinomial(table.exp(), num_samples, replacement=True).tolist()
            out.append([Completion(self.actions[a], action=a, sampler=sampler_record(self, [float(table[a])])) for a in picks])
        return out

    def log_probs(self, observations, completions, reduction="sum"):
        rows = [torch.log_softmax(self.menu_logits(o), dim=-1) for o in observations]
        picks = [c.action if c.action is not None else self.actions.index(c.text) for c in completions]
        entropy = torch.stack([-(row.exp() * row).sum() for row in rows]).unsqueeze(1) if rows else torch.zeros(0, 1)
        self.last_token_entropy = (entropy, torch.ones_like(entropy, dtype=torch.bool))  # the entropy bonus's
        return torch.stack([row[a] for row, a in zip(rows, picks)]) if rows else torch.zeros(0)


def test_direction_is_the_damped_gauss_newton_step_by_hand():
    # J = [[1, 0], [1, 1]], lam = 1: (J^T J + I)^{-1} = [[3, 1], [1, 2]]^{-1} = [[2, -1], [-1, 3]] / 5,
    # times G = (1, 0): (0.4, -0.2)
    jacobian = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    direction = gauss_newton_direction(torch.tensor([1.0, 0.0], dtype=torch.float64), jacobian, 1.0)
    assert direction.tolist() == pytest.approx([0.4, -0.2], abs=1e-12)
    # G = J^T g: J times the direction is K (K + lam)^{-1} g, close to g when lam is small
    g = torch.tensor([0.3, -0.5], dtype=torch.float64)
    assert (jacobian @ gauss_newton_direction(jacobian.T @ g, jacobian, 1e-6)).tolist() == pytest.approx(g.tolist(), abs=1e-5)
    assert gauss_newton_direction(g, torch.zeros(0, 2, dtype=torch.float64), 0.1).tolist() == g.tolist()


def test_fisher_factor_squares_to_the_categorical_fisher_by_hand():
    # pi = (1/2, 1/4, 1/4): diag(pi) - pi pi^T = [[1/4, -1/8, -1/8], [-1/8, 3/16, -1/16], [-1/8, -1/16, 3/16]], times 1/2
    factor = fisher_factor(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).log(), 0.5)
    expected = [[1 / 8, -1 / 16, -1 / 16], [-1 / 16, 3 / 32, -1 / 32], [-1 / 16, -1 / 32, 3 / 32]]
    assert (factor @ factor.T).tolist() == [pytest.approx(row, abs=1e-12) for row in expected]


def test_a_step_moves_coupled_logits_as_a_tables_natural_gradient_would():
    """Loss sum_o w_o . z_o (w_o summing to 0), observation o holding n_o of N samples: the natural
    gradient of a table moves z_o by -lr F_o^+ w_o, F_o = (n_o / N)(diag pi_o - pi_o pi_o^T).
    Preconditioned, the coupled policy's step does that (up to a constant per row, which softmax
    ignores); unpreconditioned it moves both observations by about the sum, here almost 0."""
    policy = CoupledTable(["0", "1", "2"], coupling=0.05)
    with torch.no_grad():
        policy.own.normal_()
    observations = ["p0:d0", "p0:d0", "p0:d0", "p0:d1"]  # shares 3/4 and 1/4
    weights = {"p0:d0": torch.tensor([1.0, -1.0, 0.0]), "p0:d1": torch.tensor([-1.0, 1.0, 0.0])}  # they cancel in sum
    lr = 0.01
    moved = {}
    for preconditioned in (False, True):
        copy = CoupledTable(["0", "1", "2"], coupling=0.05)
        copy.load_state_dict(policy.state_dict())
        before = {o: copy.menu_logits(o).detach().clone() for o in weights}
        loss = sum((weights[o] * copy.menu_logits(o)).sum() for o in weights)
        loss.backward()
        if preconditioned:
            precondition(copy, list(copy.parameters()), observations, damping=1e-7)
        with torch.no_grad():
            for p in copy.parameters():
                p -= lr * p.grad
        moved[preconditioned] = {o: copy.menu_logits(o).detach() - before[o] for o in weights}
    for o, share in (("p0:d0", 0.75), ("p0:d1", 0.25)):
        pi = torch.softmax(policy.menu_logits(o).detach().double(), dim=-1)
        table_step = -lr * torch.linalg.pinv(share * (torch.diag(pi) - torch.outer(pi, pi))) @ weights[o].double()
        step = moved[True][o].double()
        assert (step - step.mean()).tolist() == pytest.approx((table_step - table_step.mean()).tolist(), rel=1e-3, abs=1e-5)
        assert moved[False][o].abs().max() < 0.01 * lr  # the shared part cancels: coupling^2 of each own step is left


def test_jacobian_of_a_choice_policy_matches_its_menu_log_probabilities(tiny_model_dir):
    """ChoicePolicy.menu_logits: softmax of them is the policy; J's rows are their gradients."""
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.policies.choice import ChoicePolicy

    policy = ChoicePolicy(CausalLMPolicy.from_pretrained(str(tiny_model_dir)))
    prompt = "you are player 0.\np0:d1\nWhich move do you make? Choose one of: p0a0, p0a1, p0a2."
    logits = policy.menu_logits(prompt)
    probabilities = policy.probabilities(prompt)
    assert torch.softmax(logits.detach(), dim=-1).tolist() == pytest.approx(list(probabilities.values()), abs=1e-6)
    params = [p for p in policy.parameters() if p.requires_grad]
    other = prompt.replace("p0:d1", "p0:d0")
    jacobian, [table, _] = logit_jacobian(policy, [prompt, other], params)
    assert table.tolist() == pytest.approx(logits.detach().double().tolist(), abs=1e-6)
    assert jacobian.shape == (6, sum(p.numel() for p in params))
    # the vmapped backward pass gives each row as its own backward pass would, in observation order
    for row, (observation, j) in enumerate([(o, j) for o in (prompt, other) for j in range(3)]):
        own = torch.autograd.grad(policy.menu_logits(observation)[j], params)
        assert jacobian[row].tolist() == pytest.approx(torch.cat([g.reshape(-1) for g in own]).double().tolist(), abs=1e-6)


def _game_e(policy_class, seed, epochs=10, **overrides):
    torch.manual_seed(seed)
    env = tiny_hanabi("E", num_items=32)
    policies = {agent: policy_class(["0", "1", "2"]) for agent in env.possible_agents}
    settings = dict(num_turns=2, num_train_epochs=epochs, items_per_step=16, rollout_buffer_size=16, agent_rollout_buffer_sizes=[16, 64],
                    num_generations=4, agent_learning_rates=[0.3, 0.1], optim="sgd", advantage_normalization=False,
                    tree_return_aggregation="softmax", tree_return_temperature=0.5, early_termination_threshold=None,
                    eval_interval=0, progress_bar=False, logging_steps=10**9, seed=seed)
    settings.update(overrides)
    trainer = MAGRPOTrainer(env=env, policies=policies, args=MAGRPOConfig(**settings), eval_env=env)
    trainer.train()

    def probabilities(agent, observation, legal):
        table = policies[agent].probabilities(observation)
        return [float(table[a]) for a in legal]

    return env.expected_return(probabilities), trainer, policies


def test_a_tables_step_in_a_real_run_is_the_fisher_solve_of_sgds_gradient(monkeypatch):
    """A table is its own Jacobian: its natural-gradient step is (F + lam I)^{-1} G row by row,
    F_o = (n_o / N)(diag pi - pi pi^T), lam = damping. Player 0's first optimizer step of a real
    run (same seed, so the same samples) with plain SGD gives G; the preconditioned run's step must
    equal the solve computed here from G and the step's observations."""
    import llm_marl.learners.update as update

    seen = []
    original = update.precondition
    monkeypatch.setattr(update, "precondition", lambda policy, params, observations, damping: (seen.append(list(observations)), original(policy, params, observations, damping))[1])
    _, plain, plain_policies = _game_e(TabularPolicy, seed=0, epochs=1, max_steps=1, agent_learning_rates=[1.0, 1.0])
    _, ng, ng_policies = _game_e(TabularPolicy, seed=0, epochs=1, max_steps=1, agent_learning_rates=[1.0, 1.0],
                                 natural_gradient=True, natural_gradient_damping=0.01)
    assert len(seen) == 1 and len(seen[0]) == 16  # player 0's first step: its 16 groups
    table_plain, table_ng = plain_policies["player_0"], ng_policies["player_0"]
    for card in (0, 1):
        observation = f"p0:d{card}"
        grad = -table_plain.logits[table_plain.rows[observation]].detach().double()  # from zero logits at rate 1
        pi = torch.full((3,), 1 / 3, dtype=torch.float64)
        fisher = seen[0].count(observation) / 16 * (torch.diag(pi) - torch.outer(pi, pi))
        expected = -torch.linalg.solve(fisher + 0.01 * torch.eye(3, dtype=torch.float64), grad)
        assert table_ng.logits[table_ng.rows[observation]].detach().double().tolist() == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-6)
        assert grad.abs().max() > 0.01  # the step saw signal


def test_coupled_policy_learns_game_e_with_the_natural_gradient_and_stalls_without():
    """Game E (optimum 10, safe convention 8, one move everywhere 5). Both players share most of
    their logits across observations. With natural_gradient every seed ends within 3% of the
    optimum; the same runs with each group's advantages shuffled (the reward-blind control, same
    seeds) do not learn, and plain SGD without the preconditioner, at 40 and 20 times the rates,
    moves every observation together and ends at one move everywhere."""
    from controls import reward_blind

    learner = dict(natural_gradient=True, entropy_coef=1.0, entropy_coef_final=0.0)
    found = {}
    for seed in (0, 1, 2):
        with reward_blind("shuffle", seed):
            blind = _game_e(CoupledTable, seed, **learner)[0]
        found[seed] = (_game_e(CoupledTable, seed, **learner)[0], blind, _game_e(CoupledTable, seed, agent_learning_rates=[12.0, 2.0])[0])
    for with_ng, blind, plain in found.values():
        assert with_ng > 9.7 and blind < 6.0 and plain < 6.0, found


def test_natural_gradient_refuses_a_free_text_policy_and_a_bad_damping():
    with pytest.raises(ValueError, match="natural_gradient_damping must be a number > 0"):
        MAGRPOConfig(natural_gradient=True, natural_gradient_damping=0.0)
    with pytest.raises(ValueError, match="natural_gradient=True needs .* fsdp=True shards it"):
        MAGRPOConfig(natural_gradient=True, fsdp=True)

    class FreeText:
        pass

    with pytest.raises(TypeError, match="answers from a menu .* got FreeText"):
        logit_jacobian(FreeText(), ["prompt"], [nn.Parameter(torch.zeros(1))])
    assert math.isfinite(MAGRPOConfig(natural_gradient=True).natural_gradient_damping)


# --- per-agent buffer sizes: both players of a K-branch turn-based tree step once a batch ------


def test_per_agent_buffer_sizes_give_each_player_one_step_a_batch():
    """Tiny Hanabi, 4 deals a batch, K = 2: player 0 buffers 4 groups a batch, player 1 (K groups
    after each of player 0's answers) 8, appended node by node (player 0's first), each full
    buffer consumed at once. Buffers of 4 give player 1 two steps a batch on 4 groups each;
    agent_rollout_buffer_sizes=[4, 8] gives each player one step a batch on all its groups."""
    sizes = {}
    for per_agent in (None, [4, 8]):
        torch.manual_seed(0)
        env = tiny_hanabi("E", num_items=8)
        trainer = MAGRPOTrainer(env=env, policies={a: TabularPolicy(["0", "1", "2"]) for a in env.possible_agents},
                                args=MAGRPOConfig(num_turns=2, num_train_epochs=1, items_per_step=4, rollout_buffer_size=4,
                                                  agent_rollout_buffer_sizes=per_agent, num_generations=2, eval_interval=0,
                                                  progress_bar=False, early_termination_threshold=None, seed=0))
        steps = []
        original = trainer._joint_optimizer_step
        trainer._joint_optimizer_step = lambda step: (steps.append({a: len(b) for a, b in step.items()}), original(step))[1]
        trainer.train()
        sizes[None if per_agent is None else tuple(per_agent)] = (steps, trainer.state.global_step)
    assert sizes[None] == ([{"player_0": 4}, {"player_1": 4}, {"player_1": 4}] * 2, 6)
    assert sizes[(4, 8)] == ([{"player_0": 4}, {"player_1": 8}] * 2, 4)
    with pytest.raises(ValueError, match=r"agent_rollout_buffer_sizes\[1\] must be an int >= 1, got 0"):
        MAGRPOConfig(agent_rollout_buffer_sizes=[4, 0])
    with pytest.raises(ValueError, match="agent_rollout_buffer_sizes must list one size per agent"):
        MAGRPOConfig(agent_rollout_buffer_sizes=[4])


def test_natural_gradient_with_per_agent_buffers_stops_and_resumes_exactly(tmp_path):
    from resumed import uninterrupted_and_resumed

    def build(output_dir, **overrides):
        env = tiny_hanabi("E", num_items=16)
        settings = dict(num_turns=2, num_train_epochs=1, items_per_step=4, rollout_buffer_size=4, agent_rollout_buffer_sizes=[4, 16],
                        num_generations=4, agent_learning_rates=[3.0, 1.0], optim="sgd", natural_gradient=True,
                        advantage_normalization=False, early_termination_threshold=None, eval_interval=0, progress_bar=False,
                        seed=5, output_dir=str(output_dir), save_steps=1, save_total_limit=None)
        settings.update(overrides)
        return MAGRPOTrainer(env=env, policies={a: CoupledTable(["0", "1", "2"]) for a in env.possible_agents},
                             args=MAGRPOConfig(**settings), eval_env=env)

    full, resumed = uninterrupted_and_resumed(build, tmp_path, max_steps=2, seed=5)
    for agent in full.policies:
        assert resumed.policies[agent].rows == full.policies[agent].rows
        for name in ("shared", "own"):
            assert torch.equal(getattr(resumed.policies[agent], name), getattr(full.policies[agent], name)), (agent, name)


def test_a_trainer_with_natural_gradient_names_the_agent_without_a_menu(tiny_model_dir):
    from llm_marl.policies.causal_lm import CausalLMPolicy

    env = tiny_hanabi("E", num_items=4)
    policies = {"player_0": TabularPolicy(["0", "1", "2"]), "player_1": CausalLMPolicy.from_pretrained(str(tiny_model_dir))}
    with pytest.raises(TypeError, match="answer from a menu .* agent 'player_1' has a CausalLMPolicy"):
        MAGRPOTrainer(env=env, policies=policies, args=MAGRPOConfig(num_turns=2, natural_gradient=True, optim="sgd"))
    with pytest.warns(UserWarning, match="optim='adamw_torch': .* undoes that"):
        MAGRPOTrainer(env=env, policies={a: TabularPolicy(["0", "1", "2"]) for a in env.possible_agents},
                      args=MAGRPOConfig(num_turns=2, natural_gradient=True))
