"""Name the same thing: two agents must coordinate on an answer without talking.

Both agents get the same question ("Name one fruit.") and answer alone, in parallel; the shared
reward is highest when both name the same valid member of the category. They are not told that
they must agree: the shared reward teaches it. It is a coordination game (a Schelling point in
words): an instruct model already answers sensibly, but two samples of it agree only sometimes,
and learning to agree (both settling on "Apple" for fruit, "Blue" for colour, and answering with
just the name) is what a team of small models learns within minutes. The learned conventions
are tested on questions phrased in a way training never showed.

=======================  =================================================================
Agents                   ``("player_1", "player_2")``
Observations             the question (``"Name one fruit."``); the same text for both
                         agents
Actions                  any text
Reward                   shared, in [0, 1]: ``0.25 × valid(1) + 0.25 × valid(2) +
                         0.5 × [both valid and the same item]``
Turns                    1
Dataset                  one row per (category, phrasing) of :data:`CATEGORIES` (30
                         categories): ``"train"`` asks "Name one {c}." and "Think of a {c}
                         and name it."; ``"eval"`` (aliases ``"test"``, ``"validation"``)
                         asks "Which {c} comes to mind first?". Rows: ``{"id",
                         "category", "prompt"}``
=======================  =================================================================

An answer's item is the member of the category's list that it names (lower-cased, letters only,
a plural ``s``/``es`` allowed); an answer is valid when it names exactly one member, has no
digits and at most ``max_words`` words (default 8). So "Sure! A fruit that many people like is
the mango, which" is not an answer, nor is a list ("1. Blue - Green - Black"), and agreeing on
a word that is no member ("Sure") earns nothing.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import datasets

from llm_marl.tasks.base import CooperativeTask

__all__ = ["CATEGORIES", "NameMatch", "named_item", "named_items"]

CATEGORIES: dict[str, tuple[str, ...]] = {
    "fruit": ("apple", "banana", "orange", "mango", "grape", "strawberry", "pear", "peach", "cherry", "pineapple", "lemon", "watermelon", "kiwi", "plum"),
    "colour": ("red", "blue", "green", "yellow", "orange", "purple", "black", "white", "pink", "brown", "gray", "grey"),
    "wild animal": ("lion", "tiger", "elephant", "giraffe", "zebra", "bear", "wolf", "fox", "monkey", "deer", "leopard", "cheetah", "gorilla", "rhino"),
    "pet": ("dog", "cat", "rabbit", "hamster", "fish", "goldfish", "parrot", "turtle", "bird", "guinea pig"),
    "vegetable": ("carrot", "potato", "tomato", "broccoli", "onion", "cucumber", "lettuce", "spinach", "pepper", "pea", "corn", "cabbage"),
    "planet": ("mercury", "venus", "earth", "mars", "jupiter", "saturn", "uranus", "neptune"),
    "ocean": ("pacific", "atlantic", "indian", "arctic", "southern"),
    "continent": ("africa", "asia", "europe", "australia", "antarctica", "north america", "south america", "america"),
    "day of the week": ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"),
    "month of the year": ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"),
    "season": ("spring", "summer", "autumn", "fall", "winter"),
    "musical instrument": ("piano", "guitar", "violin", "drum", "flute", "trumpet", "cello", "saxophone", "harp", "clarinet"),
    "sport": ("football", "soccer", "basketball", "tennis", "baseball", "cricket", "golf", "swimming", "hockey", "volleyball", "rugby"),
    "country in Europe": ("france", "germany", "italy", "spain", "portugal", "greece", "sweden", "norway", "poland", "netherlands", "ireland", "england", "switzerland"),
    "big city": ("tokyo", "london", "paris", "beijing", "delhi", "shanghai", "cairo", "moscow", "rome", "new york", "mumbai", "sydney"),
    "flower": ("rose", "tulip", "daisy", "lily", "sunflower", "orchid", "daffodil", "lavender", "lotus", "jasmine"),
    "tree": ("oak", "pine", "maple", "birch", "willow", "palm", "cedar", "elm", "redwood", "spruce"),
    "bird": ("eagle", "sparrow", "robin", "parrot", "owl", "penguin", "crow", "pigeon", "hawk", "swan", "duck", "flamingo"),
    "drink": ("water", "coffee", "tea", "milk", "juice", "soda", "lemonade", "cola"),
    "vehicle": ("car", "bus", "bike", "bicycle", "truck", "train", "motorcycle", "plane", "airplane", "boat", "van"),
    "shape": ("circle", "square", "triangle", "rectangle", "star", "oval", "hexagon", "pentagon", "diamond"),
    "metal": ("gold", "silver", "iron", "copper", "aluminium", "aluminum", "steel", "platinum", "zinc", "lead"),
    "breakfast food": ("egg", "pancake", "toast", "cereal", "bacon", "oatmeal", "waffle", "bread", "yogurt", "porridge"),
    "programming language": ("python", "java", "javascript", "c", "ruby", "rust", "go", "swift", "kotlin", "php"),
    "kitchen utensil": ("spoon", "fork", "knife", "spatula", "whisk", "ladle", "tongs", "peeler"),
    "body part": ("hand", "head", "arm", "leg", "eye", "heart", "foot", "nose", "ear", "finger", "mouth"),
    "farm animal": ("cow", "pig", "chicken", "sheep", "horse", "goat", "duck", "donkey", "turkey"),
    "sea animal": ("fish", "shark", "whale", "dolphin", "octopus", "crab", "jellyfish", "seal", "starfish", "turtle"),
    "insect": ("ant", "bee", "butterfly", "fly", "mosquito", "beetle", "ladybug", "grasshopper", "wasp", "moth"),
    "dessert": ("cake", "ice cream", "pie", "cookie", "chocolate", "pudding", "brownie", "cheesecake", "cupcake"),
}
"""The categories and their accepted members (lower case; a member may have two words)."""

TRAIN_PHRASINGS = ("Name one {c}.", "Think of a {c} and name it.")
EVAL_PHRASINGS = ("Which {c} comes to mind first?",)
_EVAL_SPLITS = ("eval", "test", "validation")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def named_items(answer: str, members: Sequence[str]) -> list[str]:
    """The members of ``members`` that ``answer`` names (whole words, lower-cased, a plural
    ``s``/``es`` allowed), in the order they occur; a member inside a longer one that is also
    named ("america" in "north america") is not counted."""
    words = _words(answer)
    found: list[tuple[int, int, str]] = []
    for member in members:
        parts = member.split()
        n = len(parts)
        for i in range(len(words) - n + 1):
            window = words[i : i + n]
            if window[:-1] == parts[:-1] and window[-1] in (parts[-1], parts[-1] + "s", parts[-1] + "es"):
                found.append((i, i + n, member))
                break
    kept = [f for f in found if not any(o != f and o[0] <= f[0] and f[1] <= o[1] for o in found)]
    return [member for _, _, member in sorted(kept)]


def named_item(answer: str, members: Sequence[str]) -> str | None:
    """The member of ``members`` that occurs first in ``answer`` (see :func:`named_items`), or None."""
    items = named_items(answer, members)
    return items[0] if items else None


class NameMatch(CooperativeTask):
    """Two agents name a member of the same category and win together when they agree.

    Args:
        max_words: an answer with more words than this is not valid (default 8).
        categories: category -> accepted members (default :data:`CATEGORIES`).
    """

    agents = ("player_1", "player_2")
    num_turns = 1
    name = "NameMatch"

    def __init__(self, num_turns: int = 1, *, max_words: int = 8, categories: Mapping[str, Sequence[str]] | None = None):
        if num_turns != 1:
            raise ValueError(f"NameMatch is a one-turn game: num_turns must be 1, got {num_turns!r}")
        if not isinstance(max_words, int) or max_words < 1:
            raise ValueError(f"max_words must be an int >= 1, got {max_words!r}")
        self.max_words = max_words
        self.categories = {str(c): tuple(str(m).lower() for m in ms) for c, ms in (categories or CATEGORIES).items()}
        if not self.categories or any(not ms for ms in self.categories.values()):
            raise ValueError("categories must map each category to at least one member")

    def dataset(self, split: str) -> datasets.Dataset:
        if split == "train":
            phrasings = TRAIN_PHRASINGS
        elif split in _EVAL_SPLITS:
            phrasings = EVAL_PHRASINGS
        else:
            raise ValueError(f"unknown split {split!r}; NameMatch has 'train' and 'eval' ({', '.join(_EVAL_SPLITS)})")
        rows = [
            {"id": f"{category}/{p}", "category": category, "prompt": phrasing.format(c=category)}
            for p, phrasing in enumerate(phrasings)
            for category in self.categories
        ]
        return datasets.Dataset.from_list(rows)

    def initial_observations(self, item: Mapping[str, Any]) -> dict[str, str]:
        return {agent: item["prompt"] for agent in self.agents}

    def reward(self, item: Mapping[str, Any], actions: Mapping[str, str], history: Any) -> tuple[float, dict[str, Any]]:
        members = self.categories[item["category"]]
        items, valid = {}, {}
        for agent in self.agents:
            found = set(named_items(actions[agent], members))
            items[agent] = found.pop() if len(found) == 1 else None
            text = actions[agent]
            valid[agent] = items[agent] is not None and not re.search(r"\d", text) and len(_words(text)) <= self.max_words
        same = all(valid.values()) and len(set(items.values())) == 1
        value = 0.25 * sum(valid.values()) + 0.5 * same
        details = {"match": float(same), "valid": sum(valid.values()) / len(valid), **{f"{a}_item": items[a] or "" for a in self.agents}}
        return value, details

    def transition(self, item: Mapping[str, Any], actions: Mapping[str, str], history: Any) -> dict[str, str]:
        return self.initial_observations(item)
