"""NameMatch (llm_marl.tasks.naming): the main job's coordination task."""

from __future__ import annotations

import pytest

from llm_marl.envs import make
from llm_marl.tasks.naming import CATEGORIES, NameMatch, named_item, named_items


def test_named_item_finds_the_first_member_as_a_whole_word():
    fruit = CATEGORIES["fruit"]
    assert named_item("Apple.", fruit) == "apple"
    assert named_item("One fruit is the mango, not an apple", fruit) == "mango"
    assert named_item("Bananas!", fruit) == "banana"
    assert named_item("Pineapple", fruit) == "pineapple"  # not "apple" inside it
    assert named_item("I am grapeful", fruit) is None
    assert named_item("North America", CATEGORIES["continent"]) == "north america"
    assert named_item("", fruit) is None
    assert named_items("Blue - Green: Black", CATEGORIES["colour"]) == ["blue", "green", "black"]
    assert named_items("I love North America", CATEGORIES["continent"]) == ["north america"]


@pytest.mark.parametrize(
    "first, second, reward, match",
    [
        ("Apple.", "apple", 1.0, 1.0),
        ("Apple.", "Mango", 0.5, 0.0),
        ("Apple.", "Sure!", 0.25, 0.0),
        ("Sure!", "Sure!", 0.0, 0.0),  # agreeing on a non-member earns nothing
        ("Apple.", "The fruit I would choose today is an apple", 0.25, 0.0),  # 9 words > max_words
        ("Apples", "Apple, banana", 0.25, 0.0),  # a list names more than one
        ("1. Apple", "Apple", 0.25, 0.0),  # digits: not an answer in words
        ("North America", "north america", 1.0, 1.0),
    ],
)
def test_reward_is_validity_plus_agreement(first, second, reward, match):
    task = NameMatch()
    item = task.dataset("train")[0]
    if first.lower().startswith("north"):
        item = next(row for row in task.dataset("train") if row["category"] == "continent")
    assert item["category"] in ("fruit", "continent")
    value, details = task.reward(item, {"player_1": first, "player_2": second}, [])
    assert value == pytest.approx(reward) and details["match"] == match


def test_splits_ask_the_same_categories_in_different_words():
    task = NameMatch()
    train, evaluation = task.dataset("train"), task.dataset("eval")
    assert len(train) == 2 * len(CATEGORIES) and len(evaluation) == len(CATEGORIES)
    assert not set(train["prompt"]) & set(evaluation["prompt"])
    assert set(evaluation["category"]) == set(CATEGORIES)
    assert task.dataset("test")["prompt"] == evaluation["prompt"]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        task.dataset("dev")
    with pytest.raises(ValueError, match="one-turn"):
        NameMatch(num_turns=2)


def test_the_registered_env_plays_one_turn():
    env = make("NameMatch-v0", split="eval")
    observations, _ = env.reset(options={"index": 0})
    assert observations == {"player_1": "Which fruit comes to mind first?", "player_2": "Which fruit comes to mind first?"}
    _, rewards, terminations, _, infos = env.step({"player_1": "Apple", "player_2": "Apple"})
    assert rewards == {"player_1": 1.0, "player_2": 1.0} and all(terminations.values())
