"""One shared decode of several requests, through the policies' own sampling loop.

:func:`decode_jobs` answers a batch of :class:`Job` s (requests whose agents run on one model: a
full model's agent, or any agents of one LoRA team) in ONE call of
:func:`llm_marl.policies.sampling.decode`, the KV-cached loop training samples with: every
answer is a row, a team's rows carry their agent's adapter (routes), and one forward per new
token serves all of them. What differs between requests is handled around that loop, not in a
loop of its own:

- **Sampling settings per request.** The draw function given to the loop splits the rows by
  ``(temperature, top_p, top_k)`` and draws each group with
  :func:`~llm_marl.policies.sampling.draw` (top-k, then top-p, inverse CDF); temperature 0 or
  top_p 0 takes the most likely token.
- **Seeds.** A request with a ``seed`` draws its rows' uniforms from its own
  ``torch.Generator`` (seeded with it), one per row per step: its answers do not depend on the
  global RNG or on how many other requests share the batch (up to the float rounding of
  batch-size dependent kernels). Requests without one use the global RNG, as training does.
- **Lengths and stop strings.** Rows still short of their request's ``min_tokens`` cannot draw
  an end-of-sequence token. A row that reached its ``max_tokens``, met one of its stop
  strings, or whose request was cancelled (a timeout, a client gone) gets the end-of-sequence
  token at its next draw, which ends it in the loop; the loop stops when every row has ended
  (or at the longest ``max_tokens``).
- **Streaming.** After each step the new text of every streamed row (decoded from all its
  tokens, minus an unfinished UTF-8 character and minus any tail that could still become a
  stop string) is handed to its request's ``on_text``.

Answers end before their end-of-sequence token and before a stop string; ``finish_reason`` is
``"stop"`` for both and ``"length"`` at ``max_tokens``.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from llm_marl.policies import sampling
from llm_marl.policies.packed_weights import packed_linears
from llm_marl.serve.protocol import Choice

__all__ = ["BatchRecord", "Job", "decode_jobs", "engine_of"]


@dataclass(eq=False)
class Job:
    """One request as the scheduler holds it: its agent's policy, its prompts (token ids) and
    sampling settings, and (filled by :func:`decode_jobs`) its answers."""

    policy: Any
    """The policy of the agent that answers."""
    prompts: list[list[int]]
    """Token ids of each prompt (each answered ``n`` times)."""
    max_tokens: list[int]
    """Each prompt's answer budget (tokens)."""
    n: int = 1
    """Answers per prompt."""
    temperature: float = 1.0
    """Sampling temperature (0: the most likely token)."""
    top_p: float | None = None
    """Nucleus threshold (None or 1: off; 0: the most likely token)."""
    top_k: int | None = None
    """Keep the k most likely tokens (None or 0: off)."""
    min_tokens: int = 0
    """No end-of-sequence token before this many tokens."""
    stop: tuple[str, ...] = ()
    """Stop strings."""
    seed: int | None = None
    """The seed of this request's own generator (None: the global RNG)."""
    on_text: Callable[[int, str], None] | None = None
    """Streaming: called from the decoding thread with ``(choice index, new text)``."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set from any thread: the job's rows end at the next step, its answers are dropped."""
    choices: list[Choice] | None = None
    """The answers, in choice order (prompt by prompt, ``n`` each), once decoded."""
    completion_tokens: int = 0
    """Tokens of all its answers (the end-of-sequence token not counted)."""

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


@dataclass
class BatchRecord:
    """What one shared decode did (the scheduler keeps the latest ones)."""

    jobs: int
    """Requests decoded together."""
    rows: int
    """Answers decoded together (rows of the loop)."""
    steps: int
    """Decode steps (forward passes after the prompts')."""
    tokens: int
    """Answer tokens produced."""
    agents: tuple[str, ...] = ()
    """The agents whose requests were in it."""


def engine_of(policy: Any) -> Any:
    """What a batch shares: a LoRA team's agents share the team (one model), a full model is its own."""
    return getattr(policy, "team", None) or policy


@dataclass(eq=False)
class _Row:
    job: Job
    index: int
    prompt: list[int]
    budget: int
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    text: str | None = None
    sent: str = ""


def _greedy(temperature: float, top_p: float | None) -> bool:
    return temperature == 0 or top_p == 0


def _visible(text: str, stops: tuple[str, ...]) -> str:
    """The part of a streamed row's text that is safe to send: no unfinished character at its
    end, and no tail that is the start of a stop string."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:size]):
                hold = size
                break
    return text[: len(text) - hold] if hold else text


def decode_jobs(jobs: list[Job], lock: threading.Lock | None = None) -> BatchRecord:
    """Decode ``jobs`` (all on one :func:`engine_of`) together; fills each job's ``choices`` and
    ``completion_tokens``. ``lock``, if given, is held while the model runs."""
    rows = [
        _Row(job, p * job.n + k, prompt, job.max_tokens[p])
        for job in jobs
        for p, prompt in enumerate(job.prompts)
        for k in range(job.n)
    ]
    lead = jobs[0].policy
    tokenizer = lead.tokenizer
    eos = set(lead.eos_token_ids)
    end = lead.eos_token_ids[0]
    generators = {id(job): torch.Generator().manual_seed(job.seed % 2**64) for job in jobs if job.seed is not None}
    groups: dict[tuple[Any, ...], list[int]] = {}
    for r, row in enumerate(rows):
        job = row.job
        key = (job.temperature, job.top_p, job.top_k) if not _greedy(job.temperature, job.top_p) else ("greedy",)
        groups.setdefault(key, []).append(r)
    routes_of = [row.job.policy._routes(1) for row in rows]
    routes = None if all(r is None for r in routes_of) else [r[0] for r in routes_of]
    steps = [0]
    eos_index = torch.tensor(list(lead.eos_token_ids))

    def uniform(row: _Row) -> torch.Tensor:
        generator = generators.get(id(row.job))
        return torch.rand((1, 1), generator=generator) if generator is not None else torch.rand((1, 1))

    def draw(logits: torch.Tensor, ban_eos: bool = False) -> torch.Tensor:
        tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for key, members in groups.items():
            index = torch.tensor(members, device=logits.device)
            part = logits.index_select(0, index)
            early = [i for i, r in enumerate(members) if len(rows[r].tokens) < rows[r].job.min_tokens]
            if early:  # min_tokens: no end token yet for these rows
                part[torch.tensor(early, device=part.device).unsqueeze(1), eos_index] = -torch.inf
            if key == ("greedy",):
                tokens[index] = part.argmax(-1)
                continue
            temperature, top_p, top_k = key
            settings = sampling.DrawSettings(temperature, top_k or None, top_p, tuple(lead.eos_token_ids))
            uniforms = torch.cat([uniform(rows[r]) for r in members])
            tokens[index] = sampling.draw(part, settings, ban_eos, uniforms=uniforms)
        for r, row in enumerate(rows):
            if row.finish is not None or row.job.cancelled.is_set():
                tokens[r] = end
        return tokens

    def step(logits: torch.Tensor, token: torch.Tensor) -> None:
        steps[0] += 1
        drawn = token.tolist()
        for row, t in zip(rows, drawn):
            if row.finish is not None:
                continue
            if row.job.cancelled.is_set():
                row.finish = "cancelled"
                continue
            if t in eos:
                row.finish = "stop"
            else:
                row.tokens.append(int(t))
                if len(row.tokens) >= row.budget:
                    row.finish = "length"
            if row.job.stop or row.job.on_text is not None:
                _advance(row, tokenizer)

    lock = lock or nullcontext()
    with lock:
        _run(lead, rows, routes, draw, step)
    for row in rows:
        if row.finish is None:  # pragma: no cover - the loop runs until every row has ended
            row.finish = "length"
        if row.text is None:
            row.text = tokenizer.decode(row.tokens, skip_special_tokens=True)
        if row.job.on_text is not None and row.text.startswith(row.sent) and len(row.text) > len(row.sent) and not row.job.cancelled.is_set():
            _send(row, row.text[len(row.sent) :])
    for job in jobs:
        mine = sorted((row for row in rows if row.job is job), key=lambda row: row.index)
        job.choices = [Choice(row.index, row.text or "", "stop" if row.finish == "cancelled" else row.finish) for row in mine]
        job.completion_tokens = sum(len(row.tokens) for row in mine)
    agents = tuple(dict.fromkeys(getattr(job.policy, "adapter", None) or job.policy.name for job in jobs))
    return BatchRecord(len(jobs), len(rows), steps[0], sum(len(row.tokens) for row in rows), agents)


def _advance(row: _Row, tokenizer: Any) -> None:
    """After a new token: cut the row at its first stop string (ending it), stream its new text."""
    text = tokenizer.decode(row.tokens, skip_special_tokens=True)
    stops = row.job.stop
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut >= 0:
        text, row.finish = text[:cut], "stop"
    if row.finish is not None:
        row.text = text
    if row.job.on_text is None:
        return
    shown = text if row.finish is not None else _visible(text, stops)
    if shown.startswith(row.sent) and len(shown) > len(row.sent):
        _send(row, shown[len(row.sent) :])


def _send(row: _Row, piece: str) -> None:
    try:
        row.job.on_text(row.index, piece)
        row.sent += piece
    except Exception:  # the request's reader is gone: end its rows
        row.job.cancelled.set()


def _run(lead: Any, rows: list[_Row], routes: list[str] | None, draw: Any, step: Any) -> None:
    """The policy's decode loop over the rows' left-padded prompts (one answer per row)."""
    runner = lead._sampling_runner()
    input_ids, attention_mask = runner.left_pad([row.prompt for row in rows], lead.pad_token_id)
    new_tokens = max(row.budget for row in rows)  # each row's prompt + budget fits the context (prompts.answer_budget)
    packing = packed_linears(runner.model).active(len(rows), new_tokens) if lead.packed_weights else nullcontext()
    model = lead.model
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), packing:
            sampling.decode(
                runner,
                input_ids,
                attention_mask,
                1,
                max_new_tokens=new_tokens,
                min_new_tokens=0,
                room=new_tokens,
                eos_token_ids=lead.eos_token_ids,
                pad_token_id=lead.pad_token_id,
                draw_token=draw,
                routes=routes,
                on_step=step,
            )
    finally:
        model.train(was_training)
