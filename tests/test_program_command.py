"""``llm-marl train --program FILE.py:FUNCTION`` and examples/program_team.py (issue 45), on the
tiny model given a chat template (a program's calls are lists of messages)."""

from __future__ import annotations

import base64
import gzip
import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

from llm_marl import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import program_team  # noqa: E402


@pytest.fixture(scope="module")
def tiny_chat_dir(tmp_path_factory):
    from llm_marl.policies.tiny import load_tiny

    model, tokenizer = load_tiny()
    tokenizer.chat_template = program_team.SIMPLE_TEMPLATE
    path = tmp_path_factory.mktemp("tiny_chat")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def scratch_registry(monkeypatch):
    """The id --program registers vanishes afterwards (other tests list the registry)."""
    import pettingzoo

    from llm_marl.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = set(getattr(pettingzoo, "parallel_registry", {}))
    yield
    for env_id in set(getattr(pettingzoo, "parallel_registry", {})) - before:
        del pettingzoo.parallel_registry[env_id]


def test_train_program_from_the_command_with_agents_and_items_from_flags(tiny_chat_dir, tmp_path, monkeypatch, capsys, scratch_registry):
    monkeypatch.chdir(ROOT)
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps({"topic": t}) for t in ("the sea", "a ship")) + "\n")
    out = tmp_path / "run"
    code = cli.main(["train", "--program", "examples/program_team.py:team", "--agents", "writer,editor", "--items", str(items),
                     "--policy", "lm", "--model", tiny_chat_dir, "--learner", "magrpo", "--num_turns", "2", "--num_generations", "2",
                     "--max_steps", "1", "--max_new_tokens", "4", "--threads", "1", "--output_dir", str(out), "--progress_bar", "false"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "1 optimizer step" in printed and "rollout trees recorded" in printed
    trees = [json.loads(line) for path in (out / "rollouts").iterdir() for line in path.read_text().splitlines() if line.strip()]
    assert trees and "Write a short sentence about" in json.dumps(trees[0])

    assert cli.main(["view", str(out)]) == 0  # the run opens in the viewer: its page holds the program's calls and details
    page = (out / "viewer.html").read_text()
    blocks = re.findall(r'<script type="application/x-ndjson" id="rollouts-\d+">\n(.*?)\n</script>', page, re.S)
    blocks += [gzip.decompress(base64.b64decode(data)).decode()
               for data in re.findall(r'<script type="application/octet-stream" data-encoding="gzip\+base64" id="rollouts-\d+">([^<]*)</script>', page)]
    shown = [json.loads(line) for block in blocks for line in block.splitlines() if line.strip()]
    assert sorted(map(json.dumps, shown)) == sorted(map(json.dumps, trees))
    assert all(word in json.dumps(shown) for word in ("Write a short sentence about", "Shorten this sentence about ", '"draft"', '"edited"'))


def test_program_flag_errors_name_the_flag(capsys, scratch_registry):
    assert cli.main(["train", "--program", "examples/program_team.py", "--policy", "lm"]) == 2
    assert "--program examples/program_team.py: name a function as FILE.py:FUNCTION" in capsys.readouterr().err
    assert cli.main(["train", "--program", "examples/program_team.py:team", "--env", "ClimbingGame-v0"]) == 2
    assert "--program examples/program_team.py:team and --env ClimbingGame-v0: give one of them" in capsys.readouterr().err


def test_the_example_trains_in_python_for_a_step():
    result = program_team.main(max_steps=1)
    assert result["optimizer_steps"] == 1
    assert set(result["before"]) == set(result["after"]) and any("reward" in name for name in result["after"])


def test_the_agents_sdk_example_is_one_step_per_sdk_agent_and_trains_for_a_step():
    pytest.importorskip("agents", reason="the extra agents_sdk (openai-agents) is not installed")
    import program_agents_sdk

    from llm_marl.envs import ProgramEnv

    env = ProgramEnv(program_agents_sdk.team, program_agents_sdk.agents, program_agents_sdk.items)
    observations, _ = env.reset(options={"index": 0})
    assert env.acting_agents == ["writer"]
    assert observations["writer"] == [{"role": "system", "content": "Write a short sentence about the topic."}, {"role": "user", "content": "Topic: the sea"}]
    observations, *_ = env.step({"writer": "The sea is wide."})
    assert env.acting_agents == ["editor"] and observations["editor"][1] == {"role": "user", "content": "Shorten this sentence about the sea: The sea is wide."}
    _, rewards, terminations, _, infos = env.step({"editor": "The sea."})
    assert rewards["writer"] == pytest.approx(program_agents_sdk.score("the sea", "The sea.")) and all(terminations.values())
    assert infos["editor"]["reward_details"] == {"draft": "The sea is wide.", "edited": "The sea."}
    env.close()
    assert program_agents_sdk.main(max_steps=1)["optimizer_steps"] == 1


def test_a_modules_eval_items_are_the_eval_split_of_the_command_and_of_the_env_it_makes(tmp_path, scratch_registry):
    from llm_marl.assembly import make_env
    from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.policies.scripted import ScriptedPolicy
    from llm_marl.programs.loading import program_env_id

    policies = {a: ScriptedPolicy(lambda o, k: ["x"] * k) for a in ("writer", "editor")}
    args = MAGRPOConfig(num_turns=2, num_generations=2, eval_num_samples=2, progress_bar=False, output_dir=str(tmp_path))

    module = tmp_path / "scored.py"  # the command: the module's eval_items are the eval split
    module.write_text("agents = ('writer', 'editor')\nnum_turns = 2\nitems = [{'n': 1}]\neval_items = [{'n': 4}, {'n': 6}]\n"
                      "def team(item, client):\n"
                      "    client.chat.completions.create(model='writer', messages=[{'role': 'user', 'content': 'go'}])\n"
                      "    client.chat.completions.create(model='editor', messages=[{'role': 'user', 'content': 'go'}])\n"
                      "    return float(item['n'])\n")
    env_id = program_env_id(f"{module}:team")
    split = make_env(env_id, "eval", None)
    assert [dict(row) for row in split.data] == [{"n": 4}, {"n": 6}]
    trained = make_env(env_id, None, None)
    trainer = MAGRPOTrainer(env=trained, policies=policies, args=args)  # make("Program-v0"/id) in Python: eval_items ride along
    assert trainer.evaluate()["eval/turn_2/expected_return"] == 5.0
    for each in (split, trained, trainer.eval_env):
        each.close()
