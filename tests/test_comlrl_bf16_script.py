"""A CoMLRL-shaped script whose model config asks for ``torch_dtype: bfloat16`` trains and
evaluates on a CPU without oneDNN's bf16 kernels (issue 32: on an AVX2-only EPYC its first
evaluation crashed in ``policies/packed_weights.py`` with ``KeyError: 'forward'``).

``tests/comlrl_bf16_script/`` is migrated with the README's ``sed`` line and run in a subprocess
on a tiny local model (GPT-2: its lm head is the one ``nn.Linear`` that packs). The CPU is made
one without bf16 kernels twice over: ``ONEDNN_MAX_CPU_ISA=AVX2`` makes oneDNN itself refuse bf16
on an x86 CPU that has them (the real refusal, as on an AVX2-only machine), and
``llm_marl.cpu.bf16_support`` is faked to say no, so the fallback runs on any CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT_DIR = Path(__file__).parent / "comlrl_bf16_script"

FAKED = (
    "import sys, runpy, llm_marl.cpu as cpu;"
    "cpu.bf16_support = lambda: cpu.Bf16Support(False, 'faked by the test: no avx512bw, avx512vl, avx512dq or avx_ne_convert');"
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


def readme_sed_line() -> str:
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "llm_marl.comlrl" in line and "sed -i" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_bf16_config_trains_and_evaluates_without_bf16_kernels(tiny_model, tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(SCRIPT_DIR, work)
    subprocess.run(["bash", "-c", readme_sed_line()], cwd=work, check=True)
    assert "from llm_marl.comlrl.trainers.reinforce import" in (work / "train_magrpo.py").read_text()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "default",
    }
    proc = subprocess.run(
        [sys.executable, "-c", FAKED, "train_magrpo.py", "--config", "config.yaml", "--override", f"model.name={tiny_model}"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "KeyError" not in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["dtypes"] == ["torch.bfloat16"]  # the request kept its meaning: bf16 weights
    for evaluation in (result["before"], result["after"]):
        assert evaluation["eval/turn_1/reward_mean"] >= 0.0
    lines = [line for line in proc.stderr.splitlines() if "CPUWarning" in line]
    assert len(lines) == 1, proc.stderr[-3000:]  # said once, in one line, naming why
    assert "without oneDNN's bf16 kernels (faked by the test: no avx512bw" in lines[0]
