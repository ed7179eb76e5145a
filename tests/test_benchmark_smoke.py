"""Smoke test of benchmarks/throughput.py: the --quick benchmark runs and reports numbers.

Never asserts wall-clock times (they depend on the machine and its load), only that each side
that can run produces positive seconds per item, tokens per second and peak memory, and that the
workload is the one described (exactly the forced number of new tokens per answer).

The CoMLRL side runs only when ``LLM_MARL_COMLRL_PYTHON`` names an interpreter of a virtual
environment with ``comlrl==1.4.3`` installed (e.g. /work/comlrl-venv/bin/python); otherwise that
test is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "throughput.py"


def _load_module():
    spec = importlib.util.spec_from_file_location("llm_marl_bench_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_quick(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "results.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--quick",
        "--model-dir",
        str(tmp_path / "models"),
        "--pretrain-steps",
        "2",
        "--out",
        str(out),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, f"benchmark failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "| config |" in done.stdout  # the markdown table is printed
    return json.loads(out.read_text())


def _check_run(run: dict) -> None:
    assert "error" not in run, run.get("error")
    assert run["config"] == "K2T1-aligned"
    assert run["items"] == 2
    assert run["seconds_per_item"] > 0
    assert run["items_per_second"] > 0
    assert run["tokens_per_second"] > 0
    assert run["peak_rss_mib"] > 0
    assert run["rss_before_train_mib"] > 0
    # 2 items x 1 node x K=2 answers x 2 agents x 24 forced tokens
    assert run["generated_tokens"] == run["expected_tokens"] == 2 * 1 * 2 * 2 * 24
    parts = run["breakdown_seconds"]
    assert parts["gen_forward"] > 0 and parts["backward"] > 0
    assert sum(parts.values()) == pytest.approx(run["train_seconds"], rel=0.05, abs=0.05)


def test_workload_helpers():
    bench = _load_module()
    assert bench.tree_nodes(4, 2, "aligned") == 5
    assert bench.tree_nodes(4, 2, "cross") == 17
    assert bench.tree_nodes(8, 3, "cross") == 4161
    assert [c["name"] for c in bench.expand_configs("quick")] == ["K2T1-aligned"]
    names = [c["name"] for c in bench.expand_configs("targets,K4T2-aligned")]
    assert names == ["K4T2-aligned", "K4T2-cross", "large-K4T2-aligned"]
    large = bench.parse_config("large-K4T2-aligned")
    assert large["large"] and large["k"] == 4 and large["turns"] == 2 and large["mode"] == "aligned"
    grid = {c["name"] for c in bench.expand_configs("grid")}
    assert {f"K{k}T{t}-aligned" for k in (2, 4, 8) for t in (1, 2, 3)} <= grid
    assert "K4T2-cross" in grid and "K8T3-cross" not in grid
    with pytest.raises(SystemExit):
        bench.parse_config("K4-aligned")
    # the shared task functions are plain Python with the anchor library's signatures
    assert len(bench.bench_reward(["a b c"], ["b c d"])) == 1
    assert bench.bench_reward_any(["a b c"], ["b c d"]) == bench.bench_reward(["a b c"], ["b c d"])
    assert bench.bench_reward_any(["x" * 300]) == [1.0]
    assert bench.tree_nodes(2, 2, "cross", agents=3) == 1 + 8
    texts = bench.bench_transition(
        prompt="one two three", agent_completions=["x y", "z"], num_agents=2,
        prompt_history_per_agent=[[], []], response_history_per_agent=[[], []],
    )
    assert texts == ["one two three z", "one two three x y"]


def test_quick_benchmark_ours(tmp_path):
    results = _run_quick(tmp_path, "--lora-r", "4")
    runs = [r for r in results["runs"] if r["side"] == "ours"]
    assert len(runs) == 1
    _check_run(runs[0])
    assert runs[0]["items_per_step"] == 1
    assert runs[0]["threads"] == 1
    # the same workload with the two agents as LoRA adapters of one base (one sampling call per depth)
    [lora] = [r for r in results["runs"] if r["side"] == "ours-lora"]
    _check_run(lora)
    assert lora["lora_r"] == 4 and "ours LoRA ips=1 s/item" in results["table"]


def test_quick_benchmark_comlrl(tmp_path):
    python = os.environ.get("LLM_MARL_COMLRL_PYTHON")
    if not python or not os.path.exists(python):
        pytest.skip("set LLM_MARL_COMLRL_PYTHON to a python with comlrl==1.4.3 installed to run CoMLRL's side")
    results = _run_quick(tmp_path, "--comlrl-python", python)
    by_side = {r["side"]: r for r in results["runs"]}
    assert set(by_side) == {"ours", "comlrl"}
    for run in by_side.values():
        _check_run(run)
    assert by_side["comlrl"]["versions"]["comlrl"] == "1.4.3"
    assert "speed-up" in results["table"]


def test_set_options_of_the_train_benchmarks_parse_as_json_else_text():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from overrides import parse_sets

    assert parse_sets(["num_train_epochs=1", "model=smollm2-135m", "lora_r=null", "x=[1, 2]"]) == {
        "num_train_epochs": 1, "model": "smollm2-135m", "lora_r": None, "x": [1, 2]}
    with pytest.raises(SystemExit, match="--set 'epochs': expected FIELD=VALUE"):
        parse_sets(["epochs"])
