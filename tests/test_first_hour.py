"""What a new user meets in the first hour (issue 35): the listing commands start without torch,
the help reads as plain text, and the README agrees with what the command prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _run_cli(args: list[str], cwd: Path | None = None) -> tuple[int, str, list[str]]:
    """Run ``llm-marl ARGS`` in a fresh interpreter; (exit status, output, heavy modules it imported)."""
    probe = (
        "import sys\n"
        "from llm_marl.cli import main\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    code = exc.code or 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'peft') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
        "sys.exit(code)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    out = done.stdout + done.stderr
    heavy = re.search(r"^HEAVY=(.*)$", done.stdout, re.M)
    assert heavy, out
    return done.returncode, out, [m for m in heavy.group(1).split(",") if m]


@pytest.mark.parametrize("args", [["--help"], ["list"], ["models"]], ids=["help", "list", "models"])
def test_listing_commands_do_not_import_torch(args, tmp_path):
    code, out, heavy = _run_cli(args, cwd=tmp_path)
    assert code == 0, out
    assert "torch" not in heavy and "transformers" not in heavy, f"llm-marl {' '.join(args)} imported {heavy}"
    assert "datasets" not in heavy, f"llm-marl {' '.join(args)} imported {heavy}"


def test_help_is_plain_text_and_names_the_first_commands(tmp_path):
    code, out, _ = _run_cli(["--help"], cwd=tmp_path)
    assert code == 0
    assert "``" not in out and not re.search(r":(class|func|mod|data|meth):`", out), out
    assert "llm-marl train --model tiny" in out and "llm-marl list" in out


def test_train_help_still_lists_the_config_fields(tmp_path):
    code, out, heavy = _run_cli(["train", "--learner", "iac", "--help"], cwd=tmp_path)
    assert code == 0
    assert "--critic_learning_rate" in out and "IACConfig" in out
    assert "``" not in out


def test_models_size_is_the_readmes(tmp_path):
    code, out, _ = _run_cli(["models"], cwd=tmp_path)
    assert code == 0
    [printed] = re.findall(r"(\d+) MB converted", out)
    assert f"{printed} MB converted" in README, f"`llm-marl models` says {printed} MB converted; the README does not"
    assert f"full SmolLM2 model is {printed} MB" in README


def test_readme_names_every_shipped_environment():
    from llm_marl.envs.registry import SHIPPED

    missing = [env_id for env_id in SHIPPED if f"`{env_id}`" not in README]
    assert not missing, f"README's list of environments leaves out {missing}"


def test_saved_folders_use_the_agents_names_and_old_agent_i_folders_still_read(tmp_path):
    from llm_marl.runs.run_dir import agent_folders, saved_agent_folders

    assert agent_folders(["player_1", "player_2"]) == ["player_1", "player_2"]
    assert agent_folders(["agent_0", "agent_1"]) == ["agent_0", "agent_1"]  # the CoMLRL constructor's: dir/agent_{i}
    for unsafe in (["a/b", "c"], ["critic", "x"], ["A", "a"], ["", "b"], ["..", "b"]):
        assert agent_folders(unsafe) == ["agent_0", "agent_1"], unsafe
    for name in ("player_1", "player_2"):
        (tmp_path / "new" / name).mkdir(parents=True)
    for name in ("agent_0", "agent_1"):
        (tmp_path / "old" / name).mkdir(parents=True)
    agents = ["player_1", "player_2"]
    assert saved_agent_folders(str(tmp_path / "new"), agents) == [str(tmp_path / "new" / a) for a in agents]
    assert saved_agent_folders(str(tmp_path / "old"), agents) == [str(tmp_path / "old" / f"agent_{i}") for i in range(2)]
    assert saved_agent_folders(str(tmp_path), agents) is None


def test_the_readmes_first_screen_gives_both_commands_with_their_times_and_the_end_of_the_run():
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "llm-marl train" in first_block and 'python -m pytest -m "not slow" -q' in first_block
    assert "quiet 2-core CPU" in first_block and "3 min 30 s" in first_block and "14 min" in first_block
    assert "before -> after" in first_block and "final/player_1" in first_block


def test_license_changelog_and_contributing_are_there():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "tests/mutants.py" in contributing and "benchmarks/" in contributing and "about 14 minutes" in contributing
