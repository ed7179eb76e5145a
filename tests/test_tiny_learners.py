"""Every learner `llm-marl list` shows runs with `--model tiny` and no other flags (issue 35).

Each family gets its own defaults for the tiny run (``cli.TINY_FAMILY_RUNS``), and no field of
another family leaks in: the preference learners never see the REINFORCE reference-KL fields,
the actor-critic learners never see ``joint_mode``/``advantage_mode``. The first test builds
each learner's config from exactly the options ``--model tiny --learner NAME`` gives; the
second trains each one for one batch through the command, with only counts and lengths cut
down (2 train items, 2 eval items, 8 new tokens) so that ten runs stay within a minute or so.
"""

from __future__ import annotations

import json

import pytest

from llm_marl import assembly, cli
from llm_marl.cli import FOREIGN_FIELDS, LEARNER_FAMILIES, LEARNERS, main, parser



def _tiny_options(learner: str) -> dict:
    argv = ["train", "--model", "tiny", "--learner", learner]
    options, explicit = cli._run_options(parser(argv).parse_args(argv), use_default=True)
    assert explicit == {"model", "learner"}
    return options


def test_every_listed_learner_has_a_family():
    assert set(LEARNER_FAMILIES) == set(LEARNERS)


@pytest.mark.parametrize("learner", list(LEARNERS))
def test_each_learners_tiny_defaults_make_a_valid_config_of_its_own_family(learner):
    options = _tiny_options(learner)
    family = LEARNER_FAMILIES[learner]
    assert options["learner"] == learner and options["model"] == "tiny"
    leaked = [name for name in FOREIGN_FIELDS[family] if name in options]
    assert not leaked, f"{learner}: REINFORCE-only fields in its defaults: {leaked}"
    config_class, _ = cli.learner_classes(learner)
    env = assembly.make_env(options["env"], None, None)
    fields = {name for name in options if name in config_class.__dataclass_fields__}
    args = assembly.make_config(config_class, {k: options[k] for k in fields}, env)  # validates
    assert set(options) - fields <= set(cli.RUN_KEYS), sorted(set(options) - fields - set(cli.RUN_KEYS))
    if family == "preference":
        assert args.reference_kl_enabled is False and args.preference_num_candidates <= 8
    if family == "actor_critic":
        assert args.joint_mode == "aligned" and args.critic_learning_rate == 3e-4
    if learner.endswith("iter"):
        assert args.num_iterations == 2


@pytest.mark.parametrize("learner", list(LEARNERS))
def test_each_learner_trains_with_the_tiny_model_and_no_learner_flags(learner, tmp_path, capsys):
    out = tmp_path / learner
    argv = ["train", "--model", "tiny", "--learner", learner, "--output_dir", str(out),
            "--train_items", "2", "--eval_num_samples", "2", "--max_new_tokens", "8", "--max_steps", "1", "--progress_bar", "false"]
    code = main(argv)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batches"] >= 1 and summary["eval_before"] and summary["eval_after"]
    assert "warning" not in printed.err.lower(), printed.err
