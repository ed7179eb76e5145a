"""The cooperative coding task (CoopCode): HumanEval data and split, code extraction, every
canonical solution passing (and a wrong one failing) in the sandbox pool, the reward levels on
hand-written answers, parallel branch scoring in a rollout tree, the multi-turn feedback modes,
the eval hooks and the PettingZoo face."""

from __future__ import annotations

import re
import threading
import time
import warnings

import pytest
from pettingzoo.test import parallel_api_test

from llm_marl.envs import DialogueEnv
from llm_marl.learners.tree import grow_trees
from llm_marl.policies.scripted import ScriptedPolicy
from llm_marl import sandbox
from llm_marl.tasks import code
from llm_marl.tasks.base import Turn
from llm_marl.tasks.code import (
    CoopCodeTask,
    eval_aggregator,
    eval_logger,
    extract_code,
    humaneval_problems,
    kept_code,
    score_answers,
)

ADD = 53  # HumanEval/53: def add(x: int, y: int) -> x + y; 6 tests, the last a loop of 100 random pairs
AUX = "def aux(a, b):\n    return a + b\n"
COOP = "def add(x: int, y: int):\n    total = aux(x, y)\n    return total\n"
WRAPPER = "def add(x: int, y: int):\n    return aux(x, y)\n"
IGNORED = "def add(x: int, y: int):\n    aux(x, y)\n    return aux(x, y)\n"
ALONE = "def add(x: int, y: int):\n    return x + y\n"
# passes (0, 1), (1, 0), (2, 3); fails (5, 7), (7, 5) and the random loop: 3 of 6
HALF = "def add(x: int, y: int):\n    return x + y if x <= 2 else 0\n"
HALF_COOP = "def add(x: int, y: int):\n    s = aux(x, y)\n    return s if x <= 2 else 0\n"
SYNTAX = "def add(x: int, y: int):\n    return x +* y\n"


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


@pytest.fixture(scope="module")
def add_item(problems):
    return problems[ADD]


def score(item, aux, main, **kw):
    return score_answers([(item, aux, main)], **kw)[0]


# --- data ----------------------------------------------------------------------------------------


def test_dataset_is_humaneval_with_a_fixed_split(problems):
    task = CoopCodeTask()
    train, evaluation, everything = task.dataset("train"), task.dataset("eval"), task.dataset("all")
    assert (len(train), len(evaluation), len(everything)) == (132, 32, 164)
    assert [row["number"] for row in evaluation] == list(range(4, 164, 5))
    assert set(train["task_id"]) | set(evaluation["task_id"]) == {p["task_id"] for p in problems}
    assert len(task.dataset("test")) == 32
    with pytest.raises(ValueError):
        task.dataset("dev")
    row = everything[32]  # find_zero: the prompt's import and helper poly() are the preamble
    assert "import math" in row["preamble"] and "def poly(" in row["preamble"]
    assert row["signature"].startswith("def find_zero(xs: list):")
    assert sum(len(p["tests"]) for p in problems) == 1133


def test_check_is_split_into_single_tests(problems):
    setup, tests, texts = code.split_check(problems[151]["test"])
    # `lst` and `odd_sum` are set-up statements of check(); they are re-run inside the last test
    assert len(tests) == 7 and texts[-1].startswith("assert candidate(lst) == odd_sum ,")
    assert "lst = list(range(-99, 100, 2))" in tests[-1] and "lst =" not in tests[0]
    _, tests64, texts64 = code.split_check(problems[64]["test"])
    assert not any(t.startswith("assert True") for t in texts64) and len(tests64) == 7


# --- code extraction ---------------------------------------------------------------------------


def test_extract_code_from_fences_and_prose():
    fenced = "Here is the helper:\n```python\ndef aux(a, b):\n    return a + b\n```\nIt adds two numbers."
    assert extract_code(fenced) == AUX
    assert extract_code("```py\n    def aux(a):\n        return a\n```") == "def aux(a):\n    return a\n"
    unclosed = "Sure!\n```python\ndef aux(a):\n    return a"
    assert extract_code(unclosed) == "def aux(a):\n    return a\n"
    two = "```python\nimport math\n```\nand\n```\ndef f(x):\n    return math.sqrt(x)\n```\n```text\noutput\n```"
    assert extract_code(two) == "import math\n\ndef f(x):\n    return math.sqrt(x)\n"
    prose = "Sure, here is my answer.\n\ndef aux(a, b):\n    return a + b\n\nThis function adds a and b.\n- it is fast\n"
    assert extract_code(prose) == AUX
    assert extract_code(AUX) == AUX
    assert extract_code("no code at all") == "no code at all\n"
    assert extract_code("") == ""


def test_kept_code_drops_statements_and_forbidden_definitions():
    answer = "import math\n\ndef aux(a):\n    return a\n\ndef add(x, y):\n    return 0\n\nprint(aux(3))\nassert aux(1) == 1\n"
    assert kept_code(answer, forbidden="add") == "import math\n\ndef aux(a):\n    return a\n"
    broken = "Answer:\ndef aux(a):\n    return a +* 1\nprint(aux(2))\n"
    assert kept_code(broken) == "def aux(a):\n    return a +* 1\n"


# --- every canonical solution passes, a wrong main fails ----------------------------------------


def test_all_canonical_solutions_pass_and_wrong_mains_fail(problems):
    trivial_aux = "def aux(x):\n    return x\n"
    wrong = "    raise NotImplementedError('deliberately wrong')\n    return None\n"
    jobs = [(p, trivial_aux, p["signature"] + "\n" + p["canonical_solution"]) for p in problems]
    jobs += [(p, trivial_aux, p["signature"] + "\n" + wrong) for p in problems]
    start = time.perf_counter()
    results = score_answers(jobs)
    elapsed = time.perf_counter() - start
    good, bad = results[: len(problems)], results[len(problems) :]
    failing = [(p["task_id"], d["first_failure"], d["load_error"]) for p, d in zip(problems, good) if not d["all_passed"]]
    assert failing == []
    # canonical + unused aux: structure 1.0 + syntax 0.5 + tests 1.0, no cooperation
    assert {d["score"] for d in good} == {2.5}
    assert [p["task_id"] for p, d in zip(problems, bad) if d["tests_passed"] > 0] == []
    assert all(d["syntax_ok"] and d["tests_total"] == len(p["tests"]) for p, d in zip(problems, bad))
    print(f"\n{len(jobs)} programs (164 canonical + 164 wrong) in {elapsed:.1f}s")


# --- reward levels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "aux, main, expected",
    [
        (AUX, COOP, 4.0),  # 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0
        (AUX, IGNORED, 3.5),  # ... - 0.5: a call's result is ignored
        (AUX, WRAPPER, 3.0),  # thin wrapper: no +1.0
        ("I would rather not write a helper.", ALONE, 2.1),  # 0.6 + 0.5 + 1.0
        ("I would rather not write a helper.", COOP, 1.1),  # aux missing: NameError, no test passes
        (AUX, ALONE, 2.5),  # aux unused
        (AUX, HALF, 2.0),  # 1.0 + 0.5 + 3/6
        (AUX, HALF_COOP, 3.5),  # 1.0 + 0.5 + 3/6 + 0.5 + 1.0
        (AUX, SYNTAX, 1.0),  # structure only
        ("def aux(a, b):\n    return a +\n", ALONE, 1.0),  # aux's syntax error breaks the program
        (AUX, "I don't know.", 0.4),  # main missing
        # aux without a return: no +0.4 and no cooperation bonus, though main calls it and passes
        ("def aux(a, b):\n    print(a)\n", "def add(x: int, y: int):\n    aux(x, y)\n    return x + y\n", 2.1),
        (AUX, "def add(x, y):\n    x + y\n", 0.4),  # main without a return
    ],
)
def test_reward_levels(add_item, aux, main, expected):
    d = score(add_item, aux, main)
    assert d["score"] == expected
    assert d["score"] == round(sum(d["levels"].values()), 10)


def test_a_main_that_spawns_a_process_fails_its_tests(add_item):
    spawning = "def add(x: int, y: int):\n    import subprocess\n    subprocess.run(['true'])\n    return x + y\n"
    d = score(add_item, AUX, spawning)
    assert d["tests_passed"] == 0 and d["score"] == 1.5  # structure + syntax; allowed to run it would be 2.5
    assert d["first_failure"]["error"].startswith(("PermissionError", "BlockingIOError")), d["first_failure"]


def test_reward_details_and_shift(add_item):
    task = CoopCodeTask()
    value, d = task.reward(add_item, {"aux": AUX, "main": HALF}, ())
    assert value == 2.0 - 4.0 and d["score"] == 2.0
    assert d["levels"] == {"structure": 1.0, "syntax": 0.5, "tests": 0.5, "cooperation": 0.0}
    assert (d["tests_passed"], d["tests_failed"], d["tests_total"], d["timeouts"]) == (3, 3, 6, 0)
    assert d["first_failure"] == {"test": "assert candidate(5, 7) == 12", "error": "AssertionError: candidate returned 0"}
    assert d["syntax_ok"] and d["syntax_error"] is None and d["load_error"] is None and not d["all_passed"]
    full = task.reward(add_item, {"aux": f"```python\n{AUX}```", "main": f"Here you go:\n```python\n{COOP}```"}, ())
    assert full[0] == 0.0 and full[1]["all_passed"] and full[1]["main_calls_aux"]
    assert CoopCodeTask(reward_shift=0.0).reward(add_item, {"aux": AUX, "main": WRAPPER}, ())[0] == 3.0
    _, broken = task.reward(add_item, {"aux": AUX, "main": SYNTAX}, ())
    assert re.fullmatch(r"line 2, column \d+: invalid syntax", broken["main_syntax_error"])
    assert broken["syntax_error"].startswith("line ")
    assert broken["aux_syntax_error"] is None and not broken["syntax_ok"]


def test_timeouts_are_counted(add_item):
    loop = "def add(x: int, y: int):\n    while x >= 0:\n        pass\n    return x\n"
    d = score(add_item, AUX, loop, timeout_per_test=0.3, program_timeout=1.5)
    assert d["tests_passed"] == 0 and (d["timeouts"] >= 1 or d["sandbox_timed_out"])
    assert d["score"] == 1.5


# --- parallel scoring in a rollout tree ---------------------------------------------------------


def test_tree_branches_are_scored_in_parallel_and_match_one_by_one(add_item, monkeypatch):
    aux_answers = [AUX, "def aux(a, b):\n    return a - b\n", "no helper"]
    main_answers = [COOP, ALONE, SYNTAX]
    # answers without a main or with a syntax error need no sandbox: 6 sandboxes at the root,
    # 3 at each of its 9 children
    aux_policy = ScriptedPolicy(lambda obs, n: aux_answers[:n], name="aux")
    main_policy = ScriptedPolicy(lambda obs, n: main_answers[:n] if "Turn 2" not in obs else [WRAPPER, SYNTAX, "pass"][:n], name="main")
    task_workers = 4
    task = CoopCodeTask(num_turns=2, max_workers=task_workers)
    env = DialogueEnv(task, split="all")

    real = sandbox.run_tests
    lock, active, calls, peak = threading.Lock(), [0], [0], [0]
    first_two = threading.Barrier(2, timeout=30)  # breaks unless two sandboxes run at once

    def counting(*args, **kwargs):
        with lock:
            active[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], active[0])
            waits = calls[0] <= 2
        try:
            if waits:
                first_two.wait()
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(sandbox, "run_tests", counting)
    start = time.perf_counter()
    [root] = grow_trees(env, {"aux": aux_policy, "main": main_policy}, [ADD], num_samples=3, num_turns=2, joint_mode="cross")
    elapsed = time.perf_counter() - start
    monkeypatch.setattr(sandbox, "run_tests", real)

    nodes = list(root.nodes())
    assert len(nodes) == 10 and sum(len(n.rewards) for n in nodes) == 90
    assert calls[0] == 6 + 9 * 3 and 2 <= peak[0] <= task_workers
    print(f"\ntree: 90 branches, 33 sandboxes, at most {peak[0]} at once, {elapsed:.1f}s")

    # one by one, through the task's single reward (each distinct joint answer once)
    single: dict[tuple[int, str, str], float] = {}
    for node in nodes:
        for combo, reward, details in zip(node.joint, node.rewards, node.details):
            actions = {"aux": node.completions["aux"][combo[0]].text, "main": node.completions["main"][combo[1]].text}
            key = (node.turn, actions["aux"], actions["main"])
            if key not in single:
                single[key] = task.reward(add_item, actions, ())[0]
            assert reward == single[key]
            assert details["score"] == pytest.approx(reward + 4.0)
    assert root.rewards[0] == 0.0  # AUX x COOP: full score
    assert len(single) == 18


# --- multi-turn feedback -----------------------------------------------------------------------


def _second_turn(feedback, aux, main):
    env = DialogueEnv(CoopCodeTask(num_turns=2, feedback=feedback), split="all")
    env.reset(options={"index": ADD})
    observations, rewards, terminations, _, infos = env.step({"aux": aux, "main": main})
    assert not any(terminations.values())
    return observations, infos


def test_full_feedback():
    obs, infos = _second_turn("full", AUX, HALF)
    assert infos["aux"]["reward_details"]["tests_passed"] == 3
    for agent in ("aux", "main"):
        text = obs[agent]
        assert "Turn 2 of 2" in text and "def add(x: int, y: int):" in text
        assert "- functions: `aux` defined with a return; `add` defined with a return." in text
        assert "- syntax: ok." in text and "- tests: 3 of 6 passed." in text
        assert "- first failing test: assert candidate(5, 7) == 12\n  error: AssertionError: candidate returned 0" in text
        assert "- cooperation: `add` does not call `aux`." in text
        assert f"```python\n{AUX.rstrip()}\n```" in text and f"```python\n{HALF.rstrip()}\n```" in text
    assert "Your previous helper function `aux`" in obs["aux"] and "Your partner's function `add`" in obs["aux"]
    assert obs["main"].endswith("in a ```python code block.") and "do not define `aux` yourself" in obs["main"]

    obs, _ = _second_turn("full", "nothing", SYNTAX)
    assert "- functions: `aux` missing; `add` defined with a return." in obs["main"]
    assert re.search(r"- syntax: syntax error in your code at line 2, column \d+: invalid syntax\.", obs["main"])
    assert re.search(r"- syntax: syntax error in your partner's code at line 2, column \d+", obs["aux"])
    assert "- tests: not run (fix the above first)." in obs["main"] and "(no function found in the answer)" in obs["main"]

    obs, _ = _second_turn("full", AUX, IGNORED)
    assert "- tests: 6 of 6 passed." in obs["aux"] and "first failing" not in obs["aux"]
    assert "- cooperation: `add` calls `aux` but ignores a result." in obs["aux"]


def test_passfail_and_plain_feedback():
    obs, _ = _second_turn("passfail", AUX, HALF)
    assert "Result: the tests did not all pass." in obs["aux"] and "Diagnostics" not in obs["aux"]
    obs, _ = _second_turn("passfail", AUX, COOP)
    assert "Result: all tests passed." in obs["main"]
    obs, _ = _second_turn("plain", AUX, HALF)
    for text in obs.values():
        assert "Result:" not in text and "Diagnostics" not in text and "Revise your code." in text
    with pytest.raises(ValueError):
        CoopCodeTask(feedback="loud")


def test_transition_reuses_the_reward_details(add_item, monkeypatch):
    task = CoopCodeTask(num_turns=2)
    [details] = score_answers([(add_item, AUX, HALF)])

    def forbidden(*args, **kwargs):
        raise AssertionError("the transition must not run code")

    monkeypatch.setattr(sandbox, "run_tests", forbidden)
    monkeypatch.setattr(sandbox, "run_program", forbidden)
    turn = Turn({"aux": "", "main": ""}, {"aux": AUX, "main": HALF}, details["score"] - 4, details)
    obs = task.transition(add_item, {"aux": AUX, "main": HALF}, (turn,))
    assert "- tests: 3 of 6 passed." in obs["main"]


# --- eval hooks, registry, PettingZoo -------------------------------------------------------------


def test_eval_hooks(problems):
    items = [problems[ADD], problems[23]]  # add, strlen
    strlen = "def strlen(string: str) -> int:\n    return len(string)\n"
    completions = [
        [[AUX, AUX], [AUX, "def aux(s):\n    return len(s)\n"]],  # aux: item, turn
        [[SYNTAX, COOP], [strlen, "def strlen(string: str) -> int:\n    n = aux(string)\n    return n\n"]],
    ]
    per_item = eval_logger(agent_completions_turns=completions, batch_items=items, prompts=[i["prompt"] for i in items])
    assert per_item[0]["turn_1/syntax_valid"] == 0.0 and per_item[0]["turn_2/passed"] == 1.0
    assert per_item[1]["turn_1/passed"] == 1.0 and per_item[1]["turn_1/cooperation"] == 0.0
    assert per_item[1]["turn_2/cooperation"] == 1.0 and per_item[1]["turn_2/score"] == 4.0
    aggregated = eval_aggregator(per_item, num_turns=2)
    assert aggregated == {
        "turn_1/pass_rate": 0.5, "turn_1/syntax_valid_rate": 0.5, "turn_1/tests_passed": 0.5,
        "turn_1/timeout_rate": 0.0, "turn_1/cooperation_rate": 0.0,
        "turn_2/pass_rate": 1.0, "turn_2/syntax_valid_rate": 1.0, "turn_2/tests_passed": 1.0,
        "turn_2/timeout_rate": 0.0, "turn_2/cooperation_rate": 1.0,
    }
    # raw HumanEval problems (as the anchor library passes them) work too
    raw = {k: problems[23][k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
    assert eval_logger(agent_completions_turns=[[[AUX]], [[strlen]]], batch_items=[raw])[0]["turn_1/passed"] == 1.0


def test_registered_ids_and_parallel_api():
    from llm_marl.envs.registry import make

    env = make("CoopCodeMultiTurn-v0", split="eval", feedback="passfail")
    assert env.task.num_turns == 2 and env.task.feedback == "passfail" and len(env.data) == 32
    assert make("CoopCode-v0").task.num_turns == 1
    assert make("CoopCode-v0", max_cycles=3).task.num_turns == 3  # PettingZoo's name for it
    assert make("CoopCode-v0", max_cycles=3, num_turns=2).task.num_turns == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(DialogueEnv(CoopCodeTask(num_turns=2), split="eval"), num_cycles=3)
