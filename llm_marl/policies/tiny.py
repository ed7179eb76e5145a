"""Small local language models with no download: a byte-level BPE tokenizer and a tiny GPT-2.

``build_tiny_model(dir)`` trains a tokenizer on an English corpus (by default the prose of
Python's own documentation, :func:`llm_marl.tasks.writing.corpus.pydoc_paragraphs`), builds a small
GPT-2 from a seed, warm-starts it with a short causal-LM pre-training on the same corpus and saves
both with ``save_pretrained``. Users load it back exactly like a hub model::

    path = build_tiny_model("runs/tiny")          # or: model, tok = load_tiny()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

so tests and examples exercise the real loading code path.

Design notes
------------
* End of text and padding: the tokenizer has a single special token, ``<|endoftext|>`` (id 0),
  which is its eos, bos, unk and **pad** token, as in GPT-2. Because eos == pad, padding cannot be
  recognised by its id: the pre-training masks labels with the attention mask, and the attention
  mask covers each passage's first (real) eos, so the model learns to stop. Policies likewise
  find an answer's end by its first eos, never by the pad id.
* Dropout is 0 in the config, so sampling (eval mode) and scoring (train mode) see the same
  distribution.
* Everything is deterministic: the tokenizer trainer, the weight initialisation (``seed``) and the
  pre-training (a fixed number of steps, batches drawn from a seeded generator; the caller's
  global RNG is left untouched). Same settings + corpus + torch build + thread count → identical
  weights (other hardware or thread counts may round float reductions differently). The budget
  is a number of steps, not seconds, for that reason.
* Cache: ``output_dir`` receives ``llm_marl_tiny.json`` with the settings and a SHA-256 of the
  corpus; a later call with the same settings and corpus reuses the directory instead of
  rebuilding. Builds happen in a temporary sibling directory and are moved in, under a file lock,
  so concurrent builders (parallel test runs) never see half-written models.
* Prompts should look like corpus text. The model only knows documentation prose: a prompt ending
  in a suffix the corpus never contains (say ``"\\nSummary:"``) makes a large share of first
  answers empty (an immediate eos; about a third in a trial). Write task prompts as plain
  sentences in the corpus' style, e.g. the beginning of a paragraph.

Measured budgets and eos rates: see ``DEFAULT_PRETRAIN_STEPS``. Tests use ~20-40 steps of 8
passages (a few seconds), which already lifts the eos rate from ~3% to ~45% at temperature 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from llm_marl.runs import progress
from llm_marl.tasks.writing.corpus import pydoc_paragraphs

__all__ = [
    "EOS_TOKEN",
    "DEFAULT_PRETRAIN_STEPS",
    "build_tiny_model",
    "default_model_dir",
    "load_tiny",
    "tiny_settings",
]

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
SETTINGS_FILE = "llm_marl_tiny.json"
_FORMAT = 1

#: Default pre-training budget, in optimizer steps of ``batch_size`` passages (~10 epochs of the
#: pydoc corpus). Measured on one shared CPU core (torch 2.13, default shape, 1,000-token BPE,
#: 954 pydoc paragraphs): ~90 s; training loss 6.7 → 3.3. Answers to 6-word paragraph openings,
#: 128 new tokens at most, that end with eos: 98.5% at temperature 0.6 / top-p 0.6 (mean 23
#: tokens), 91% at temperature 1 untruncated; an untrained model: 7% / 13.5%.
DEFAULT_PRETRAIN_STEPS = 600


def _corpus_sha256(corpus: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(corpus), ensure_ascii=False).encode("utf-8")).hexdigest()


def tiny_settings(
    *,
    corpus: Sequence[str] | None = None,
    vocab_size: int = 1000,
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 2,
    n_positions: int = 256,
    seed: int = 0,
    pretrain_steps: int = DEFAULT_PRETRAIN_STEPS,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
) -> dict[str, Any]:
    """The settings that identify a tiny model (what the cache compares), corpus as a hash."""
    corpus = pydoc_paragraphs() if corpus is None else list(corpus)
    if not corpus or not all(isinstance(text, str) for text in corpus):
        raise ValueError("corpus must be a non-empty sequence of strings")
    for name, value in (
        ("vocab_size", vocab_size),
        ("n_layer", n_layer),
        ("n_embd", n_embd),
        ("n_head", n_head),
        ("n_positions", n_positions),
        ("batch_size", batch_size),
    ):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be >= 257 (256 bytes + eos), got {vocab_size}")
    if n_positions < 2:
        raise ValueError(f"n_positions must be >= 2, got {n_positions}")
    if int(pretrain_steps) < 0:
        raise ValueError(f"pretrain_steps must be >= 0, got {pretrain_steps!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    return {
        "format": _FORMAT,
        "architecture": "gpt2",
        "vocab_size": int(vocab_size),
        "n_layer": int(n_layer),
        "n_embd": int(n_embd),
        "n_head": int(n_head),
        "n_positions": int(n_positions),
        "seed": int(seed),
        "pretrain_steps": int(pretrain_steps),
        "batch_size": int(batch_size),
        "learning_rate": float(learning_rate),
        "eos_token": EOS_TOKEN,
        "corpus_sha256": _corpus_sha256(corpus),
        "corpus_size": len(corpus),
    }


def _cache_root() -> Path:
    root = os.environ.get("LLM_MARL_CACHE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llm_marl"


def default_model_dir(*, corpus: Sequence[str] | None = None, **settings: Any) -> Path:
    """Where :func:`load_tiny` keeps a tiny model: ``<cache>/tiny-gpt2-<hash of settings>``.

    ``<cache>`` is ``$LLM_MARL_CACHE`` if set, else ``$XDG_CACHE_HOME/llm_marl`` or
    ``~/.cache/llm_marl``. The hash covers every setting of :func:`tiny_settings` and the corpus,
    so different models never share a directory.
    """
    key = tiny_settings(corpus=corpus, **settings)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return _cache_root() / f"tiny-gpt2-{digest}"


def _read_settings(directory: Path) -> dict[str, Any] | None:
    try:
        with open(directory / SETTINGS_FILE, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _is_built(directory: Path, settings: dict[str, Any]) -> bool:
    saved = _read_settings(directory)
    return saved is not None and saved.get("settings") == settings


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock, builds are still atomic-ish
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_tiny_model(
    output_dir: str | os.PathLike[str],
    *,
    corpus: Sequence[str] | None = None,
    vocab_size: int = 1000,
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 2,
    n_positions: int = 256,
    seed: int = 0,
    pretrain_steps: int = DEFAULT_PRETRAIN_STEPS,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    force: bool = False,
) -> Path:
    """Train a tokenizer, build and warm-start a tiny GPT-2, save both in ``output_dir``.

    Args:
        output_dir: target directory (created; files of the same names are overwritten).
        corpus: the texts, one passage each; default :func:`pydoc_paragraphs`.
        vocab_size: BPE vocabulary size, the eos token and the 256 byte symbols included.
        n_layer, n_embd, n_head, n_positions: GPT-2 shape; ``n_positions`` is the context
            length (prompt + answer) the model can ever see.
        seed: seeds the weight initialisation and the order of pre-training batches.
        pretrain_steps: AdamW steps of causal-LM pre-training on the corpus, ``batch_size``
            passages each (passages longer than the context are truncated). 0 leaves the model
            at its random initialisation. The default (``DEFAULT_PRETRAIN_STEPS``) takes 1-2
            minutes on one CPU core; tests use a handful of steps.
        learning_rate: peak learning rate (linear warm-up over 5% of the steps, cosine decay to
            10% of the peak).
        force: rebuild even if ``output_dir`` holds a model with the same settings.

    Returns:
        ``output_dir`` as a :class:`~pathlib.Path`, loadable with
        ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``.
    """
    corpus = pydoc_paragraphs() if corpus is None else list(corpus)
    settings = tiny_settings(
        corpus=corpus,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        seed=seed,
        pretrain_steps=pretrain_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
    )
    out = Path(output_dir).expanduser()
    if not force and _is_built(out, settings):
        return out
    with _file_lock(out.parent / f".{out.name}.lock"):
        if not force and _is_built(out, settings):  # built by a concurrent caller meanwhile
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
        try:
            _build(tmp, corpus, settings)
            out.mkdir(parents=True, exist_ok=True)
            (out / SETTINGS_FILE).unlink(missing_ok=True)  # no valid marker while files move
            for item in sorted(tmp.iterdir(), key=lambda p: p.name == SETTINGS_FILE):
                os.replace(item, out / item.name)  # the settings file goes last
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _train_tokenizer(corpus: Sequence[str], vocab_size: int, n_positions: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,  # eos doubles as pad, as in GPT-2; see the module docstring
        model_max_length=n_positions,
        padding_side="left",  # what generation wants; CausalLMPolicy pads by itself anyway
    )


def _passages(tokenizer, corpus: Sequence[str], n_positions: int, eos_id: int) -> list[list[int]]:
    """Token ids of each passage followed by eos; too long passages are cut (and lose the eos)."""
    encoded = tokenizer(list(corpus), add_special_tokens=False, verbose=False)["input_ids"]
    return [(ids + [eos_id])[:n_positions] for ids in encoded if ids]


def _batches(
    passages: list[list[int]], batch_size: int, generator: torch.Generator
) -> Iterator[list[list[int]]]:
    """Endless seeded batches; passages of similar length are batched together (less padding)."""
    pool = batch_size * 16
    while True:
        order = torch.randperm(len(passages), generator=generator).tolist()
        batches: list[list[int]] = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: len(passages[i]))
            batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        for b in torch.randperm(len(batches), generator=generator).tolist():
            yield [passages[i] for i in batches[b]]


def _collate(batch: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids; labels = ids where attended (the first eos included), -100 on padding."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _build(directory: Path, corpus: Sequence[str], settings: dict[str, Any]) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    started = time.perf_counter()
    if progress.enabled() and settings["pretrain_steps"]:
        print(
            f"llm-marl: building the tiny model once (a tokenizer, then {settings['pretrain_steps']} pre-training steps; "
            "about a minute on a quiet 2-core CPU); later runs load it from the cache",
            file=sys.stderr,
            flush=True,
        )
    tokenizer = _train_tokenizer(corpus, settings["vocab_size"], settings["n_positions"])
    eos_id = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=settings["n_positions"],
        n_embd=settings["n_embd"],
        n_layer=settings["n_layer"],
        n_head=settings["n_head"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(settings["seed"])
        model = GPT2LMHeadModel(config)
    # GPT2LMHeadModel's class name names no loss, so transformers would warn "loss_type=None ...
    # unrecognized" and fall back to this same causal-LM loss: name it (not saved with the model).
    model.loss_type = "ForCausalLM"
    stats = _pretrain(model, tokenizer, corpus, settings)
    model.eval()
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    import transformers

    record = {
        "settings": settings,
        "stats": {
            **stats,
            "build_seconds": round(time.perf_counter() - started, 2),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    with open(directory / SETTINGS_FILE, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)


def _pretrain(model, tokenizer, corpus, settings) -> dict[str, Any]:
    steps = settings["pretrain_steps"]
    if steps == 0:
        return {"pretrain_seconds": 0.0}
    eos_id = tokenizer.eos_token_id
    passages = _passages(tokenizer, corpus, settings["n_positions"], eos_id)
    if not passages:
        raise ValueError("the corpus tokenizes to nothing")
    generator = torch.Generator().manual_seed(settings["seed"])
    batches = _batches(passages, settings["batch_size"], generator)
    peak = settings["learning_rate"]
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))

    optimizer = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.01)
    model.train()
    started = time.perf_counter()
    losses: list[float] = []
    shown = progress.bar(steps, "building the tiny model", "step")
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(**_collate(next(batches), eos_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        shown.update(1)
        if (step + 1) % 100 == 0:
            logger.info("tiny model pre-training step %d/%d loss %.3f", step + 1, steps, loss.item())
    shown.close()
    window = max(1, min(20, steps // 5))
    return {
        "pretrain_seconds": round(time.perf_counter() - started, 2),
        "loss_first": round(sum(losses[:window]) / window, 4),
        "loss_last": round(sum(losses[-window:]) / window, 4),
    }


def load_tiny(
    output_dir: str | os.PathLike[str] | None = None,
    *,
    corpus: Sequence[str] | None = None,
    **settings: Any,
):
    """``(model, tokenizer)`` of a tiny model, building it first if it is not cached.

    ``output_dir`` defaults to :func:`default_model_dir` for these settings. The model and the
    tokenizer are loaded with ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained``, like any hub model. ``settings`` are those of
    :func:`build_tiny_model`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if output_dir is None:
        key = {name: value for name, value in settings.items() if name != "force"}
        output_dir = default_model_dir(corpus=corpus, **key)
    path = build_tiny_model(output_dir, corpus=corpus, **settings)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
