"""Language-model teams play OpenSpiel games through the command (issue 36, item 4).

``--policy lm`` makes an OpenSpiel id's env with ``text=True`` (prompts that show the player's
observation and list its legal moves by name) and short answers (``cli.GAME_LM_RUN``). The SmolLM2
learning curve lives in benchmarks/lm_tiny_hanabi.py; here the tiny local GPT-2 runs the path.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("pyspiel")

from llm_marl.cli import GAME_LM_RUN, build_trainer, main  # noqa: E402
from llm_marl.envs.openspiel import OpenSpielEnv  # noqa: E402
from llm_marl.envs import make  # noqa: E402
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.runs.recording import read_trees, rollout_files  # noqa: E402
from llm_marl.viewer import build_page, write_page  # noqa: E402
from llm_marl.viewer.chromium import Chromium, find_chromium  # noqa: E402


def test_the_command_trains_a_language_model_team_on_tiny_hanabi_from_text_prompts(tmp_path, monkeypatch):
    """The tiny GPT-2 never writes a move name such as ``p0a1``: with the real parser every
    answer is illegal and player 1 never acts. A stand-in parser maps an answer to a legal move
    by its length, so both players act and rewards differ; prompts, answer length, tree depth and
    the updates are the command's own."""

    def by_length(self, answer, player):
        legal = list(self.state.legal_actions(player))
        return legal[len(answer) % len(legal)]

    monkeypatch.setattr(OpenSpielEnv, "parse", by_length)
    out = tmp_path / "run"
    argv = ["train", "--env", "TinyHanabi-E-v0", "--policy", "lm", "--model", "tiny", "--max_steps", "2", "--temperature", "1.0",
            "--top_p", "1.0", "--agent_learning_rate", "1e-3", "--eval_interval", "0", "--rollout_log_steps", "1", "--seed", "0",
            "--output_dir", str(out)]
    assert main(argv) == 0
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["max_new_tokens"] == GAME_LM_RUN["max_new_tokens"] == 16 and config["num_turns"] == 2
    assert config["early_termination_threshold"] is None  # the default -0.2 would stop every tree after move 1 (reward 0)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if "train/player_1/advantage_std" in row]
    assert train and train[0]["step"] <= 2  # both players trained from the first batches on
    assert any(row["train/player_0/advantage_std"] > 0 and row["train/player_1/advantage_std"] > 0 for row in train)
    [(_, _, path), *_] = [f for f in rollout_files(str(out)) if f[0] == "train"]
    nodes = read_trees(path)[0]["nodes"]
    root, second = nodes[0], nodes[1]
    assert root["observations"]["player_0"].endswith("\nWhich move do you make? Choose one of: p0a0, p0a1, p0a2.")
    assert second["observations"]["player_1"].endswith("\nWhich move do you make? Choose one of: p1a0, p1a1, p1a2.")
    assert "p0:a" in second["observations"]["player_1"]  # player 1 sees player 0's move
    assert list(root["agents"]) == ["player_0"] and list(second["agents"]) == ["player_1"]
    answers = [c for n in nodes for a in n["agents"].values() for c in a["completions"]]
    assert answers and all(c["tokens"] <= 16 for c in answers)


def test_illegal_answers_of_a_language_model_end_the_game_and_are_counted(tmp_path):
    """The real parser: the tiny model's answers name no move, so each game ends at the first move
    with the defined penalty (game E's minimum payoff, 0) and player 0's illegal rate is 1."""
    trainer = build_trainer({"env": "TinyHanabi-E-v0", "policy": "lm", "model": "tiny", "eval_num_samples": 8, "eval_batch_size": 8,
                             "train_items": 3, "output_dir": str(tmp_path / "run"), "progress_bar": False, "seed": 0})
    assert trainer.env.num_items == 3 and trainer.eval_env.num_items == 1000  # --train-items: the first 3 deals
    assert trainer.eval_env.text is True and trainer.args.max_new_tokens == 16 and trainer.args.early_termination_threshold is None
    metrics = trainer.evaluate()
    assert metrics["eval/player_0/illegal_rate"] == 1.0 and "eval/player_1/illegal_rate" not in metrics
    assert metrics["eval/turn_1/expected_return"] == 0.0


def test_the_command_plays_on_after_illegal_answers_with_the_random_on_illegal_id(tmp_path):
    """Hanabi-Small-RandomOnIllegal-v0 from the command: every answer of the tiny model is illegal,
    yet player 1 acts too (a random legal move was played for player 0), and both illegal rates are 1."""
    trainer = build_trainer({"env": "Hanabi-Small-RandomOnIllegal-v0", "policy": "lm", "model": "tiny", "eval_num_samples": 2,
                             "eval_batch_size": 2, "output_dir": str(tmp_path / "run"), "progress_bar": False, "seed": 0})
    assert trainer.eval_env.text is True and trainer.env.on_illegal == trainer.eval_env.on_illegal == "random"
    metrics = trainer.evaluate()
    assert metrics["eval/player_0/illegal_rate"] == metrics["eval/player_1/illegal_rate"] == 1.0
    assert -1.0 <= metrics["eval/turn_1/reward_mean"] <= 0.0  # each first move: the substitute's 0 or 1, plus the penalty -1


# --- a long game: Hanabi-Small-v0 played to its end, recorded, in the viewer ----------------------------


class SafeHanabi(TabularPolicy):
    """Answers the first legal move in its prompt of: a discard, else a hint, else a play (so the
    game lasts until the deck runs out: about 35 moves)."""

    def sample(self, observations, num_samples, generators=None):
        rows = []
        for text in observations:
            legal = re.search(r"Choose one of: (.*)\.$", text).group(1).split(", ") if "Choose one of:" in text else [self.actions[0]]
            move = next((m for prefix in ("(Discard", "(Reveal", "(Play") for m in legal if m.startswith(prefix)), legal[0])
            rows.append([Completion(move)] * num_samples)
        return rows


def test_a_whole_hanabi_game_is_recorded_and_shown_by_the_viewer(tmp_path):
    env = make("Hanabi-Small-v0", text=True)
    moves = [env.game.action_to_string(0, a) for a in range(env.game.num_distinct_actions())]
    out = tmp_path / "run"
    args = MAGRPOConfig(num_turns=env.num_turns, eval_num_samples=1, progress_bar=False, output_dir=str(out), seed=0)
    trainer = MAGRPOTrainer(env=env, policies=[SafeHanabi(moves), SafeHanabi(moves)], args=args, eval_env=make("Hanabi-Small-v0", text=True, split="eval"))
    metrics = trainer.evaluate()
    assert metrics["eval/player_0/illegal_rate"] == metrics["eval/player_1/illegal_rate"] == 0.0
    [(_, _, path)] = rollout_files(str(out))
    [record] = read_trees(path)
    nodes = record["nodes"]
    assert 30 <= len(nodes) <= env.num_turns and nodes[-1]["children"] == [None]  # a chain to the game's end
    assert [list(n["agents"]) for n in nodes[:3]] == [["player_0"], ["player_1"], ["player_0"]]
    prompts = [n["observations"][list(n["agents"])[0]] for n in nodes]
    assert "Deck size: 0" in prompts[-1] and max(map(len, prompts)) < 2 * len(prompts[0])  # no history: prompts stay short
    page = build_page(str(out))
    assert f"[0, {len(nodes)}, " in page
    if find_chromium() is None:
        pytest.skip("no Chromium: the page was built; install the Debian package `chromium` to render it")
    with Chromium.start() as browser:
        browser.open("file://" + write_page(str(out), str(tmp_path / "viewer.html")))
        shown = browser.evaluate("window.llmMarlViewer.ready.then(() => document.querySelectorAll('#tree .node').length)")
        assert shown == len(nodes) and browser.console_errors == []


def test_the_lm_benchmark_evaluates_before_each_batch_and_at_the_end_once(tmp_path):
    """benchmarks/lm_tiny_hanabi.py at tiny size: one curve point per batch plus the end (the final
    evaluation is in the logger's history already), and a readable end-of-run game."""
    import argparse
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_tiny_hanabi", root / "benchmarks" / "lm_tiny_hanabi.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ns = argparse.Namespace(batches=2, eval_items=2, transcripts=1, threads=1)
    row = bench.run(0, True, {"model": "tiny", "lora_target_modules": ["c_attn"]}, ns)
    assert row["run"] == "control" and len(row["curve"]) == 3
    [game] = row["transcripts"]
    assert game.startswith("  [player_0 sees] 'tiny_hanabi_E: you are player 0.") and "[player_0 says]" in game and "  return 0" in game
    # the tiny GPT-2 never names a move: every game ends illegal at 0, so every group of player 0
    # earned one return (no signal), player 1 never acts, and the exact return is 0 before and after
    assert row["stalls"]["player_0/zero_advantage_groups"] == [1.0, 1.0] and "player_1/zero_advantage_groups" not in row["stalls"]
    assert len(row["stalls"]["player_0/entropy"]) == 2 and row["exact"] == [0.0, 0.0]


def test_the_lm_benchmark_scores_the_exact_return_from_the_probability_of_each_move_name():
    """benchmarks/lm_tiny_hanabi.py's exact return: a move's probability is that of its name's
    tokens as the answer, the rest counts as illegal (0). Player 0 always names p0a1 (probability
    1); player 1 names p1a1 with 0.5 and p1a0 with 0.25 at every prompt (a quarter of its answers
    name no move): 0.5 * 8 + 0.25 * 4 = 5 on every deal (game E pays 4, 8, 4 after p0a1)."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from llm_marl.envs.openspiel import tiny_hanabi

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_tiny_hanabi", root / "benchmarks" / "lm_tiny_hanabi.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    chances = {"p0a0": 0.0, "p0a1": 1.0, "p0a2": 0.0, "p1a0": 0.25, "p1a1": 0.5, "p1a2": 0.0}

    class Stub:
        def tokenizer(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def token_log_probs(self, observations, completions):
            assert all("Which move do you make?" in o for o in observations)
            assert all(list(c.token_ids) == [ord(ch) for ch in c.text] for c in completions)
            values = torch.zeros(len(completions), 4)
            values[:, 0] = torch.log(torch.tensor([chances[c.text] for c in completions]))
            return values, torch.ones(len(completions), 4, dtype=torch.bool)

    trainer = SimpleNamespace(eval_env=tiny_hanabi("E", text=True, split="eval"), policies={"player_0": Stub(), "player_1": Stub()})
    assert bench.exact_return(trainer) == pytest.approx(5.0)
    chances.update({"p1a0": 0.0, "p1a1": 1.0})  # the safe convention: 8 on every deal
    assert bench.exact_return(trainer) == pytest.approx(8.0)


def test_the_lm_benchmarks_scripted_partners_are_worth_what_their_conventions_promise():
    """benchmarks/lm_tiny_hanabi.py --partner: player 0 plays a fixed convention by its card, and the
    exact return scores it as certain. With player 1 answering each convention's best reply with
    probability 1 (read off game E's payoffs by hand: after p0a2 or p0a0 of ``optimal`` the cards are
    known, so p1a0 when they match and p1a2 when they differ; after ``nine``'s p0a0 the card is 0, so
    p1a0 with card 0 and p1a2 with card 1, and p1a1 after p0a1) the team is worth 10, 9 and 8; with
    player 1 answering p1a2 at every prompt, ``optimal`` is worth 5 (right when the cards differ)."""
    import importlib.util
    import re
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from llm_marl.envs.openspiel import tiny_hanabi
    from llm_marl.policies.scripted import ScriptedPolicy

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_tiny_hanabi", root / "benchmarks" / "lm_tiny_hanabi.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    best = {
        "optimal": {("d0", "a2"): "p1a0", ("d1", "a2"): "p1a2", ("d0", "a0"): "p1a2", ("d1", "a0"): "p1a0"},
        "nine": {("d0", "a0"): "p1a0", ("d1", "a0"): "p1a2", ("d0", "a1"): "p1a1", ("d1", "a1"): "p1a1"},
        "safe": {("d0", "a1"): "p1a1", ("d1", "a1"): "p1a1"},
    }

    class Player1:
        def __init__(self, answers):
            self.answers = answers

        def tokenizer(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def token_log_probs(self, observations, completions):
            values = torch.full((len(completions), 1), float("-inf"))
            for i, (observation, completion) in enumerate(zip(observations, completions)):
                card, move = re.search(r"p1:(d\d) p0:(a\d)", observation).groups()
                if self.answers(card, move) == completion.text:
                    values[i, 0] = 0.0
            return values, torch.ones(len(completions), 1, dtype=torch.bool)

    for convention, worth in (("optimal", 10.0), ("nine", 9.0), ("safe", 8.0)):
        assert bench.best_answers(convention) == {(int(c[1]), int(m[1])): int(a[-1]) for (c, m), a in best[convention].items()}
        partner = ScriptedPolicy(bench.partner_answers(convention), "player_0")
        assert partner.fn("tiny_hanabi_E: you are player 0.\np0:d1\nWhich move do you make?", 2) == [bench.PARTNERS[convention]["d1"]] * 2
        trainer = SimpleNamespace(eval_env=tiny_hanabi("E", text=True, split="eval"),
                                  policies={"player_0": partner, "player_1": Player1(lambda c, m, t=best[convention]: t[(c, m)])})
        assert bench.exact_return(trainer) == pytest.approx(worth), convention
    trainer.policies = {"player_0": ScriptedPolicy(bench.partner_answers("optimal"), "player_0"), "player_1": Player1(lambda c, m: "p1a2")}
    assert bench.exact_return(trainer) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="no single card of player 0"):
        bench.partner_answers("optimal")("you are player 0.", 1)


def test_the_lm_benchmarks_supervised_check_trains_player_1_on_its_best_answers(tmp_path):
    """benchmarks/lm_tiny_hanabi.py --supervised: player 1's adapter trained by cross-entropy on its
    best answers at each of its prompts (found by walking game E's tree) raises every right
    answer's probability."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_tiny_hanabi", root / "benchmarks" / "lm_tiny_hanabi.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    trainer = bench.build({**bench.RUN, "model": "tiny", "lora_target_modules": ["c_attn"], "seed": 0, "output_dir": str(tmp_path), "num_threads": 1}, None)
    trace = bench.supervised_steps(trainer, "optimal", learning_rate=1e-2, limit=3)
    assert len(trace) == 3 and sorted(trace[0]["right"]) == ["d0a0", "d0a2", "d1a0", "d1a2"]
    assert all(trace[-1]["log_prob"][k] > trace[0]["log_prob"][k] for k in trace[0]["log_prob"])


def test_a_choice_answering_player_learns_its_best_answer_and_its_reward_blind_control_does_not(tmp_path):
    """``choice_answers``: player 1, a tiny LoRA adapter choosing among the moves its prompt lists
    (ChoicePolicy), plays against the scripted ``safe`` partner (player 0 always plays its middle
    move). Its best answer is then ``p1a1`` at both cards (payoff 8; the others 4), so the team's
    exact return can reach 8. Trained by MAGRPO, it does; trained from advantages shuffled within
    each group (same seed, same deals), it does not. Every answer is legal (the menu)."""
    import importlib.util
    from pathlib import Path

    from controls import reward_blind
    from llm_marl.policies.choice import ChoicePolicy

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_tiny_hanabi", root / "benchmarks" / "lm_tiny_hanabi.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found = {}
    for arm in ("magrpo", "control"):
        options = {**bench.RUN, "model": "tiny", "lora_target_modules": ["c_attn"], "choice_answers": True, "seed": 0,
                   "output_dir": str(tmp_path / arm), "num_threads": 1, "agent_learning_rates": [1e-2, 1e-2], "temperature": 1.0,
                   "eval_interval": 0, "dynamic_sampling": False}
        torch.manual_seed(0)
        trainer = bench.build(options, "safe")
        assert isinstance(trainer.policies["player_1"], ChoicePolicy)
        before = bench.exact_return(trainer)
        trainer.env.num_items = 6 * trainer.args.items_per_step
        if arm == "control":
            with reward_blind("shuffle", 0):
                trainer.train()
        else:
            trainer.train()
        found[arm] = (before, bench.exact_return(trainer), trainer.evaluate())
    (start, learned, metrics), (control_start, control, _) = found["magrpo"], found["control"]
    assert start == control_start and 4.0 < start < 7.5  # the same untrained team, below the partner's best
    assert learned > 7.9 and control < start
    assert metrics["eval/player_1/illegal_rate"] == 0.0


def test_the_exact_update_diagnostic_values_player_1s_prompts_by_game_es_payoffs():
    """benchmarks/lm_player1_exact.py: each prompt player 1 can see against a scripted partner, its
    probability and each answer's mean payoff, against the payoff table read by hand."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_player1_exact", root / "benchmarks" / "lm_player1_exact.py")
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    bench = exact.load_benchmark()
    weights, values = exact.prompt_values(bench, "optimal")  # card 0 plays p0a2, card 1 plays p0a0
    assert weights == {(0, 0): 0.25, (1, 0): 0.25, (0, 2): 0.25, (1, 2): 0.25}
    assert values == {(0, 0): [0, 0, 10], (1, 0): [10, 0, 0], (0, 2): [10, 0, 0], (1, 2): [0, 0, 10]}
    weights, values = exact.prompt_values(bench, "safe")  # both cards play p0a1: the mean over player 0's cards
    assert weights == {(0, 1): 0.5, (1, 1): 0.5} and values == {(0, 1): [4, 8, 4], (1, 1): [4, 8, 4]}


def test_the_team_exact_diagnostic_credits_player_0_by_hand_and_knows_the_optimal_answers():
    """benchmarks/lm_team_exact.py: player 0's credit for one move, payoffs (10, 0, 0) for player 1's
    answers drawn with probabilities (1/2, 1/2, 0), K = 2, by hand; and the answers of its fixed
    optimal player 1, read off game E's payoffs by hand."""
    import importlib.util
    import math
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("llm_marl_bench_lm_team_exact", root / "benchmarks" / "lm_team_exact.py")
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    payoff, pi1 = [10.0, 0.0, 0.0], [0.5, 0.5, 0.0]
    assert exact.credit(payoff, pi1, "mean", 2, 1.0) == pytest.approx(5.0)
    # draws (0,0), (0,1), (1,0), (1,1), each 1/4: maxima 10, 10, 10, 0
    assert exact.credit(payoff, pi1, "max", 2, 1.0) == pytest.approx(7.5)
    mixed = 10 + math.log((1 + math.exp(-10)) / 2)  # log mean exp of (10, 0): 9.3072
    assert exact.credit(payoff, pi1, "softmax", 2, 1.0) == pytest.approx(0.25 * 10 + 0.5 * mixed)
    assert exact.credit(payoff, pi1, "menu-softmax", 2, 1.0) == pytest.approx(mixed)
    # after p0a2 (card 0) player 1 answers p1a0 with card 0 and p1a2 with card 1; after p0a0 (card 1)
    # the reverse; after the safe move p0a1, p1a1 (8 on every deal)
    assert exact.optimal_answers(exact.load_benchmark()) == {(0, 2): 0, (1, 2): 2, (0, 0): 2, (1, 0): 0, (0, 1): 1, (1, 1): 1}
