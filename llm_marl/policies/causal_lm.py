"""A policy backed by any Hugging Face causal language model (``AutoModelForCausalLM``).

Sampling and scoring are the two halves the learners need (docs/algorithms.md §4). This class holds the
settings, the tokenizer and the model; the work is done by two units behind one seam —
:mod:`~llm_marl.policies.sampling` (decode loop, cache handling, draws) and
:mod:`~llm_marl.policies.scoring` (log-probs), both of which reach the model only through a
:class:`~llm_marl.policies.lm_runner.ModelRunner`. A team of adapters on one base
(:class:`~llm_marl.policies.LoRATeam`) plugs its own runner in, whose rows carry their agent's
adapter.

* :meth:`CausalLMPolicy.sample` answers every observation ``n`` times in ONE batched decode: each
  prompt runs through the model once (not once per answer), its KV cache is repeated ``n``
  times, then one forward pass per new token serves all rows (chunked only when
  ``max_batch_size`` asks for it). Each :class:`Completion` carries the generated token ids up to
  and including the first end-of-sequence token, nothing after it.
* :meth:`CausalLMPolicy.token_log_probs` recomputes, with the current weights, the
  log-probability of every generated token (the eos included, padding excluded) in as few padded
  forward passes as ``max_batch_tokens`` allows; answers that share a prompt share one pass over
  it (``score_prompts_once``). :meth:`log_probs` sums (or averages) them.

Design decisions
----------------
Layout. A scoring batch is ``[left padding | prompt | answer | right padding]``: prompts are
left-padded to a common width ``P`` (as in generation), answers start at column ``P`` and are
right-padded. ``position_ids = cumsum(attention_mask) - 1`` (0 on padding), which is exactly what
``generate`` uses for left-padded prompts, so a token's score is the one the sampler saw. Logits
are computed only for the answer columns (``logits_to_keep`` where the model supports it), and the
chosen tokens' log-probs are ``logit[chosen] - logsumexp(logits)``: no full log-softmax tensor over
the prompt, no Python loop over tokens.

Score temperature. ``score_temperature="sampling"`` (the default, like TRL) divides the logits by
the sampling temperature before the softmax, so ``log_probs`` is the log-probability under the
tempered distribution the answers were drawn from and the policy gradient is that of the sampler.
A number uses that temperature instead (``1.0`` scores the raw model, e.g. for a reference KL
against an untempered model). top-k / top-p truncation is never modelled: scores are those of the
tempered but untruncated distribution (the usual practice; the truncated one has zero probability
outside the nucleus and is not differentiable in a useful way).

Decode loop. Sampling is this module's own KV-cached loop, not ``model.generate``: a prompt shared
by ``n`` answers is run once (``generate``'s ``num_return_sequences`` runs it ``n`` times), the
cache gets room for ``max_new_tokens`` positions up front instead of being copied at every token,
and each row's token is drawn by inverse CDF from ``softmax(logits / temperature)`` after top-k
then top-p truncation (top-p keeps the most likely tokens up to and including the one that makes
their mass reach ``top_p``). ``min_new_tokens`` forbids eos before that many tokens. Nothing else
touches the logits: a hub model's own ``generation_config.json`` (e.g. ``repetition_penalty``)
cannot change what is sampled. ``use_hf_generate=True`` (or any ``generation_kwargs``) samples
through ``model.generate`` instead, e.g. for models whose cache cannot be repeated by row.
So does a ``generate`` that the script set on the model object (``model.generate = stub``, as
CoMLRL's tests inject completions): it is called with ``input_ids``, ``attention_mask``,
``generation_config`` and ``num_return_sequences``, once per prompt (batched as above with
``use_hf_generate=True``), and returns the prompt followed by the answer, one row per answer (a
tensor, or an object with ``.sequences``).

Under ``use_hf_generate`` the generation config is built from this policy's settings alone:
``temperature``, ``top_k`` (None → 0, disabled), ``top_p`` (None → 1.0), ``min_new_tokens``, with
repetition penalties, n-gram bans, typical-p and epsilon/eta cut-offs explicitly neutral, so a
hub model's own ``generation_config.json`` (e.g. ``repetition_penalty=1.05``) cannot silently
change what is sampled. Only its eos ids are taken over. ``generation_kwargs`` is an escape hatch
that is passed to ``generate`` as is (then scores may no longer match the sampler).

Padding. A tokenizer without a pad token gets its eos token as pad (with a warning). Since pad may
equal eos, an answer's end is never found by the pad id: ``token_ids`` stop at the first eos, and
scoring masks by length.

Dropout. Sampling runs in eval mode under ``torch.inference_mode()`` (the model's mode is restored
afterwards); scoring runs in whatever mode the model is in (``policy.train()`` / ``.eval()``;
gradient checkpointing needs train mode). With dropout active, train-mode scores would be noisy
versions of the sampler's, and a memory setting would change the objective. So, as TRL's
``disable_dropout`` does, the policy switches the model's dropout off (``disable_dropout=True``,
the default: :func:`disable_dropout` sets every ``torch.nn.Dropout``'s ``p``, LoRA dropout
included, and the attention modules' dropout rates to 0): scores are then the same in train and
eval mode, with and without checkpointing, and equal the sampler's. ``disable_dropout=False``
keeps the model's dropout (warned).

Context length. Prompts longer than the model's context minus one token are cut from the left
(the end of a prompt matters most), and ``max_new_tokens`` is lowered for a generate call whose
padded prompt width leaves less room than that (the decode loop and ``generate`` alike). Both
are applied identically when scoring.

Chat templates. An instruct model answers well only in its chat format. With ``chat_template``
None (the default) a tokenizer that has a chat template gets its prompts through it (True
requires one; False sends the raw text, as before). A string observation becomes one user
message, preceded by a system message when ``system_prompt`` is set; an observation may also be
a list of ``{"role", "content"}`` messages (``system_prompt`` is prepended when they hold no
system message). The rendered text (``add_generation_prompt=True``) is tokenized without adding
special tokens again, once per prompt, and those very ids are what sampling and scoring use. The
template's end-of-turn token (the special token the template writes right after an assistant
message, e.g. ChatML's ``<|im_end|>``) ends an answer, ahead of the tokenizer's eos.

Sampler records. Every sampled answer carries its tokens' log-probs as the sampler saw them
(``Completion.sampler``, :func:`sampler_log_probs`: under ``softmax(logits / score
temperature)``, untruncated, exactly what scoring computes; through ``model.generate`` from its
raw per-step logits). Scoring an answer this policy sampled with unchanged weights adds
|Δ log-prob| per token to :attr:`CausalLMPolicy.sampler_gap`
(:class:`~llm_marl.policies.base.GapMeter`), which the trainers log as
``train/<agent>/sampler_gap``: rounding-sized in fp32 (~1e-5), ~4e-2 for a bf16 sampler on
SmolLM2-135M, and large when the sampler is not the scored policy (a stale copy, dropout).

Sampling uses torch's global RNG (the trainer seeds it), so seeded runs repeat.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from llm_marl import cpu
from llm_marl.policies import sampling, scoring
from llm_marl.policies.base import Completion, GapMeter, sampler_record
from llm_marl.policies.lm_runner import LowPrecisionShadow, ModelRunner, model_name
from llm_marl.policies.packed_weights import packed_linears
from llm_marl.policies.weight_changes import weights_changed
from llm_marl.policies.sampling import repeat_with_room as _repeat_with_room  # noqa: F401 (old name)

__all__ = ["CausalLMPolicy", "TanhGELU", "disable_dropout", "fuse_activations"]

SETTINGS_FILE = "llm_marl_policy.json"
PROMPT_MEMO_SIZE = 65536
_SETTING_NAMES = (
    "max_new_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "score_temperature",
    "max_batch_size",
    "max_batch_tokens",
    "add_special_tokens",
    "use_hf_generate",
    "score_prompts_once",
    "fused_activations",
    "chat_template",
    "system_prompt",
    "sample_dtype",
    "packed_weights",
    "disable_dropout",
)
SAMPLE_DTYPES = ("float32", "bfloat16", "float16")


class TanhGELU(torch.nn.Module):
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in one kernel (``F.gelu(approximate="tanh")``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def fuse_activations(model: torch.nn.Module) -> int:
    """Replace transformers' Python-level tanh-GELU modules (``NewGELUActivation``, GPT-2's
    ``gelu_new``, and ``FastGELUActivation``) by :class:`TanhGELU`: the same function computed
    by one fused kernel instead of six element-wise ops, forward and backward. Returns how many
    modules were replaced. No parameters change; the saved config is untouched."""
    try:
        from transformers.activations import FastGELUActivation, NewGELUActivation
    except ImportError:  # pragma: no cover - transformers without these classes
        return 0
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) in (NewGELUActivation, FastGELUActivation):
                setattr(module, name, TanhGELU())
                replaced += 1
    return replaced


ATTENTION_DROPOUT_ATTRIBUTES = ("attention_dropout", "attn_dropout_p", "dropout_p")
"""Float attributes of attention modules that transformers passes to the attention kernel as its
dropout rate in train mode (e.g. Llama's ``attention_dropout``)."""


def disable_dropout(model: torch.nn.Module) -> int:
    """Switch ``model``'s dropout off, as TRL's ``disable_dropout_in_model``: every
    ``torch.nn.Dropout`` (peft's LoRA dropout included) gets ``p = 0``, and attention modules'
    float dropout rates (:data:`ATTENTION_DROPOUT_ATTRIBUTES`) become 0. Returns how many were
    changed. Forward passes then agree in train and eval mode (the config is left as it was)."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            module.p = 0.0
            changed += 1
        for name in ATTENTION_DROPOUT_ATTRIBUTES:
            value = module.__dict__.get(name)
            if isinstance(value, float) and value > 0:
                setattr(module, name, 0.0)
                changed += 1
    return changed


_switch_off_dropout = disable_dropout  # the constructor's keyword of the same name hides it


def _bf16_on_cpu(model: torch.nn.Module, sample_dtype: str | None) -> bool:
    """Whether the model (or its sampling copy) runs bf16 matmuls on the CPU."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    on_cpu = any(p.device.type == "cpu" for p in params)
    return on_cpu and (sample_dtype == "bfloat16" or any(p.dtype == torch.bfloat16 for p in params))


def sampler_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each row's drawn token's log-prob as the scorer defines it: under ``softmax(logits /
    temperature)``, untruncated (top-k/top-p and the eos floor are modelled by neither)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def _dropout_rates(model: torch.nn.Module) -> dict[str, float]:
    rates: dict[str, float] = {}
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in config.to_dict().items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, (int, float)):
                if not isinstance(value, bool) and value > 0:
                    rates[key] = float(value)
    if not any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()) and not any(
        isinstance(m.__dict__.get(a), float) and m.__dict__[a] > 0 for m in model.modules() for a in ATTENTION_DROPOUT_ATTRIBUTES
    ):
        return {}  # the config's rates are not in force (dropout switched off)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            rates.setdefault(name or "dropout", float(module.p))
    return rates


def _observation_key(observation: Any, templated: bool) -> Any:
    """A hashable memo key of an observation (a string, or a list of chat messages)."""
    if isinstance(observation, str):
        return observation
    try:
        messages = tuple((str(m["role"]), str(m["content"])) for m in observation)
    except (TypeError, KeyError) as exc:
        raise TypeError(
            f"an observation must be a string or a list of {{'role', 'content'}} messages, got {observation!r:.80} ({exc})"
        ) from None
    if not templated:
        raise TypeError(f"an observation that is a list of messages needs a chat template: {observation!r:.80}")
    return messages


def _end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token a chat template writes right after an assistant message (ChatML's
    ``<|im_end|>``), found by rendering a two-message chat; None if there is none."""
    marker = "\u2063llm_marl\u2063"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}], tokenize=False
        )
    except Exception:  # a template that needs other messages: no end-of-turn token known
        return None
    if marker not in text:
        return None
    after = text.split(marker, 1)[1]
    ids = tokenizer(after, add_special_tokens=False, verbose=False)["input_ids"] if after else []
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    return int(ids[0]) if ids and int(ids[0]) in special else None


def _unwrapped_architecture(path: Path, model: Any) -> None:
    """Name the model's own class in a saved ``config.json`` where a wrapper subclass (FSDP's
    ``FSDP<Class>``) was written instead."""
    wrapped = type(model).__name__
    own = next((c.__name__ for c in type(model).__mro__[1:] if wrapped.endswith(c.__name__) and c.__name__ != wrapped), None)
    config = path / "config.json"
    if own is None or not config.is_file():
        return
    with open(config, encoding="utf-8") as handle:
        saved = json.load(handle)
    if saved.get("architectures") == [wrapped]:
        saved["architectures"] = [own]
        with open(config, "w", encoding="utf-8") as handle:
            json.dump(saved, handle, indent=2, sort_keys=True)


class CausalLMPolicy:
    """A :class:`~llm_marl.policies.base.Policy` over a Hugging Face causal LM and its tokenizer.

    Args:
        model: any ``AutoModelForCausalLM`` (decoder-only) model.
        tokenizer: its tokenizer; gets its eos token as pad token if it has none (warned).
        max_new_tokens: cap on generated tokens per answer (an answer without eos has exactly
            this many tokens, unless the model's context is shorter).
        min_new_tokens: eos is not sampled before this many tokens (0: no floor). Scores ignore
            this floor (they are those of the untruncated distribution, like top-k/top-p).
        temperature: sampling temperature, > 0.
        top_p: nucleus sampling threshold in (0, 1]; None disables (1.0).
        top_k: top-k sampling, >= 0; None or 0 disables.
        score_temperature: ``"sampling"`` (divide logits by ``temperature`` when scoring, like
            TRL) or a positive number to divide by instead (1.0: the raw model).
        max_batch_size: at most this many sequences (prompts × samples) per ``generate`` call and
            rows per scoring forward pass; None: all at once.
        max_batch_tokens: at most this many padded tokens (rows × (prompt + answer width)) per
            scoring forward pass (a single row is always allowed); None: no limit.
        add_special_tokens: passed to the tokenizer for prompts (adds BOS for models that want
            one; GPT-2 tokenizers add nothing).
        use_hf_generate: sample with ``model.generate`` instead of this module's decode loop
            (same distribution, a different random stream; slower).
        score_prompts_once: when several answers of a scoring batch share a prompt, run that
            prompt once and the answers on its KV cache (same values and gradients, less
            compute); False: one pass over every ``prompt + answer`` row.
        fused_activations: replace the model's Python tanh-GELU modules by the fused kernel of
            the same function (:func:`fuse_activations`; outputs agree to float rounding).
        chat_template: None: prompts go through the tokenizer's chat template when it has one;
            True: they must (a tokenizer without one is an error); False: raw text.
        system_prompt: with a chat template, a system message put before each observation that
            has none (None: the template's own default, if any).
        sample_dtype: None, or ``"bfloat16"`` / ``"float16"`` / ``"float32"``: decode with a copy
            of the weights in that dtype (:class:`~llm_marl.policies.lm_runner.LowPrecisionShadow`,
            refreshed whenever the weights changed; it costs the weights' element count at that
            dtype's size) while scoring stays on the model's own weights, so the log-probs the
            loss uses are exactly those without it. The sampled tokens come from the
            lower-precision model (faster on CPUs with bf16 matmul units; the sampler and the
            scorer then differ by rounding). None or the model's own dtype: no copy.
        packed_weights: on a CPU, run the decode steps' fp32 and bf16 linear layers on
            weights packed once per sampling call (:mod:`~llm_marl.policies.packed_weights`: the
            same arithmetic, fp32 in another summation order, bf16 bit for bit; at 4-64 rows the
            linears run 1.1-1.7x faster in fp32, 1.2-1.5x in bf16; only for calls of 12+ new
            tokens, and of 2+ rows in fp32). False: plain ``F.linear``.
        disable_dropout: switch the model's dropout off (:func:`disable_dropout`, as TRL does),
            so that scoring in train mode (gradient checkpointing) gives the sampler's
            log-probs; False keeps it (warned: train-mode scores are then noisy).
        generation_kwargs: extra keyword arguments for ``model.generate``; non-empty implies
            ``use_hf_generate`` (beware: anything that changes the sampling distribution makes
            scores differ from the sampler).
        device: where the model runs; default: where its parameters are. The model is moved.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        min_new_tokens: int = 0,
        temperature: float = 0.6,
        top_p: float | None = 0.6,
        top_k: int | None = 50,
        score_temperature: str | float = "sampling",
        max_batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        add_special_tokens: bool = True,
        use_hf_generate: bool = False,
        score_prompts_once: bool = True,
        fused_activations: bool = True,
        chat_template: bool | None = None,
        system_prompt: str | None = None,
        sample_dtype: str | None = None,
        packed_weights: bool = True,
        disable_dropout: bool = True,
        generation_kwargs: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if not isinstance(min_new_tokens, int) or not 0 <= min_new_tokens <= max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be an int in [0, max_new_tokens={max_new_tokens}], got {min_new_tokens!r}"
            )
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 0):
            raise ValueError(f"top_k must be an int >= 0 or None, got {top_k!r}")
        if isinstance(score_temperature, str):
            if score_temperature != "sampling":
                raise ValueError(
                    f"score_temperature must be 'sampling' or a number > 0, got {score_temperature!r}"
                )
        elif not (isinstance(score_temperature, (int, float)) and score_temperature > 0):
            raise ValueError(
                f"score_temperature must be 'sampling' or a number > 0, got {score_temperature!r}"
            )
        if chat_template not in (None, True, False):
            raise ValueError(f"chat_template must be None, True or False, got {chat_template!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {type(system_prompt).__name__}")
        if not isinstance(disable_dropout, bool):
            raise ValueError(f"disable_dropout must be True or False, got {disable_dropout!r}")
        if not isinstance(packed_weights, bool):
            raise ValueError(f"packed_weights must be True or False, got {packed_weights!r}")
        if sample_dtype is not None and sample_dtype not in SAMPLE_DTYPES:
            raise ValueError(f"sample_dtype must be None or one of {', '.join(SAMPLE_DTYPES)}; got {sample_dtype!r}")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template is True and not has_template:
            raise ValueError(
                f"chat_template=True, but the tokenizer of {model_name(model)} has no chat template "
                "(set tokenizer.chat_template, or use chat_template=None/False for raw text)"
            )
        for name, value in (("max_batch_size", max_batch_size), ("max_batch_tokens", max_batch_tokens)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")

        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.temperature = float(temperature)
        self.top_p = top_p
        self.top_k = top_k
        self.score_temperature = score_temperature
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.add_special_tokens = add_special_tokens
        self.use_hf_generate = bool(use_hf_generate)
        self.score_prompts_once = bool(score_prompts_once)
        self.generation_kwargs = dict(generation_kwargs or {})
        self.name = model_name(model)
        self.chat_template = chat_template
        self.system_prompt = system_prompt
        self.sample_dtype = sample_dtype
        self.packed_weights = packed_weights
        self.disable_dropout = disable_dropout
        self.sampler_gap = GapMeter()
        """The sampler–scorer gap of this policy's answers (the trainers log and reset it)."""
        self._shadow: LowPrecisionShadow | None = None
        self.uses_chat_template = has_template if chat_template is None else chat_template
        if system_prompt is not None and not self.uses_chat_template:
            warnings.warn(f"{self.name}: system_prompt is ignored without a chat template (raw prompts)", stacklevel=2)

        eos_ids: list[int] = []
        end_of_turn = _end_of_turn_id(tokenizer) if self.uses_chat_template else None
        if end_of_turn is not None:
            eos_ids.append(end_of_turn)
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for candidate in (tokenizer.eos_token_id, config_eos):
            for token in candidate if isinstance(candidate, (list, tuple)) else [candidate]:
                if token is not None and int(token) not in eos_ids:
                    eos_ids.append(int(token))
        if not eos_ids:
            raise ValueError(f"{self.name}: the tokenizer and model define no eos token")
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        if tokenizer.pad_token_id is None:
            warnings.warn(
                f"the tokenizer of {self.name} has no pad token; using its eos token "
                f"{tokenizer.eos_token!r} as pad token",
                stacklevel=2,
            )
            if tokenizer.eos_token is not None:
                tokenizer.pad_token = tokenizer.eos_token
            else:
                tokenizer.pad_token_id = eos_ids[0]
        self.pad_token_id: int = int(tokenizer.pad_token_id)
        start = getattr(tokenizer, "bos_token_id", None)
        self._empty_prompt_id = int(start) if start is not None else eos_ids[0]
        self.runner = self._make_runner(model)
        self.context_length = self.runner.context_length
        self._prompt_memo: dict[str, tuple[int, ...]] = {}
        self._prompt_memo_key: tuple[Any, ...] | None = None

        if fused_activations:
            fuse_activations(model)
        self.fused_activations = bool(fused_activations)

        if disable_dropout:
            _switch_off_dropout(model)
        dropout = _dropout_rates(model)
        if dropout:
            shown = ", ".join(f"{k}={v}" for k, v in list(dropout.items())[:4])
            warnings.warn(
                f"{self.name} has dropout ({shown}): in train mode its log-probs are computed with "
                "dropout and differ from the sampling distribution (disable_dropout=False); switch it "
                "off for RL (disable_dropout=True, the default) or accept the mismatch",
                stacklevel=2,
            )
        if device is not None:
            self.to(device)
        if _bf16_on_cpu(model, sample_dtype):
            cpu.warn_bf16_fallback(f"{self.name} runs")

    # ------------------------------------------------------------------ construction / state

    def _make_runner(self, model: Any) -> ModelRunner:
        """The seam to the model (a team of adapters gives its own)."""
        return ModelRunner(model)

    def _routes(self, rows: int) -> list[str] | None:
        """Each row's route through the model: None for a plain model (one route)."""
        return None

    def _sampling_runner(self) -> ModelRunner:
        """The runner the decode loop samples with: :attr:`runner`, or with ``sample_dtype`` set
        (and not the model's dtype) that of a refreshed copy of the weights in that dtype."""
        dtype = getattr(torch, self.sample_dtype) if self.sample_dtype else None
        self._sampled_with = None  # the sampled answers' weights: their owner's own
        if dtype is None or all(p.dtype == dtype for p in self.model.parameters() if p.is_floating_point()):
            return self.runner
        if self._shadow is None or self._shadow.dtype != dtype or self._shadow.source is not self.model:
            self._shadow = LowPrecisionShadow(self.model, dtype, self._make_runner)
        runner = self._shadow.current()
        self._sampled_with = self._shadow.weights  # the copy's version, for the answers' records
        return runner

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        model_kwargs: Mapping[str, Any] | None = None,
        tokenizer_kwargs: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> "CausalLMPolicy":
        """Load model and tokenizer with the ``Auto*`` classes and wrap them. ``path_or_id``: a
        folder, a hub id, or a named model (:mod:`llm_marl.policies.models`, e.g. ``"smollm2-135m"``).

        Generation settings saved by :meth:`save_pretrained` (``llm_marl_policy.json``) are the
        defaults; keyword ``settings`` (those of the constructor) override them.
        ``model_kwargs`` / ``tokenizer_kwargs`` go to the respective ``from_pretrained``.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llm_marl.policies.models import resolve_model

        path_or_id = resolve_model(path_or_id)  # a named model (``smollm2-135m``): its cached folder
        saved: dict[str, Any] = {}
        settings_file = Path(path_or_id) / SETTINGS_FILE
        if settings_file.is_file():
            with open(settings_file, encoding="utf-8") as handle:
                saved = {k: v for k, v in json.load(handle).items() if k in _SETTING_NAMES}
        model = AutoModelForCausalLM.from_pretrained(path_or_id, **dict(model_kwargs or {}))
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **dict(tokenizer_kwargs or {}))
        return cls(model, tokenizer, **{**saved, **settings})

    def settings(self) -> dict[str, Any]:
        """The generation and scoring settings (JSON-serialisable), as saved with the model."""
        return {name: getattr(self, name) for name in _SETTING_NAMES}

    def save_pretrained(self, directory: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Save model, tokenizer and this policy's settings; reload with :meth:`from_pretrained`.
        ``state_dict``: the weights to write instead of the model's own (e.g. an FSDP-sharded
        model's consolidated ones); the saved config names the model's own class."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if state_dict is None:
            self.model.save_pretrained(path)
        else:
            self.model.save_pretrained(path, state_dict=dict(state_dict))
            _unwrapped_architecture(path, self.model)
        self.tokenizer.save_pretrained(path)
        with open(path / SETTINGS_FILE, "w", encoding="utf-8") as handle:
            json.dump(self.settings(), handle, indent=2)
        return path

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.model.named_parameters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> Any:
        result = self.model.load_state_dict(state_dict, strict=strict)
        weights_changed(self.model.parameters())  # sampling copies read the loaded weights
        return result

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover - a model without parameters
            return torch.device("cpu")

    def to(self, device: str | torch.device) -> "CausalLMPolicy":
        self.model.to(device)
        return self

    @property
    def training(self) -> bool:
        return bool(self.model.training)

    def train(self, mode: bool = True) -> "CausalLMPolicy":
        self.model.train(mode)
        return self

    def eval(self) -> "CausalLMPolicy":
        return self.train(False)

    def __repr__(self) -> str:
        return (
            f"CausalLMPolicy({self.name!r}, max_new_tokens={self.max_new_tokens}, "
            f"temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}, "
            f"score_temperature={self.score_temperature!r})"
        )

    # ------------------------------------------------------------------ tokens

    @property
    def effective_score_temperature(self) -> float:
        if self.score_temperature == "sampling":
            return self.temperature
        return float(self.score_temperature)

    def encode_prompts(self, observations: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt as generation and scoring see them (cut from the left to fit).

        Encodings are memoised per text (a prompt is encoded when it is sampled and again when
        its answers are scored); the memo is dropped whenever the tokenizer's vocabulary size or
        ``add_special_tokens`` changes, and when it holds ``PROMPT_MEMO_SIZE`` texts.
        """
        if not observations:
            return []
        templated = self.uses_chat_template
        key = (len(self.tokenizer), self.add_special_tokens, self.context_length, templated, self.system_prompt)
        if key != self._prompt_memo_key or len(self._prompt_memo) > PROMPT_MEMO_SIZE:
            self._prompt_memo, self._prompt_memo_key = {}, key
        memo = self._prompt_memo
        keys = [_observation_key(observation, templated) for observation in observations]
        missing = {k: o for k, o in zip(keys, observations) if k not in memo}
        if missing:
            if templated:
                texts = [self.render_prompt(o) for o in missing.values()]
                encoded = self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            else:
                encoded = self.tokenizer(list(missing.values()), add_special_tokens=self.add_special_tokens, verbose=False)["input_ids"]
            limit = self.context_length - 1 if self.context_length else None
            for k, ids in zip(missing, encoded):
                ids = tuple(ids) or (self._empty_prompt_id,)
                memo[k] = ids[-limit:] if limit and len(ids) > limit else ids
        return [list(memo[k]) for k in keys]

    def messages(self, observation: str | Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        """The chat messages of one observation: a string becomes one user message; a list of
        ``{"role", "content"}`` messages is kept; ``system_prompt`` goes first where no system
        message is."""
        if isinstance(observation, str):
            chat = [{"role": "user", "content": observation}]
        else:
            chat = [dict(message) for message in observation]
        if self.system_prompt is not None and not any(m["role"] == "system" for m in chat):
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat

    def render_prompt(self, observation: str | Sequence[Mapping[str, str]]) -> str:
        """The text a prompt is tokenized from: the chat template's rendering of
        :meth:`messages` (with the assistant's turn opened), or the raw observation."""
        if not self.uses_chat_template:
            if not isinstance(observation, str):
                raise TypeError(f"{self.name}: an observation that is a list of messages needs a chat template")
            return observation
        return self.tokenizer.apply_chat_template(self.messages(observation), add_generation_prompt=True, tokenize=False)

    def _answer_ids(self, completion: Completion) -> list[int]:
        if completion.token_ids is not None:
            return [int(t) for t in completion.token_ids]
        # A completion from elsewhere (text only): its tokens, then eos (a finished answer).
        ids = self.tokenizer(completion.text, add_special_tokens=False, verbose=False)["input_ids"]
        return list(ids) + [self.eos_token_ids[0]]

    def _completion(self, generated: list[int]) -> Completion:
        return self._completions([generated])[0]

    def _completions(
        self, rows: list[list[int]], owners: Sequence[Any] | None = None, seen: Sequence[Sequence[float]] | None = None
    ) -> list[Completion]:
        """Each row cut after its first eos, decoded (special tokens skipped) in one call; with
        ``owners`` and ``seen`` (per row, the policy that sampled it and its tokens' log-probs as
        the sampler saw them) each carries its :class:`~llm_marl.policies.base.SamplerRecord`."""
        cut = []
        for generated in rows:
            for index, token in enumerate(generated):
                if token in self.eos_token_ids:
                    generated = generated[: index + 1]
                    break
            cut.append(generated)
        texts = self.tokenizer.batch_decode(cut, skip_special_tokens=True)
        if owners is None or seen is None:
            return [Completion(text=text, token_ids=tuple(ids)) for text, ids in zip(texts, cut)]
        return [
            Completion(text=text, token_ids=tuple(ids),
                       sampler=None if owner is None else sampler_record(owner, seen[row][: len(ids)], getattr(self, "_sampled_with", None)))
            for row, (text, ids, owner) in enumerate(zip(texts, cut, owners))
        ]

    def _samplers(self, routes: Sequence[str | None]) -> list[Any]:
        """The policy each prompt's answers are drawn by (its gap meter's owner): this one; a
        team's agents name their own (:class:`~llm_marl.policies.lora_team.AdapterPolicy`)."""
        return [self] * len(routes)

    @property
    def sampling_dtype(self) -> str:
        """The dtype the sampler runs in: ``sample_dtype``, else the model's (its first floating parameter's)."""
        if self.sample_dtype:
            return self.sample_dtype
        dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
        return str(dtype).removeprefix("torch.")

    def _measure_gap(self, completions: Sequence[Completion], values: torch.Tensor, mask: torch.Tensor) -> None:
        """Feed :attr:`sampler_gap` with the scored answers this policy sampled (see
        :class:`~llm_marl.policies.base.GapMeter`)."""
        self.sampler_gap.dtype = self.sampling_dtype
        self.sampler_gap.measure(self, self.parameters(), completions, values, mask)

    # ------------------------------------------------------------------ sampling

    def generation_config(self, max_new_tokens: int, num_return_sequences: int):
        """The ``GenerationConfig`` of one ``generate`` call: this policy's sampler, nothing else."""
        from transformers import GenerationConfig

        return GenerationConfig(
            do_sample=True,
            num_beams=1,
            temperature=self.temperature,
            top_k=0 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else float(self.top_p),
            max_new_tokens=max_new_tokens,
            min_new_tokens=self.min_new_tokens or None,
            num_return_sequences=num_return_sequences,
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            # Neutral values, so that a model's own generation_config cannot change the sampler.
            min_length=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            renormalize_logits=False,
            use_cache=True,
        )

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.runner.left_pad(prompts, self.pad_token_id)

    def _max_new_tokens(self, prompt_width: int) -> int:
        if self.context_length is None:
            return self.max_new_tokens
        return max(1, min(self.max_new_tokens, self.context_length - prompt_width))

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]:
        """``num_samples`` answers per observation (a string or a list of chat messages), from
        one batched decode (chunked only by ``max_batch_size``)."""
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        return self.sample_encoded(self.encode_prompts(list(observations)), num_samples)

    def sample_encoded(
        self, prompts: list[list[int]], num_samples: int, routes: Sequence[str] | None = None
    ) -> list[list[Completion]]:
        """:meth:`sample` from prompts already encoded (token ids), chunked by ``max_batch_size``.
        ``routes``: one per prompt, the adapter its rows run through (None: this policy's own);
        given routes always take the KV-cached decode loop."""
        if not prompts:
            return []
        per_call = len(prompts)
        if self.max_batch_size is not None:
            per_call = max(1, self.max_batch_size // num_samples)
        replaced = routes is None and self.generate_replaced
        hf_generate = replaced or (routes is None and (self.use_hf_generate or bool(self.generation_kwargs)))
        if replaced and not self.use_hf_generate:
            per_call = 1  # a stub set on the model gets one prompt a call, as CoMLRL calls it
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                answers: list[list[Completion]] = []
                for start in range(0, len(prompts), per_call):
                    chunk = prompts[start : start + per_call]
                    if hf_generate:
                        answers += self._generate(chunk, num_samples)
                    else:
                        answers += self._decode(chunk, num_samples, None if routes is None else routes[start : start + per_call])
        finally:
            self.model.train(was_training)
        return answers

    def _decode(
        self, prompts: list[list[int]], num_samples: int, routes: Sequence[str] | None = None
    ) -> list[list[Completion]]:
        """The KV-cached sampling loop (:func:`~llm_marl.policies.sampling.decode`)."""
        input_ids, attention_mask = self._left_pad(prompts)
        runner = self._sampling_runner()
        new_tokens = self._max_new_tokens(input_ids.shape[1])
        packing = packed_linears(runner.model).active(len(prompts) * num_samples, new_tokens) if self.packed_weights else nullcontext()
        seen: list[torch.Tensor] = []
        temperature = self.effective_score_temperature

        def record(logits: torch.Tensor, token: torch.Tensor) -> None:
            seen.append(sampler_log_probs(logits, token, temperature))

        with packing:
            generated = sampling.decode(
                runner,
                input_ids,
                attention_mask,
                num_samples,
                max_new_tokens=new_tokens,
                min_new_tokens=self.min_new_tokens,
                room=self.max_new_tokens,
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                draw_token=self._draw,
                routes=self._routes(len(prompts)) if routes is None else list(routes),
                on_step=record,
            )
        owners = self._samplers([None] * len(prompts) if routes is None else list(routes))
        rows_seen = torch.stack(seen, dim=1).tolist() if seen else [[] for _ in generated]
        completions = self._completions(generated, [owners[i // num_samples] for i in range(len(generated))], rows_seen)
        return [completions[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]

    def _prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_samples: int
    ) -> tuple[torch.Tensor, Any]:
        """Next-token logits and KV cache of every prompt, each repeated ``num_samples`` times."""
        routes = self._routes(input_ids.shape[0])
        return sampling.prefill(self.runner, input_ids, attention_mask, num_samples, self.max_new_tokens, routes)

    def _run_prompts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """One pass over left-padded prompts: the logits at their last position and the KV cache."""
        return self.runner.run_prompts(input_ids, attention_mask, self._routes(input_ids.shape[0]))

    def draw_settings(self) -> sampling.DrawSettings:
        """The settings :func:`~llm_marl.policies.sampling.draw` samples with (read at each call)."""
        return sampling.DrawSettings(self.temperature, self.top_k, self.top_p, tuple(self.eos_token_ids))

    def _draw(self, logits: torch.Tensor, ban_eos: bool = False) -> torch.Tensor:
        """One token per row (:func:`~llm_marl.policies.sampling.draw`): inverse CDF on
        ``softmax(logits / temperature)`` after top-k then top-p truncation, one ``torch.rand``
        uniform per row (the global RNG)."""
        return sampling.draw(logits, self.draw_settings(), ban_eos)

    @property
    def generate_replaced(self) -> bool:
        """Whether the script replaced the model's ``generate`` (an attribute of the model object, as
        CoMLRL's tests stub it): sampling then goes through it, one prompt a call unless
        ``use_hf_generate``."""
        return "generate" in getattr(self.model, "__dict__", {})

    def _generate(self, prompts: list[list[int]], num_samples: int) -> list[list[Completion]]:
        """Sampling through ``model.generate`` (``use_hf_generate=True``, ``generation_kwargs``, or a
        replaced ``generate``, which also gets ``num_return_sequences``)."""
        input_ids, attention_mask = self._left_pad(prompts)
        width = input_ids.shape[1]
        config = self.generation_config(self._max_new_tokens(width), num_samples)
        # The raw logits of every step, for the sampler's record (generation_kwargs may say otherwise).
        config.output_logits, config.return_dict_in_generate = True, True
        model_kwargs = config.update(**self.generation_kwargs)  # the rest goes to the model
        if self.generate_replaced:  # the script's own generate, on the model it was set on
            model, model_kwargs = self.model, {**model_kwargs, "num_return_sequences": num_samples}
        else:
            model = self._sampling_runner().model
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            **model_kwargs,
        )
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        drawn = sequences[:, width:]
        steps = getattr(output, "logits", None) if not isinstance(output, torch.Tensor) else None
        seen = None
        if steps and len(steps) == drawn.shape[1]:
            temperature = self.effective_score_temperature
            seen = torch.stack([sampler_log_probs(logits, drawn[:, step], temperature) for step, logits in enumerate(steps)], dim=1).tolist()
        rows = self._completions(drawn.tolist(), self._samplers([None] * drawn.shape[0]), seen) if seen else self._completions(drawn.tolist())
        return [rows[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]

    # ------------------------------------------------------------------ scoring

    def _chunks(self, prompts: list[list[int]], answers: list[list[int]]) -> list[range]:
        """Consecutive rows per forward pass, within max_batch_size and max_batch_tokens."""
        return scoring.chunks(prompts, answers, self.max_batch_size, self.max_batch_tokens)

    def token_log_probs(
        self, observations: Sequence[str], completions: Sequence[Completion]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs ``(values, mask)``, both ``[batch, max_answer_tokens]``.

        ``values[b, t]`` is the log-probability of answer ``b``'s token ``t`` given its prompt and
        the tokens before it (logits divided by the score temperature), differentiable; 0 where
        ``mask`` is False (padding). Every generated token is scored, the eos included.
        """
        observations, completions = list(observations), list(completions)
        if len(observations) != len(completions):
            raise ValueError(
                f"got {len(observations)} observations but {len(completions)} completions"
            )
        prompts = self.encode_prompts(observations)
        answers = [self._answer_ids(c) for c in completions]
        entropy: list[torch.Tensor] = []
        values, mask = scoring.token_log_probs(
            self.runner,
            prompts,
            answers,
            pad_token_id=self.pad_token_id,
            temperature=self.effective_score_temperature,
            prompts_once=self.score_prompts_once,
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens,
            routes=self._routes(len(prompts)),
            entropy_out=entropy,
            entropy_grad=getattr(self, "entropy_grad", False),
        )
        self.last_token_entropy = (entropy[0], mask)
        self._measure_gap(completions, values, mask)
        return values, mask

    def log_probs(
        self,
        observations: Sequence[str],
        completions: Sequence[Completion],
        reduction: str = "sum",
    ) -> torch.Tensor:
        """Log-probability of each whole answer: sum (or mean) of its token log-probs.

        Differentiable; one value per (observation, completion) pair. ``reduction="mean"``
        divides by the answer's token count (eos included); an empty answer gives 0.
        """
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        values, mask = self.token_log_probs(observations, completions)
        total = values.sum(dim=-1)
        if reduction == "mean":
            total = total / mask.sum(dim=-1).clamp(min=1)
        return total
