"""benchmarks/gpu_check.py without a GPU: its dry run (the CPU-side preparation CI can do) and the
checks that make a prepared GPU run fail early instead of on the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})


def test_the_dry_run_checks_the_whole_plan_and_runs_nothing(tmp_path):
    done = run("--dry-run", "--out", str(tmp_path / "report"), "--work", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for step in ("machine", "prepare", "tests", "magrpo-full-fp32", "magrpo-full-bf16", "magrpo-team-fp32", "magrpo-team-bf16",
                 "main-job", "torchrun", "torchrun-fsdp", "throughput"):
        assert f". {step} (timeout" in out, step
    assert "LLM_MARL_TEST_DEVICE=cuda" in out and "tests/test_devices.py::test_a_policy_samples_and_scores_on_its_device" in out
    assert "tests/test_option_matrix.py::test_cell\n" in out + "\n" and "test_cell_full_set" not in out  # slow cells stay out
    assert "--nproc_per_node 1" in out and "--fsdp true --resume" in out and "--device cuda" in out
    assert "nothing run" in out
    assert not (tmp_path / "report").exists() and not (tmp_path / "work").exists()


def test_bad_arguments_are_one_line_each_and_exit_2(tmp_path):
    done = run("--dry-run", "--device", "gpu", "--only", "magrpo", "--steps", "1", "--out", str(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "gpu_check: --device 'gpu': expected cuda, cuda:N or cpu",
        "gpu_check: --steps 1: must be >= 2 (one step, a stop, then a resume)",
        "gpu_check: --only magrpo: no such step (steps: machine, prepare, tests, magrpo-full-fp32, magrpo-full-bf16, "
        "magrpo-team-fp32, magrpo-team-bf16, main-job, torchrun, torchrun-fsdp, throughput)",
    ]


def test_a_flag_llm_marl_train_lacks_is_named_with_its_step(gpu_check):
    steps = gpu_check.plan(gpu_check.parse(["--only", "torchrun"]))
    assert [s.name for s in steps] == ["prepare", "torchrun"]  # the model comes from prepare
    help_text = "usage: llm-marl train\n" + "\n".join(f"  {flag} X" for flag in gpu_check.TORCHRUN_FLAGS)
    assert gpu_check.check_flags(steps, help_text) == []
    without = help_text.replace("  --agent_devices X", "")
    assert gpu_check.check_flags(steps, without) == ["step torchrun: llm-marl train has no flag --agent_devices (not in llm-marl train --help)"] * 2


def test_tests_are_found_by_their_device_mark_and_missing_ones_are_named(gpu_check, tmp_path, monkeypatch):
    source = tmp_path / "tests" / "test_x.py"
    source.parent.mkdir()
    source.write_text("import pytest\n\n@pytest.mark.device\ndef test_a(device): pass\n\n@pytest.mark.slow\n@pytest.mark.device\n"
                      "@pytest.mark.parametrize('x', [1])\ndef test_b(x, device): pass\n\ndef test_c(): pass\n")
    assert gpu_check.device_tests(source) == ["test_a"]
    assert gpu_check.device_tests(source, slow=True) == ["test_a", "test_b"]
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    step = gpu_check.Step("tests", "", ["python"], 1, files=["tests/test_x.py::test_a", "tests/test_x.py::test_c", "tests/gone.py"])
    assert gpu_check.check_files([step]) == ["step tests: tests/test_x.py has no device-marked test test_c",
                                             "step tests: tests/gone.py does not exist"]


def test_the_report_names_every_failure_and_keeps_the_numbers(gpu_check, tmp_path):
    report = {"started": "2026-12-03 07:00:00 UTC", "device": "cuda", "model": "smollm2-135m", "model_used": "SmolLM2-135M shape",
              "seconds": 100.0, "counts": {"passed": 1, "failed": 1}, "machine": {"gpu": "NVIDIA H200"},
              "steps": [{"name": "magrpo-full-bf16", "what": "two full agents", "status": "passed", "seconds": 40,
                         "result": {"finite": True, "max_sampler_gap": 0.0041234, "gap_threshold": 0.15, "resume_equal": True,
                                    "resume_max_diff": 0.0, "peak_gpu_mib": 2100, "seconds_per_step": 3.1, "weights_moved": 2.0027e-05}},
                        {"name": "torchrun-fsdp", "what": "fsdp", "status": "failed", "seconds": 9, "command": "torchrun ...",
                         "error": "exit 2: fsdp=True needs a torchrun process group of 2+ ranks", "output_tail": "Traceback"}]}
    text = gpu_check.markdown(report)
    assert "- gpu: NVIDIA H200" in text
    assert "| magrpo-full-bf16 | True | 0.00412 (0.15) | 2e-05 | True | 0 | 2100 | 3.1 |" in text
    assert "| torchrun-fsdp | failed | 9 | fsdp | exit 2: fsdp=True needs a torchrun process group of 2+ ranks |" in text
    assert "### torchrun-fsdp: failed" in text
    json.dumps(report)


def test_a_failed_torchrun_step_reports_llm_marls_own_error_line(gpu_check):
    output = ("llm-marl: player_1: model m\nllm-marl: error: fsdp=True needs a torchrun process group (...)\nTraceback (most recent call last):\n"
              "  File \"run.py\", line 1\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n=====\n  exitcode  : 2\n")
    assert gpu_check.last_error(output) == "llm-marl: error: fsdp=True needs a torchrun process group (...)"
    assert gpu_check.last_error("x\nRuntimeError: CUDA error: out of memory\nmore") == "RuntimeError: CUDA error: out of memory"
