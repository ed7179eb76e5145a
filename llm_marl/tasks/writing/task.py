"""The writing task itself: the reward pieces (pure functions of the two texts) and
:class:`WritingCollab`, as described in :mod:`llm_marl.tasks.writing`."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

import datasets

from llm_marl.tasks.base import CooperativeTask
from llm_marl.tasks.writing.corpus import pydoc_paragraphs

__all__ = [
    "STOP_WORDS",
    "WritingCollab",
    "char_length",
    "char_ratio",
    "content_words",
    "length_gate",
    "length_ratio_score",
    "letter_share",
    "lexical_diversity",
    "overlap_fraction",
    "passage_overlap",
    "ramp",
    "unique_word_ratio",
    "word_count",
    "words",
    "writing_reward",
]

_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")

# Function words: not evidence that an answer is about the passage.
STOP_WORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from as is are was were be been
    being it its this that these those there here which who whom whose what when where why how not
    no nor so than too very can could may might must shall should will would do does did has have
    had having you he she we they them their our your his her him me my us also all any each both
    either neither one only other such same some more most much many into onto out over under up
    down about above below between through during before after again further once just own off per
    via""".split()
)

DEFAULTS: dict[str, Any] = {
    "min_words": 3,
    "max_words": 120,
    "ratio_band": (1.6, 3.2),
    "ratio_limits": (1.1, 5.0),
    "unique_bounds": (0.3, 0.55),
    "letter_bounds": (0.4, 0.7),
    "overlap_bounds": (0.0, 0.5),
    "length_weight": 0.5,
}


# --- measurements ------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``: runs of letters (inner apostrophes allowed)."""
    return _WORD.findall(text.lower())


def word_count(text: str) -> int:
    """How many words ``text`` has (digits, punctuation and dashes are not words)."""
    return len(words(text))


def char_length(text: str) -> int:
    """Characters of ``text`` with surrounding whitespace removed and inner runs collapsed."""
    return len(" ".join(text.split()))


def char_ratio(short: str, long: str) -> float:
    """``char_length(long) / char_length(short)``; 0.0 when the short text is empty."""
    n = char_length(short)
    return char_length(long) / n if n else 0.0


def unique_word_ratio(text: str) -> float:
    """Distinct words / words (the type-token ratio); 0.0 for a text without words."""
    w = words(text)
    return len(set(w)) / len(w) if w else 0.0


def letter_share(text: str) -> float:
    """Letters / non-whitespace characters; 0.0 for an empty text."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


def content_words(text: str) -> list[str]:
    """Words of 3+ letters that are not in :data:`STOP_WORDS`."""
    return [w for w in words(text) if len(w) >= 3 and w not in STOP_WORDS]


def overlap_fraction(text: str, passage: str) -> float:
    """Fraction of ``text``'s content words (with repeats) that occur in ``passage``; 0.0 if none."""
    content = content_words(text)
    if not content:
        return 0.0
    vocabulary = set(words(passage))
    return sum(w in vocabulary for w in content) / len(content)


def ramp(x: float, zero: float, full: float) -> float:
    """``(x − zero) / (full − zero)`` clipped to [0, 1]: 0 at ``zero``, 1 at ``full``.

    ``full`` may be below ``zero`` (a falling ramp).
    """
    return min(1.0, max(0.0, (x - zero) / (full - zero)))


# --- the levels ---------------------------------------------------------------------------------


def length_gate(short: str, long: str, min_words: int = 3, max_words: int = 120) -> float:
    """Level 1: 1.0 if both texts have ``min_words``..``max_words`` words, else 0.0."""
    return float(all(min_words <= word_count(t) <= max_words for t in (short, long)))


def length_ratio_score(
    ratio: float, band: tuple[float, float] = (1.6, 3.2), limits: tuple[float, float] = (1.1, 5.0)
) -> float:
    """Level 2: 1 for ``ratio`` in ``band``, linear ramps down to 0 at ``limits``.

    With the defaults: 2.0 → 1.0, 1.35 → 0.5, 4.1 → 0.5, <= 1.1 or >= 5.0 → 0.0.
    """
    if ratio < band[0]:
        return ramp(ratio, limits[0], band[0])
    if ratio > band[1]:
        return ramp(ratio, limits[1], band[1])
    return 1.0


def lexical_diversity(
    text: str, unique_bounds: tuple[float, float] = (0.3, 0.55), letter_bounds: tuple[float, float] = (0.4, 0.7)
) -> float:
    """Level 3 for one text: ``ramp(unique_word_ratio, *unique_bounds) × ramp(letter_share, *letter_bounds)``.

    Repetition ("the the the the": 0.25 unique), strings of punctuation or dashes (no words, few
    letters) and text padded with them score 0 or close to it; ordinary prose scores 1.
    """
    return ramp(unique_word_ratio(text), *unique_bounds) * ramp(letter_share(text), *letter_bounds)


def passage_overlap(text: str, passage: str, bounds: tuple[float, float] = (0.0, 0.5)) -> float:
    """Level 4 for one text: ``ramp(overlap_fraction(text, passage), *bounds)``.

    With the defaults: half of the content words from the passage (or more) → 1, a quarter →
    0.5, none → 0.
    """
    return ramp(overlap_fraction(text, passage), *bounds)


def writing_reward(
    short: str,
    long: str,
    passage: str,
    *,
    min_words: int = 3,
    max_words: int = 120,
    ratio_band: tuple[float, float] = (1.6, 3.2),
    ratio_limits: tuple[float, float] = (1.1, 5.0),
    unique_bounds: tuple[float, float] = (0.3, 0.55),
    letter_bounds: tuple[float, float] = (0.4, 0.7),
    overlap_bounds: tuple[float, float] = (0.0, 0.5),
    length_weight: float = 0.5,
) -> tuple[float, dict[str, Any]]:
    """The shared reward in [0, 1] and its details (see the module docstring).

    ``gate × diversity × (length_weight × length_ratio + (1 − length_weight) × overlap)``
    where diversity is the minimum over the two texts and overlap the mean.
    """
    ratio = char_ratio(short, long)
    gate = length_gate(short, long, min_words, max_words)
    l2 = length_ratio_score(ratio, ratio_band, ratio_limits)
    diversity = {k: lexical_diversity(t, unique_bounds, letter_bounds) for k, t in (("short", short), ("long", long))}
    overlap = {k: passage_overlap(t, passage, overlap_bounds) for k, t in (("short", short), ("long", long))}
    l3, l4 = min(diversity.values()), (overlap["short"] + overlap["long"]) / 2
    value = gate * l3 * (length_weight * l2 + (1.0 - length_weight) * l4)
    details = {
        "gate": gate,
        "length_ratio": l2,
        "lexical_diversity": l3,
        "passage_overlap": l4,
        "char_ratio": ratio,
        "short_words": word_count(short),
        "long_words": word_count(long),
        "short_chars": char_length(short),
        "long_chars": char_length(long),
        "short_diversity": diversity["short"],
        "long_diversity": diversity["long"],
        "short_overlap": overlap["short"],
        "long_overlap": overlap["long"],
    }
    return value, details


# --- the task -----------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _check_pair(name: str, pair: tuple[float, float], increasing: bool = True) -> tuple[float, float]:
    a, b = (float(v) for v in pair)
    if not (a < b if increasing else a <= b):
        raise ValueError(f"{name} must be a pair (low, high) with low < high, got {pair!r}")
    return a, b


class WritingCollab(CooperativeTask):
    """Two agents write a short and a long version of a pydoc passage; one or more turns.

    All reward settings (see the module docstring) are keyword arguments; ``reward_shift`` is
    added to every reward (e.g. -1.0 for rewards in [-1, 0]). ``passage_words`` bounds the
    passages kept (by word count); a passage goes to ``"eval"`` when the SHA-256 of its text is
    divisible by ``eval_every``, so the split is fixed and a paragraph keeps its side across
    Python versions.
    """

    agents = ("short", "long")

    def __init__(
        self,
        num_turns: int = 1,
        *,
        min_words: int = DEFAULTS["min_words"],
        max_words: int = DEFAULTS["max_words"],
        ratio_band: tuple[float, float] = DEFAULTS["ratio_band"],
        ratio_limits: tuple[float, float] = DEFAULTS["ratio_limits"],
        unique_bounds: tuple[float, float] = DEFAULTS["unique_bounds"],
        letter_bounds: tuple[float, float] = DEFAULTS["letter_bounds"],
        overlap_bounds: tuple[float, float] = DEFAULTS["overlap_bounds"],
        length_weight: float = DEFAULTS["length_weight"],
        reward_shift: float = 0.0,
        passage_words: tuple[int, int] = (20, 80),
        eval_every: int = 10,
        short_lead: str = "In simple terms,",
        long_lead: str = "For example,",
        name: str = "WritingCollab",
    ):
        if not isinstance(num_turns, int) or num_turns < 1:
            raise ValueError(f"num_turns must be an int >= 1, got {num_turns!r}")
        if not 1 <= min_words <= max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
        band = _check_pair("ratio_band", ratio_band, increasing=False)
        limits = _check_pair("ratio_limits", ratio_limits)
        if not limits[0] < band[0] or not band[1] < limits[1]:
            raise ValueError(
                "need ratio_limits[0] < ratio_band[0] <= ratio_band[1] < ratio_limits[1], "
                f"got {ratio_band}, {ratio_limits}"
            )
        if not 0.0 <= length_weight <= 1.0:
            raise ValueError(f"length_weight must be in [0, 1], got {length_weight}")
        if eval_every < 2:
            raise ValueError(f"eval_every must be >= 2, got {eval_every}")
        self.num_turns = num_turns
        self.settings: dict[str, Any] = {
            "min_words": int(min_words),
            "max_words": int(max_words),
            "ratio_band": band,
            "ratio_limits": limits,
            "unique_bounds": _check_pair("unique_bounds", unique_bounds),
            "letter_bounds": _check_pair("letter_bounds", letter_bounds),
            "overlap_bounds": _check_pair("overlap_bounds", overlap_bounds),
            "length_weight": float(length_weight),
        }
        self.reward_shift = float(reward_shift)
        self.passage_words = (int(passage_words[0]), int(passage_words[1]))
        self.eval_every = int(eval_every)
        self.leads = {"short": short_lead, "long": long_lead}
        self.name = name
        self._splits: dict[str, datasets.Dataset] = {}

    # --- data ---------------------------------------------------------------------------------

    def passages(self) -> dict[str, list[dict[str, str]]]:
        """All kept passages as rows ``{"id", "prompt"}``, by split (``"train"``, ``"eval"``)."""
        low, high = self.passage_words
        rows: dict[str, list[dict[str, str]]] = {"train": [], "eval": []}
        for text in pydoc_paragraphs():
            if not low <= len(text.split()) <= high:
                continue
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            split = "eval" if int(digest, 16) % self.eval_every == 0 else "train"
            rows[split].append({"id": f"pydoc-{digest[:12]}", "prompt": text})
        return rows

    def dataset(self, split: str) -> datasets.Dataset:
        key = {"test": "eval", "validation": "eval"}.get(split, split)
        if key not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}; use 'train' or 'eval' (aliases 'test', 'validation')")
        if key not in self._splits:
            for name, rows in self.passages().items():
                self._splits[name] = datasets.Dataset.from_list(rows)
        return self._splits[key]

    # --- dialogue -----------------------------------------------------------------------------

    def initial_observations(self, item: Mapping[str, Any]) -> dict[str, str]:
        return {agent: f"{item['prompt']} {self.leads[agent]}" for agent in self.agents}

    def reward(self, item, actions, history):
        value, details = writing_reward(actions["short"], actions["long"], item["prompt"], **self.settings)
        return value + self.reward_shift, details

    def feedback(self, agent: str, short: str, long: str, passage: str) -> str:
        """What ``agent`` is told after writing ``short``/``long``: measured lengths and what to change."""
        s = self.settings
        counts = {"short": word_count(short), "long": word_count(long)}
        other = "long" if agent == "short" else "short"
        parts = [
            f"Your {agent} version has {_plural(counts[agent], 'word')} and the {other} version has "
            f"{_plural(counts[other], 'word')}."
        ]
        ratio = char_ratio(short, long)
        low, high = s["ratio_band"]
        if ratio > 0:
            parts.append(
                f"The long one is {ratio:.1f} times as long as the short one, and it should be "
                f"{low:g} to {high:g} times as long."
            )
        else:
            parts.append(f"The long one should be {low:g} to {high:g} times as long as the short one.")
        own = counts[agent]
        if own < s["min_words"]:
            parts.append(f"Yours must have at least {_plural(s['min_words'], 'word')}.")
        elif own > s["max_words"]:
            parts.append(f"Yours must have at most {_plural(s['max_words'], 'word')}.")
        if ratio > 0 and own >= s["min_words"]:
            if ratio < low:
                parts.append("Yours should be shorter." if agent == "short" else "Yours should be longer.")
            elif ratio > high:
                parts.append("Yours should be longer." if agent == "short" else "Yours should be shorter.")
            else:
                parts.append("The lengths are right.")
        text = short if agent == "short" else long
        if own and lexical_diversity(text, s["unique_bounds"], s["letter_bounds"]) < 1.0:
            parts.append("It should not repeat the same words.")
        if own and passage_overlap(text, passage, s["overlap_bounds"]) < 1.0:
            parts.append("It should use more of the words above.")
        return " ".join(parts)

    def transition(self, item, actions, history):
        passage = item["prompt"]
        return {
            agent: f"{passage} {self.feedback(agent, actions['short'], actions['long'], passage)} {self.leads[agent]}"
            for agent in self.agents
        }
