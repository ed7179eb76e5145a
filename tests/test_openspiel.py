"""OpenSpielEnv: common-payoff OpenSpiel games as parallel envs (llm_marl/envs/openspiel.py).

PettingZoo's parallel_api_test, parallel_seed_test and render_test, and whole-episode seeded
replays, run on every registered game id in tests/test_env_compliance.py; here: the Tiny Hanabi
payoffs against the published optima, moves and illegal answers, chance reproducibility,
forking, trees, the illegal-rate metric, and the error without open-spiel.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

pytest.importorskip("pyspiel")

from llm_marl.envs import make  # noqa: E402
from llm_marl.envs.openspiel import TINY_HANABI, OpenSpielEnv, tiny_hanabi  # noqa: E402
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.tree import grow_trees  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402


def brute_force_optimum(payoff):
    """max over deterministic joint policies of E[payoff], cards uniform and independent."""
    payoff = np.asarray(payoff, dtype=float)
    n, _, m, _ = payoff.shape
    best, best_policy = -np.inf, None
    for first in itertools.product(range(m), repeat=n):  # player 0: card -> action
        # player 1 sees its card and player 0's action: choose its best reply per information set
        value = 0.0
        second = {}
        for c1, a0 in itertools.product(range(n), range(m)):
            scores = [sum(payoff[c0, c1, a0, a1] for c0 in range(n) if first[c0] == a0) for a1 in range(m)]
            second[(c1, a0)] = int(np.argmax(scores))
            value += max(scores)
        value /= n * n
        if value > best:
            best, best_policy = value, (first, second)
    return best, best_policy


@pytest.mark.parametrize("game", sorted(TINY_HANABI))
def test_tiny_hanabi_payoffs_reach_the_published_optima_through_the_env(game):
    payoff, published = TINY_HANABI[game]
    optimum, (first, second) = brute_force_optimum(payoff)
    assert optimum == pytest.approx(published)
    env = make(f"TinyHanabi-{game}-v0")

    def deterministic(agent, observation, legal):
        # observations: "p0:d<card>" and "p1:d<card> p0:a<action>"
        fields = observation.split()
        card = int(fields[0].split(":d")[1])
        choice = first[card] if agent == "player_0" else second[(card, int(fields[1].split(":a")[1]))]
        return [1.0 if a == choice else 0.0 for a in legal]

    assert env.expected_return(deterministic) == pytest.approx(published)
    uniform = env.expected_return(lambda agent, observation, legal: [1 / len(legal)] * len(legal))
    assert uniform == pytest.approx(np.mean(payoff))


def test_game_e_is_openspiels_default_payoff():
    import pyspiel

    default = pyspiel.load_game("tiny_hanabi").get_parameters()["payoff"]
    assert tiny_hanabi("E").game.get_parameters()["payoff"].split(";") == [f"{float(v):g}" for v in default.split(";")]
    assert [float(v) for v in default.split(";")] == np.asarray(TINY_HANABI["E"][0], dtype=float).flatten().tolist()


def test_turns_moves_and_the_action_mask():
    env = make("TinyHanabi-E-v0")
    obs, infos = env.reset(options={"index": 0})
    assert env.num_turns == 2 and env.acting_agents == ["player_0"]
    assert obs["player_0"].startswith("p0:d") and obs["player_1"].startswith("p1:d")
    assert infos["player_0"]["legal_moves"] == ["p0a0", "p0a1", "p0a2"] and infos["player_0"]["action_mask"] == (1, 1, 1)
    assert infos["player_1"]["action_mask"] == (0, 0, 0) and env.action_mask("player_0").dtype == np.int8
    obs, rewards, terms, _, infos = env.step({"player_0": " P0A1 ", "player_1": 2})  # a name; player_1's entry ignored
    assert obs["player_1"].endswith("p0:a1") and env.acting_agents == ["player_1"] and not any(terms.values())
    obs, rewards, terms, _, infos = env.step({"player_1": 1})  # an action id
    assert rewards == {"player_0": 8.0, "player_1": 8.0} and all(terms.values())  # E: the middle action earns 8
    assert infos["player_0"]["reward_details"] == {"illegal": [], "moves": {"player_1": "p1a1"}}


@pytest.mark.parametrize("answer", ["", "play the best card", "p0a7", 7, "p0a0 or p0a1", None])
def test_an_illegal_or_unparsable_answer_ends_the_episode_with_the_penalty(answer):
    env = tiny_hanabi("A", illegal_reward=-1.0)
    env.reset(options={"index": 3})
    obs, rewards, terms, truncs, infos = env.step({"player_0": answer})
    assert rewards == {"player_0": -1.0, "player_1": -1.0} and all(terms.values()) and env.agents == []
    assert infos["player_1"]["reward_details"]["illegal"] == ["player_0"]


def test_the_default_on_an_illegal_answer_is_to_end_the_game():
    assert OpenSpielEnv("tiny_hanabi").on_illegal == "end" and make("Hanabi-Small-v0").on_illegal == "end"
    assert make("Hanabi-Small-RandomOnIllegal-v0").on_illegal == "random"
    with pytest.raises(ValueError, match=r"on_illegal must be one of \['end', 'random'\], got 'skip'"):
        tiny_hanabi("E", on_illegal="skip")
    with pytest.raises(ValueError, match="illegal_penalty goes with on_illegal='random'"):
        tiny_hanabi("E", illegal_penalty=-2.0)
    with pytest.raises(ValueError, match="illegal_reward goes with on_illegal='end'"):
        tiny_hanabi("E", on_illegal="random", illegal_reward=-2.0)


# game E's payoff to player 1's move after player 0 played its middle move p0a1, whatever the cards
E_AFTER_P0A1 = {"p1a0": 4.0, "p1a1": 8.0, "p1a2": 4.0}


@pytest.mark.parametrize("answer", ["", "play the best card", "p1a7", 7, None])
def test_random_on_illegal_plays_a_legal_move_and_adds_the_penalty(answer):
    env = tiny_hanabi("E", on_illegal="random", illegal_penalty=-1.5)
    env.reset(options={"index": 3})
    obs, rewards, terms, _, infos = env.step({"player_0": "p0a1"})
    assert rewards == {"player_0": 0.0, "player_1": 0.0} and env.acting_agents == ["player_1"]
    obs, rewards, terms, _, infos = env.step({"player_1": answer})
    details = infos["player_0"]["reward_details"]
    played = details["moves"]["player_1"]
    assert details["illegal"] == ["player_1"] and played in E_AFTER_P0A1 and all(terms.values())
    assert rewards == {a: E_AFTER_P0A1[played] - 1.5 for a in ("player_0", "player_1")}  # the game's 4 or 8, plus the penalty
    # an illegal first move: the game goes on, the step pays 0 + the default penalty -1
    env = tiny_hanabi("E", text=True, on_illegal="random")
    env.reset(options={"index": 3})
    obs, rewards, terms, _, infos = env.step({"player_0": answer})
    assert rewards == {"player_0": -1.0, "player_1": -1.0} and not any(terms.values()) and env.acting_agents == ["player_1"]
    assert infos["player_1"]["reward_details"]["moves"]["player_0"] in ("p0a0", "p0a1", "p0a2")
    assert obs["player_1"].split("\n")[1].endswith("p0:" + infos["player_1"]["reward_details"]["moves"]["player_0"][2:])


def test_the_substituted_move_is_uniform_over_legal_moves_and_reproduces():
    # keyed by item and history: the same deal and moves give the same substitute, in a fresh env, a fork or a reseeded one
    first = []
    for index in range(300):
        env = tiny_hanabi("E", on_illegal="random")
        env.reset(options={"index": index})
        first.append(env.step({"player_0": "?"})[4]["player_0"]["reward_details"]["moves"]["player_0"])
    counts = [first.count(m) for m in ("p0a0", "p0a1", "p0a2")]
    assert sum(counts) == 300 and min(counts) >= 75  # about 100 each (binomial sd 8)
    a, b = make("Hanabi-Small-RandomOnIllegal-v0"), make("Hanabi-Small-RandomOnIllegal-v0")
    assert a.reset(seed=7) == b.reset(seed=7)
    fork = a.fork()
    for _ in range(3):
        mover = a.acting_agents[0]
        steps = [env.step({mover: "not a move"}) for env in (a, b, fork)]
        assert steps[0] == steps[1] == steps[2] and steps[0][4][mover]["reward_details"]["illegal"] == [mover]
        if not a.agents:
            break
    assert str(a.state) == str(b.state) == str(fork.state) and a.state is not fork.state


def test_random_on_illegal_pays_the_games_reward_plus_one_penalty_per_illegal_answer():
    """The reward equals that of a twin that plays the substituted moves as legal answers, plus the penalty per illegal answer."""
    hanabi = make("Hanabi-Small-RandomOnIllegal-v0", illegal_penalty=-0.25)
    hanabi.reset(options={"index": 2})
    while hanabi.agents:
        twin, mover = hanabi.fork(), hanabi.acting_agents[0]
        _, rewards, *_, infos = hanabi.step({mover: "(Play 9)"})
        move = infos[mover]["reward_details"]["moves"][mover]
        assert move in twin.legal_moves(mover)
        _, legal_rewards, *_ = twin.step({mover: move})
        assert rewards == {a: legal_rewards[a] - 0.25 for a in legal_rewards}
        assert str(twin.state) == str(hanabi.state)
    assert hanabi.state.is_terminal()  # played on to the game's own end
    boxes = make("OpenSpiel-v0", game="coop_box_pushing", on_illegal="random", illegal_penalty=-1.0)
    boxes.reset(options={"index": 0})
    twin = boxes.fork()
    _, rewards, *_, infos = boxes.step({"player_0": 99, "player_1": -1})  # two illegal answers at a simultaneous node
    moves = infos["player_0"]["reward_details"]["moves"]
    assert infos["player_0"]["reward_details"]["illegal"] == ["player_0", "player_1"]
    ids = {a: twin.legal_actions(a)[twin.legal_moves(a).index(moves[a])] for a in moves}
    _, legal_rewards, *_ = twin.step(ids)
    assert rewards["player_0"] == rewards["player_1"] == legal_rewards["player_0"] - 2.0


def test_random_on_illegal_keeps_the_tree_growing_and_counts_the_illegal_rate():
    """Player 0 only ever answers nonsense: "end" stops every tree at the root; "random" plays on,
    so player 1 acts after it, and player 0's illegal rate is 1, player 1's 0."""
    from llm_marl.learners.evaluation import illegal_rates

    policies = {"player_0": TabularPolicy(["nonsense"]), "player_1": TabularPolicy(["p1a1"])}
    rates = {}
    for mode in ("end", "random"):
        env = tiny_hanabi("E", text=True, on_illegal=mode)
        roots = grow_trees(env, policies, [0, 1, 2], num_samples=2, num_turns=2, seed=0)
        rates[mode] = illegal_rates(roots, "train")
        children = [c for root in roots for c in root.children]
        if mode == "end":
            assert children and all(c is None for c in children)
        else:
            assert len(children) == 6 and all(c.agents == ["player_1"] for c in children)
            assert all(r == -1.0 for root in roots for r in root.rewards)  # player 0's move pays 0, plus the penalty
    assert rates["end"] == {"train/player_0/illegal_rate": 1.0}
    assert rates["random"] == {"train/player_0/illegal_rate": 1.0, "train/player_1/illegal_rate": 0.0}


def test_text_prompts_name_the_legal_moves_and_answers_are_parsed():
    env = make("Hanabi-Small-v0", text=True)
    obs, infos = env.reset(options={"index": 0})
    assert "Choose one of: (Play 0), (Play 1)" in obs["player_0"] and "Wait for the other player." in obs["player_1"]
    assert env.parse("I will play 1", 0) == env.parse("(Play 1)", 0) == env.parse("play 1", 0)
    assert env.parse("discard everything", 0) is None


def test_chance_is_keyed_by_item_and_history_so_branches_and_replays_reproduce():
    deals = {tiny_hanabi("E").reset(options={"index": i})[0]["player_0"] + "|" + tiny_hanabi("E").reset(options={"index": i})[0]["player_1"] for i in range(40)}
    assert len(deals) == 4  # both cards of both players occur
    a, b = make("Hanabi-Small-v0"), make("Hanabi-Small-v0")
    assert a.reset(options={"index": 5}) == b.reset(options={"index": 5})
    # a fork meets the same chance outcomes as the original after the same moves (a card is drawn after a play)
    fork = a.fork()
    move = a.legal_actions("player_0")[0]
    assert a.step({"player_0": move}) == fork.step({"player_0": move})
    assert str(a.state) == str(fork.state) and a.state is not fork.state
    assert str(b.state) != str(a.state)  # b, not stepped, is untouched


def test_only_common_payoff_games_are_accepted():
    with pytest.raises(ValueError, match="'kuhn_poker' has .*ZERO_SUM.*share one payoff"):
        OpenSpielEnv("kuhn_poker")
    with pytest.raises(ValueError, match="could not load game 'no_such_game'"):
        make("OpenSpiel-v0", game="no_such_game")
    env = make("OpenSpiel-v0", game="tiny_bridge_2p", observation_type="observation")
    assert env.acting_agents == [] and env.reset(seed=1)[1]["player_0"]["acting_agents"] == ["player_0"]


def test_simultaneous_moves_act_together():
    env = make("CoopBoxPushing-v0")
    env.reset(options={"index": 0})
    assert env.acting_agents == ["player_0", "player_1"]
    with pytest.raises(ValueError, match=r"no action for acting agent\(s\) \['player_1'\]"):
        env.step({"player_0": 0})
    _, rewards, *_ = env.step({"player_0": 3, "player_1": 3})
    assert rewards["player_0"] == rewards["player_1"]


def test_trees_branch_on_the_player_to_move():
    env = make("TinyHanabi-B-v0")
    policies = {a: TabularPolicy(["a0", "a1"]) for a in env.possible_agents}
    [root] = grow_trees(env, policies, [2], num_samples=2, num_turns=2, seed=0)
    assert root.agents == ["player_0"] and all(c.agents == ["player_1"] for c in root.children)
    assert all(len(c.rewards) == 2 for c in root.children)


def test_illegal_rate_is_logged_per_agent():
    env = tiny_hanabi("E", text=True, num_items=8)
    policies = {"player_0": TabularPolicy(["p0a0", "p0a1", "nonsense"]), "player_1": TabularPolicy(["p1a0", "p1a1", "p1a2"])}
    args = MAGRPOConfig(num_turns=2, num_generations=4, num_train_epochs=1, items_per_step=8, rollout_buffer_size=100,
                        eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None, logging_steps=1)
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args, eval_env=env)
    trainer.train()
    logged = {k: v for _, metrics in trainer.logger.history for k, v in metrics.items() if k.endswith("illegal_rate")}
    assert 0.1 < logged["train/player_0/illegal_rate"] < 0.6  # a third of its answers, uniform policy
    assert "train/player_1/illegal_rate" not in logged or logged["train/player_1/illegal_rate"] == 0.0


def test_a_missing_open_spiel_names_the_games_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspiel", None)
    with pytest.raises(ImportError) as caught:
        make("TinyHanabi-A-v0")
    message = str(caught.value)
    assert "\n" not in message and "llm_marl[games]" in message and "open-spiel" in message


# --- benchmarks/tiny_hanabi.py ----------------------------------------------------------------------


def _benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tiny_hanabi.py"
    spec = importlib.util.spec_from_file_location("llm_marl_bench_tiny_hanabi", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_safe_convention_of_game_e_is_a_person_by_person_optimum():
    """Both players always play the middle action: every deal pays 8 (< 10), and neither player
    gains by changing its own policy alone (player 1 faces [4, 8, 4]; player 0, facing a
    partner who always plays the middle, gets 0 elsewhere)."""
    bench = _benchmark()
    payoff = np.asarray(TINY_HANABI["E"][0], dtype=float)
    p0 = np.zeros((2, 3))
    p0[:, 1] = 1
    p1 = np.zeros((2, 3, 3))
    p1[:, :, 1] = 1
    assert bench.unilateral_gain(payoff, p0, p1) == pytest.approx(0.0)
    assert bench.best_deviation(payoff, p0, p1) == ("none", 0.0, 1.0)
    # player 0 plays action 0 on card 0 (partner: always the middle): those two deals pay 0. Going
    # back to the middle there gains 2 x 8/4 = 4 (the best single change); player 1 answering 0 at
    # (card 0, action 0) and 2 at (card 1, action 0) gains 10/4 at each: 5 for its whole policy
    p0[0] = [1, 0, 0]
    assert bench.unilateral_gain(payoff, p0, p1) == pytest.approx(5.0)
    assert bench.best_deviation(payoff, p0, p1) == ("player 0 at card 0", pytest.approx(4.0), 0.0)
    uniform0, uniform1 = np.full((2, 3), 1 / 3), np.full((2, 3, 3), 1 / 3)
    assert bench.unilateral_gain(payoff, uniform0, uniform1) > 0.5


def test_independent_reinforce_at_k1_trains_and_is_scored_exactly():
    bench = _benchmark()
    import argparse

    args = argparse.Namespace(epochs=3, items=8, items_per_step=4, k=4, lr=0.1, diagnose=True)
    value, gain = bench.train_one("REINFORCE K=1", "B", 0, args)
    assert 0.0 <= value <= 1.0 and gain >= -1e-9


def test_the_command_trains_on_a_game_id_with_its_own_horizon(tmp_path):
    """`llm-marl train --env TinyHanabi-E-v0` takes the game's 2 turns as num_turns (no flag)."""
    import json

    from llm_marl.cli import main

    out = tmp_path / "run"
    assert main(["train", "--env", "TinyHanabi-E-v0", "--actions", "0,1,2", "--max_steps", "2", "--output_dir", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/turn_2/reward_mean" in row and "eval/player_0/illegal_rate" in row for row in rows)
    assert '"num_turns": 2' in (out / "run.json").read_text()
