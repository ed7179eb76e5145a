"""Tiny local language models: corpus, tokenizer, build, cache, determinism, warm start."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llm_marl.policies import tiny
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.tiny import EOS_TOKEN, build_tiny_model, default_model_dir, load_tiny
from llm_marl.tasks.writing.corpus import pydoc_paragraphs

torch.set_num_threads(1)

# A few seconds of pre-training: enough to move the model clearly away from random.
WARM = dict(pretrain_steps=40, batch_size=8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "warm": build_tiny_model(root / "warm", **WARM),
        "cold": build_tiny_model(root / "cold", pretrain_steps=0),
    }


def test_pydoc_paragraphs_are_clean_english_prose():
    paragraphs = pydoc_paragraphs()
    assert 300 <= len(paragraphs) <= 1200
    assert paragraphs == pydoc_paragraphs()  # deterministic
    assert len(set(paragraphs)) == len(paragraphs)
    for text in paragraphs:
        assert "\n" not in text and ">>>" not in text and "::=" not in text
        assert len(text.split()) >= 8 and text[-1] in ".!?\")"
    pydoc_paragraphs().clear()  # callers get their own copy
    assert len(pydoc_paragraphs()) == len(paragraphs)


def test_round_trip_through_auto_classes(built):
    model = AutoModelForCausalLM.from_pretrained(built["warm"])
    tokenizer = AutoTokenizer.from_pretrained(built["warm"])
    assert model.config.model_type == "gpt2"
    assert model.config.vocab_size == len(tokenizer) == 1000
    assert (model.config.n_layer, model.config.n_embd, model.config.n_positions) == (2, 128, 256)
    assert model.config.resid_pdrop == model.config.embd_pdrop == model.config.attn_pdrop == 0
    # eos doubles as pad (and bos/unk), as in GPT-2
    assert tokenizer.eos_token == tokenizer.pad_token == EOS_TOKEN
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == model.config.eos_token_id
    text = 'The "assert" statement raises AssertionError, caf\u00e9 \u2014 ok.'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.eos_token_id not in ids
    assert tokenizer.decode(ids) == text  # byte-level: lossless, no unknown tokens
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == text
    saved = json.loads((built["warm"] / tiny.SETTINGS_FILE).read_text())
    assert saved["settings"]["pretrain_steps"] == WARM["pretrain_steps"]


def test_same_seed_same_weights_and_cache(tmp_path):
    budget = dict(pretrain_steps=3, batch_size=4, vocab_size=300, n_embd=32, n_head=2)
    first = build_tiny_model(tmp_path / "a", seed=7, **budget)
    second = build_tiny_model(tmp_path / "b", seed=7, **budget)
    other = build_tiny_model(tmp_path / "c", seed=8, **budget)
    a, b, c = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (first, second, other))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()

    # Same settings: reused without rebuilding; a changed setting rebuilds in place.
    weights = next(p for p in first.iterdir() if p.suffix == ".safetensors")
    stamp = weights.stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "a", seed=7, **budget) == first
    assert weights.stat().st_mtime_ns == stamp
    build_tiny_model(tmp_path / "a", seed=8, **budget)
    rebuilt = AutoModelForCausalLM.from_pretrained(first).state_dict()
    assert all(torch.equal(rebuilt[k], c[k]) for k in c)
    assert not any(p.name.startswith(".a.building") for p in tmp_path.iterdir())


def test_pretraining_labels_include_the_first_eos_only():
    batch = tiny._collate([[5, 6, 0], [7, 0]], pad_id=0)
    assert batch["labels"].tolist() == [[5, 6, 0], [7, 0, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def _corpus_loss(path, texts):
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    losses = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"][:255] + [tokenizer.eos_token_id]])
            losses.append(model(input_ids=ids, labels=ids).loss.item())
    return sum(losses) / len(losses)


def test_warm_start_lowers_corpus_loss_and_raises_eos_rate(built):
    texts = random.Random(0).sample(pydoc_paragraphs(), 32)
    assert _corpus_loss(built["warm"], texts) < _corpus_loss(built["cold"], texts) - 0.4

    prompts = [" ".join(text.split()[:6]) for text in texts]
    rates = {}
    for name, path in built.items():
        policy = CausalLMPolicy.from_pretrained(
            path, max_new_tokens=48, temperature=1.0, top_p=None, top_k=None
        )
        torch.manual_seed(0)
        answers = [c for group in policy.sample(prompts, 2) for c in group]
        rates[name] = sum(c.token_ids[-1] == policy.eos_token_ids[0] for c in answers) / len(answers)
    # Measured: cold ~0.03, warm (40 steps) ~0.45; 600 steps reach ~0.9.
    assert rates["warm"] >= rates["cold"] + 0.2, rates


def test_default_dir_and_load_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_MARL_CACHE", str(tmp_path / "cache"))
    settings = dict(pretrain_steps=1, batch_size=2, vocab_size=300, n_embd=32, n_head=2)
    path = default_model_dir(**settings)
    assert path.parent == tmp_path / "cache" and path.name.startswith("tiny-gpt2-")
    assert path != default_model_dir(**{**settings, "seed": 1})
    assert path != default_model_dir(corpus=["Another corpus entirely."], **settings)
    model, tokenizer = load_tiny(**settings)
    assert (path / tiny.SETTINGS_FILE).is_file()
    assert model.config.n_embd == 32 and len(tokenizer) == 300


def test_invalid_settings():
    with pytest.raises(ValueError, match="n_head"):
        tiny.tiny_settings(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="corpus"):
        tiny.tiny_settings(corpus=[])
    with pytest.raises(ValueError, match="pretrain_steps"):
        tiny.tiny_settings(pretrain_steps=-1)
