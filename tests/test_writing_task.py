"""The writing-collaboration task: reward levels against hand-computed numbers, degenerate answers,
the dataset split, the multi-turn feedback and the PettingZoo face (both variants)."""

from __future__ import annotations

import hashlib
import warnings

import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from llm_marl.envs import DialogueEnv
from llm_marl.envs import registry
from llm_marl.tasks.writing import (
    WritingCollab,
    char_length,
    char_ratio,
    content_words,
    length_gate,
    length_ratio_score,
    letter_share,
    lexical_diversity,
    overlap_fraction,
    passage_overlap,
    unique_word_ratio,
    word_count,
    words,
    writing_reward,
)
from llm_marl.tasks.writing.corpus import pydoc_paragraphs

PASSAGE = (
    "When a module is imported, its code runs once and every name it defines becomes an attribute "
    "of the module object."
)
# 28 characters, 6 words, all distinct; content words module/runs/code/once... ("its" is a stop
# word) all occur in PASSAGE -> overlap fraction 1.
SHORT = "A module runs its code once."
# 68 characters (ratio 68/28 = 2.43, in the band), 10 distinct words; content words loading,
# module, creates, fresh, objects, binds, names, globally: only "module" is in PASSAGE -> 1/8.
LONG = "Loading the module creates fresh objects, then binds names globally."
# 42 characters (ratio 42/28 = 1.5, on the lower ramp: (1.5 - 1.1) / 0.5 = 0.8); all content
# words (code, runs, module, imported) are in PASSAGE.
LONG_SHORTISH = "Code runs once, when a module is imported."


class FixedWriting(WritingCollab):
    """The real task on a fixed one-passage dataset, so episode rewards are computable by hand."""

    def passages(self):
        return {"train": [{"id": "t0", "prompt": PASSAGE}], "eval": [{"id": "e0", "prompt": PASSAGE}]}


@pytest.fixture(scope="module")
def task():
    return WritingCollab()


# --- measurements ----------------------------------------------------------------------------


def test_words_and_characters():
    assert words("It's 3 x-ray --- __init__ Été!") == ["it's", "x", "ray", "init", "été"]
    assert word_count("") == 0 and word_count("---- . . . 123") == 0
    assert char_length("  a \n\n b  ") == 3
    assert char_ratio("a  b", " aaaa   bbb ") == pytest.approx(8 / 3)
    assert char_ratio("", "anything") == 0.0 and char_ratio("  ", "x") == 0.0
    assert content_words("The value of it is bound") == ["value", "bound"]


# --- level 1: the gate -------------------------------------------------------------------------


def test_length_gate():
    assert length_gate("one two three", "four five six") == 1.0
    assert length_gate("one two", "four five six") == 0.0  # short has 2 < 3 words
    assert length_gate("one two three", "") == 0.0
    assert length_gate("----", "-" * 32) == 0.0  # no words at all
    assert length_gate("one two three", " ".join(["w"] * 120)) == 1.0
    assert length_gate("one two three", " ".join(["w"] * 121)) == 0.0
    assert length_gate("one two", "a b", min_words=2, max_words=2) == 1.0


# --- level 2: the length ratio -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio, expected",
    [
        (2.0, 1.0),
        (1.6, 1.0),
        (3.2, 1.0),
        (1.35, 0.5),  # (1.35 - 1.1) / (1.6 - 1.1)
        (1.5, 0.8),
        (4.1, 0.5),  # (5.0 - 4.1) / (5.0 - 3.2)
        (1.1, 0.0),
        (5.0, 0.0),
        (0.0, 0.0),
        (0.5, 0.0),
        (9.0, 0.0),
    ],
)
def test_length_ratio_score(ratio, expected):
    assert length_ratio_score(ratio) == pytest.approx(expected)


def test_length_ratio_score_custom_band():
    assert length_ratio_score(1.5, band=(2.0, 3.0), limits=(1.0, 4.0)) == pytest.approx(0.5)
    assert length_ratio_score(3.5, band=(2.0, 3.0), limits=(1.0, 4.0)) == pytest.approx(0.5)


# --- level 3: lexical diversity ----------------------------------------------------------------


def test_lexical_diversity_numbers():
    assert unique_word_ratio("the the the the") == 0.25
    assert lexical_diversity("the the the the") == 0.0  # 0.25 <= 0.3
    assert unique_word_ratio("one two three four one two three four") == 0.5
    assert lexical_diversity("one two three four one two three four") == pytest.approx(0.8)  # (0.5-0.3)/0.25
    assert letter_share("abcd ---") == pytest.approx(4 / 7)
    assert lexical_diversity("abcd ---") == pytest.approx((4 / 7 - 0.4) / 0.3)  # unique ratio 1
    assert lexical_diversity(SHORT) == 1.0 and lexical_diversity(LONG) == 1.0
    for degenerate in ("", "----", "-" * 32, ". . . .", "!!! ??? ...", "abc " + "-" * 32):
        assert lexical_diversity(degenerate) == 0.0, degenerate


# --- level 4: passage overlap ------------------------------------------------------------------


def test_passage_overlap_numbers():
    assert overlap_fraction(SHORT, PASSAGE) == 1.0
    assert overlap_fraction(LONG, PASSAGE) == 0.125
    assert passage_overlap(LONG, PASSAGE) == pytest.approx(0.25)  # 0.125 / 0.5
    assert overlap_fraction("cats chase mice", "the cats sleep") == pytest.approx(1 / 3)
    assert passage_overlap("cats chase mice", "the cats sleep") == pytest.approx(2 / 3)
    assert passage_overlap("the the the the", PASSAGE) == 0.0  # no content words
    assert passage_overlap("----", PASSAGE) == 0.0


# --- the total ---------------------------------------------------------------------------------


def test_sensible_pairs_get_the_hand_computed_reward():
    # gate 1, diversity min(1, 1) = 1, ratio 2.43 -> 1, overlap mean(1, 0.25) = 0.625
    value, details = writing_reward(SHORT, LONG, PASSAGE)
    assert value == pytest.approx(0.5 * 1.0 + 0.5 * 0.625) == pytest.approx(0.8125)
    assert details["gate"] == 1.0 and details["length_ratio"] == 1.0
    assert details["lexical_diversity"] == 1.0 and details["passage_overlap"] == pytest.approx(0.625)
    assert details["char_ratio"] == pytest.approx(68 / 28)
    measured = [details[k] for k in ("short_words", "long_words", "short_chars", "long_chars")]
    assert measured == [6, 10, 28, 68]
    # ratio 1.5 -> 0.8; overlap 1 for both
    value, _ = writing_reward(SHORT, LONG_SHORTISH, PASSAGE)
    assert value == pytest.approx(0.5 * 0.8 + 0.5 * 1.0)
    # the weight moves credit between the length ratio and the overlap
    value, _ = writing_reward(SHORT, LONG, PASSAGE, length_weight=1.0)
    assert value == pytest.approx(1.0)


@pytest.mark.parametrize(
    "short, long",
    [
        ("----", "-" * 32),
        ("----", LONG),
        (SHORT, "-" * 32 + " " + "-" * 32 + " " + "-" * 32),
        ("the the the the", "the the the the the the the the the the"),
        (SHORT, "the the the the the the the the the the"),
        ("the the the the", LONG),
        (". . . .", ". . . . . . . . . ."),
        ("", ""),
        ("", LONG),
        ("module code", LONG),  # 2 words: under the gate
    ],
)
def test_degenerate_answers_get_zero(short, long):
    value, details = writing_reward(short, long, PASSAGE)
    assert value == 0.0, details


def test_padding_with_dashes_does_not_pay():
    honest = writing_reward(SHORT, "A module runs its code only once.", PASSAGE)[0]  # ratio 1.18
    padded = writing_reward(SHORT, "A module runs its code only once. " + "-" * 40, PASSAGE)[0]  # ratio 2.6
    assert 0 < honest and padded < 0.1 < honest


def test_task_reward_and_shift(task):
    item = {"id": "x", "prompt": PASSAGE}
    value, details = task.reward(item, {"short": SHORT, "long": LONG}, ())
    assert value == pytest.approx(0.8125) and details["passage_overlap"] == pytest.approx(0.625)
    shifted = WritingCollab(reward_shift=-1.0).reward(item, {"short": SHORT, "long": LONG}, ())
    assert shifted[0] == pytest.approx(-0.1875)
    # plausible short English answers of 5-60 words pass the default gate
    assert length_gate("one two three four five", " ".join(["word"] * 60)) == 1.0


def test_invalid_settings():
    with pytest.raises(ValueError):
        WritingCollab(num_turns=0)
    with pytest.raises(ValueError):
        WritingCollab(min_words=10, max_words=5)
    with pytest.raises(ValueError):
        WritingCollab(ratio_band=(1.6, 3.2), ratio_limits=(1.7, 5.0))
    with pytest.raises(ValueError):
        WritingCollab(length_weight=1.5)


# --- dataset -----------------------------------------------------------------------------------


def test_dataset_split_is_fixed_disjoint_and_large(task):
    train, evaluation = task.dataset("train"), task.dataset("eval")
    train_ids, eval_ids = list(train["id"]), list(evaluation["id"])
    train_text, eval_text = list(train["prompt"]), list(evaluation["prompt"])
    assert len(train) + len(evaluation) >= 200 and len(evaluation) >= 20 and len(train) > len(evaluation)
    assert set(train.column_names) == set(evaluation.column_names) == {"id", "prompt"}
    ids = train_ids + eval_ids
    assert len(set(ids)) == len(ids)
    assert not set(train_text) & set(eval_text)
    kept = [p for p in pydoc_paragraphs() if 20 <= len(p.split()) <= 80]
    assert sorted(train_text + eval_text) == sorted(kept)
    for text in eval_text[:5]:
        assert int(hashlib.sha256(text.encode()).hexdigest(), 16) % 10 == 0
    again = WritingCollab()  # a fresh task builds the very same rows, in the same order
    assert list(again.dataset("train")["id"]) == train_ids and list(again.dataset("eval")["id"]) == eval_ids
    assert task.dataset("test") is evaluation and task.dataset("validation") is evaluation
    with pytest.raises(ValueError):
        task.dataset("dev")


def test_prompts_are_passage_plus_corpus_lead_in(task):
    item = task.dataset("train")[0]
    observations = task.initial_observations(item)
    assert observations == {"short": item["prompt"] + " In simple terms,", "long": item["prompt"] + " For example,"}


# --- multi-turn feedback -----------------------------------------------------------------------


def test_transition_reports_lengths_ratio_and_advice():
    task = WritingCollab(num_turns=2)
    item = {"id": "x", "prompt": PASSAGE}
    nxt = task.transition(item, {"short": SHORT, "long": LONG}, ())
    assert nxt["short"] == (
        f"{PASSAGE} Your short version has 6 words and the long version has 10 words. The long one is "
        "2.4 times as long as the short one, and it should be 1.6 to 3.2 times as long. "
        "The lengths are right. In simple terms,"
    )
    assert nxt["long"] == (
        f"{PASSAGE} Your long version has 10 words and the short version has 6 words. The long one is "
        "2.4 times as long as the short one, and it should be 1.6 to 3.2 times as long. "
        "The lengths are right. It should use more of the words above. For example,"
    )
    # ratio 1.0: too close -> the short one should shrink, the long one grow
    nxt = task.transition(item, {"short": SHORT, "long": SHORT}, ())
    assert "1.0 times as long" in nxt["short"] and "Yours should be shorter." in nxt["short"]
    assert "Yours should be longer." in nxt["long"]
    # ratio 68/12 = 5.7: too far apart
    nxt = task.transition(item, {"short": "Module code.", "long": LONG}, ())
    assert "5.7 times as long" in nxt["long"] and "Yours should be shorter." in nxt["long"]
    assert "Yours must have at least 3 words." in nxt["short"]
    # an empty short answer: no ratio to report
    nxt = task.transition(item, {"short": "", "long": "---- the the the the"}, ())
    assert "has 0 words and" in nxt["short"] and "times as long as the short one." in nxt["short"]
    assert "It should not repeat the same words." in nxt["long"]
    assert nxt["long"].startswith(f"{PASSAGE} Your long version has 4 words and the short version has 0 words.")


# --- PettingZoo face ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_turns", [1, 2])
def test_parallel_api(num_turns):
    env = DialogueEnv(WritingCollab(num_turns=num_turns), split="train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_api_test(env, num_cycles=6)


@pytest.mark.parametrize("num_turns", [1, 2])
def test_parallel_seed(num_turns):
    parallel_seed_test(lambda: DialogueEnv(WritingCollab(num_turns=num_turns), split="eval"), num_cycles=3)


def test_single_turn_episode_with_fixed_answers():
    env = DialogueEnv(FixedWriting(), split="train")
    observations, infos = env.reset(options={"index": 0})
    assert observations["short"] == PASSAGE + " In simple terms,"
    _, rewards, terminations, truncations, infos = env.step({"short": SHORT, "long": LONG})
    assert rewards == {"short": pytest.approx(0.8125), "long": pytest.approx(0.8125)}
    assert all(terminations.values()) and not any(truncations.values()) and env.agents == []
    assert infos["long"]["reward_details"]["passage_overlap"] == pytest.approx(0.625)


def test_multi_turn_episode_with_fixed_answers():
    env = DialogueEnv(FixedWriting(num_turns=2), split="eval")
    env.reset(seed=0)
    observations, rewards, terminations, _, _ = env.step({"short": SHORT, "long": LONG})
    assert rewards["short"] == pytest.approx(0.8125) and not any(terminations.values())
    assert "6 words and the long version has 10 words" in observations["short"]
    assert observations["long"].endswith("It should use more of the words above. For example,")
    observations, rewards, terminations, _, infos = env.step({"short": SHORT, "long": LONG_SHORTISH})
    assert rewards == {"short": pytest.approx(0.9), "long": pytest.approx(0.9)}  # 0.5 * 0.8 + 0.5 * 1
    assert all(terminations.values()) and observations == {"short": "", "long": ""}
    assert infos["short"]["turn"] == 1 and infos["short"]["reward_details"]["length_ratio"] == pytest.approx(0.8)


def test_registered_ids_build_the_writing_task():
    single = registry.make("WritingCollab-v0", split="eval")
    multi = registry.make("WritingCollabMultiTurn-v0", render_mode="ansi", min_words=4)
    assert isinstance(single.task, WritingCollab) and single.task.num_turns == 1 and single.split == "eval"
    assert multi.task.num_turns == 2 and multi.task.settings["min_words"] == 4 and multi.render_mode == "ansi"
    assert registry.make("WritingCollabMultiTurn-v0", num_turns=3).task.num_turns == 3
    assert registry.make("WritingCollabMultiTurn-v0", num_turns=None).task.num_turns == 2
