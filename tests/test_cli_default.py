"""The embedded default runs of `llm-marl train` and small CLI behaviours around them: which
default a command line gets, what it announces, the system prompt flag, and --num_turns against
a fixed-length factory. Nothing here loads SmolLM2 (the main job's model)."""

from __future__ import annotations

import os

import pytest

from llm_marl import cli
from llm_marl.cli import DEFAULT_RUN, DEFAULT_TEAM_RUN, MAIN_RUN, main, parser


def _options(*flags: str) -> dict:
    argv = ["train", *flags]
    options, _ = cli._run_options(parser(argv).parse_args(argv), use_default=True)
    return options


def test_no_arguments_is_the_main_job_and_tiny_keeps_the_tiny_run():
    main_job = _options()
    assert main_job["model"] == "smollm2-135m" and main_job["lora_r"] == 8 and main_job["env"] == MAIN_RUN["env"]
    assert main_job["system_prompt"] == MAIN_RUN["system_prompt"] and main_job["rollout_log_steps"] == 1
    assert _options("--model", "HuggingFaceTB/SmolLM2-135M-Instruct")["env"] == MAIN_RUN["env"]
    tiny = _options("--model", "tiny")
    assert {k: tiny[k] for k in DEFAULT_RUN if k != "model"} == {k: v for k, v in DEFAULT_RUN.items() if k != "model"}
    assert tiny.get("lora_r") is None and "system_prompt" not in tiny
    team = _options("--model", "tiny", "--lora_r", "8")
    assert all(team[k] == v for k, v in DEFAULT_TEAM_RUN.items())
    assert _options("--lora_r", "4", "--agent_learning_rate", "2e-3")["agent_learning_rate"] == 2e-3  # flags win
    assert _options("--system-prompt", "Be brief.")["system_prompt"] == "Be brief."


def _announcement(monkeypatch, capsys, tmp_path, *flags: str) -> str:
    def stop(options, explicit=None):
        raise cli.UsageError("stopped before building")

    monkeypatch.setattr(cli, "build_trainer", stop)
    assert main(["train", *flags, "--output_dir", str(tmp_path / "run")] if flags else ["train"]) == 2
    return capsys.readouterr().out


def test_the_default_run_says_no_arguments_only_when_there_were_none(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    said = _announcement(monkeypatch, capsys, tmp_path)
    assert "llm-marl: no arguments, running the embedded default (LoRA adapters of smollm2-135m, MAGRPO" in said
    said = _announcement(monkeypatch, capsys, tmp_path, "--model", "tiny", "--max_steps", "1")
    assert "no arguments" not in said
    assert "llm-marl: no --env or --config, running the embedded default (two tiny local LMs" in said


def test_num_turns_equal_to_a_fixed_length_factorys_horizon_is_accepted(tmp_path, capsys, monkeypatch):
    from llm_marl.envs import registry

    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the entry point registers itself: not for later tests
    out = tmp_path / "r"
    assert main(["train", "--env", "cli_envs:make_sum_target", "--num_turns", "1", "--max_steps", "1", "--output_dir", str(out)]) == 0
    assert (out / "summary.json").is_file()
    assert main(["train", "--env", "cli_envs:make_sum_target", "--num_turns", "3", "--output_dir", str(tmp_path / "s")]) == 2
    assert "--num_turns 3: the factory of env cli_envs:make_sum_target does not take num_turns" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_team_from_the_cli_gets_the_chat_template_and_system_prompt(tmp_path, monkeypatch):
    """--model FOLDER --lora_r on a tokenizer with a chat template (the tiny ChatML Llama)."""
    pytest.importorskip("peft")
    from tiny_chat_model import chat_tokenizer, tiny_llama

    tokenizer = chat_tokenizer()
    folder = tmp_path / "tiny-chat"
    tiny_llama(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    options = {
        **MAIN_RUN, "model": str(folder), "lora_target_modules": ["q_proj", "v_proj"], "lora_r": 2,
        "max_new_tokens": 3, "system_prompt": "Answer in one word.", "output_dir": str(tmp_path / "run"),
    }
    trainer = cli.build_trainer(options)
    for agent in ("player_1", "player_2"):
        policy = trainer.policies[agent]
        assert policy.uses_chat_template and policy.system_prompt == "Answer in one word."
        [prompt] = policy.encode_prompts(["Name one fruit."])
        assert tokenizer.decode(prompt).startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")


def test_the_summary_shows_each_eval_prompt_with_its_answers_before_and_after():
    summary = {
        "batches": 30, "optimizer_steps": 30, "seconds": 300.0,
        "eval_before": {"eval/turn_1/reward_mean": 0.02}, "eval_after": {"eval/turn_1/reward_mean": 0.21},
        "sample_prompts": ["Which fruit comes to mind first?"],
        "samples_before": [{"player_1": "The fruit I'd choose would be the banana", "player_2": "Mango."}],
        "samples_after": [{"player_1": "Apple.", "player_2": "Apple."}],
    }
    lines = cli.format_summary(summary).splitlines()
    assert "eval/turn_1/reward_mean      0.0200      0.2100" in lines
    at = lines.index("eval item 0: 'Which fruit comes to mind first?'")
    assert lines[at + 1 : at + 5] == [
        "  before player_1: \"The fruit I'd choose would be the banana\"",
        "  before player_2: 'Mango.'",
        "  after  player_1: 'Apple.'",
        "  after  player_2: 'Apple.'",
    ]


def test_the_summary_lists_turns_in_number_order():
    turns = {f"eval/turn_{k}/reward_mean": 0.1 * k for k in (10, 2, 1, 11)}
    summary = {"batches": 1, "optimizer_steps": 1, "seconds": 1.0, "eval_before": turns, "eval_after": turns}
    listed = [line.split()[0] for line in cli.format_summary(summary).splitlines() if line.startswith("eval/")]
    assert listed == [f"eval/turn_{k}/reward_mean" for k in (1, 2, 10, 11)]


@pytest.mark.parametrize("flags", [["--model", "smolm2-135m"], ["--model", "smollm2-135M", "--lora_r", "4"], ["--model", "tiyn"]])
def test_a_misspelt_model_name_is_refused_at_once_with_the_name_it_meant(tmp_path, capsys, flags):
    assert main(["train", *flags, "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such folder or named model; did you mean" in err[0]
    assert ("tiny" if "tiyn" in flags else "smollm2-135m") in err[0]
    assert not (tmp_path / "r").exists()
