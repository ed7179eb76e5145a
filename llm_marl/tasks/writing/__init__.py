"""Writing collaboration: one agent writes a short version of a passage, the other a long one.

Two agents read the same passage of English prose (a paragraph of Python's own documentation,
:func:`llm_marl.tasks.writing.corpus.pydoc_paragraphs`). ``"short"`` writes a short version of it (a
summary, in simple terms), ``"long"`` a long one (an expansion, with examples). They share one
reward that asks for real, varied text about the passage, with the long version 1.6 to 3.2
times as long as the short one.

=======================  =================================================================
Agents                   ``("short", "long")``
Observations             the passage followed by a lead-in that the model continues:
                         ``"<passage> In simple terms,"`` (short) and
                         ``"<passage> For example,"`` (long)
Actions                  any text (the continuation)
Reward                   shared, in [0, 1]:
                         ``gate × diversity × (w × length_ratio + (1 − w) × overlap)``,
                         ``w = length_weight`` (default 0.5); see the levels below
Turns                    1 (``WritingCollab-v0``) or ``num_turns`` (default 2,
                         ``WritingCollabMultiTurn-v0``): after each turn both agents see the
                         passage again, the measured word counts and length ratio, and what
                         to change
Dataset                  pydoc paragraphs of 20-80 whitespace-separated words (625 on
                         CPython 3.11: 570 train, 55 eval); a fixed ~1 in 10, chosen by a
                         hash of the text, go to ``"eval"`` (aliases ``"test"``,
                         ``"validation"``). Rows: ``{"id", "prompt"}`` (``prompt`` = passage)
=======================  =================================================================

Prompts. The small local models (:mod:`llm_marl.policies.tiny`) are pre-trained on this very
corpus, one paragraph per sequence, and only know its register: a prompt ending in a suffix the
corpus never contains (``"\\nSummary:"``) made a third of first answers empty in a trial. So a
prompt is the passage followed by a sentence opening that occurs in the corpus itself, with no
trailing space (the byte-level tokenizer attaches the space to the next word): ``"In simple
terms,"`` (5 times in the corpus) asks for a restatement, ``"For example,"`` (16 times) for an
expansion. Both are constructor arguments (``short_lead``, ``long_lead``). With a 600-step tiny
model, 0 of 40 first answers to either prompt were empty (median 18-20 words in 48 tokens).

Reward levels. Words are runs of letters (apostrophes inside allowed; digits, punctuation and
dashes are not words); characters are counted with whitespace runs collapsed to one space.
``ramp(x, a, b)`` is ``(x − a) / (b − a)`` clipped to [0, 1] (0 at ``a``, 1 at ``b``).

1. Gate (:func:`length_gate`): 1 if both answers have ``min_words``..``max_words`` words
   (default 3..120), else 0. Empty answers and strings of punctuation have no words.
2. Length ratio (:func:`length_ratio_score`): ``r = chars(long) / chars(short)``; 1 for
   ``r`` in [1.6, 3.2], ``ramp(r, 1.1, 1.6)`` below, ``ramp(r, 5.0, 3.2)`` above (0 outside
   [1.1, 5.0]). E.g. r = 1.35 → 0.5, r = 4.1 → 0.5.
3. Lexical diversity (:func:`lexical_diversity`), per answer:
   ``ramp(unique_words / words, 0.3, 0.55) × ramp(letters / non-space characters, 0.4, 0.7)``.
   "the the the the" (0.25 unique) → 0; prose has ≥ 0.43 unique words up to 100 words and
   ≥ 0.76 letters in this corpus. Padding with dashes or dots lowers the letter share.
   The level is the MIN over the two answers.
4. Passage overlap (:func:`passage_overlap`), per answer: ``ramp(f, 0.0, 0.5)`` where ``f`` is
   the fraction of the answer's content words (3+ letters, not a stop word) that occur in the
   passage; no content words → 0. (An unrelated corpus paragraph has median f = 0, 90th
   percentile 0.12; an excerpt of the passage has f = 1.) The level is the MEAN over the two.

Total: ``reward = gate × diversity × (w × length_ratio + (1 − w) × overlap)``, ``w =
length_weight`` = 0.5. The gate and the diversity level multiply everything: a pair with one
degenerate text (empty, repetitive, punctuation or dashes) scores 0 whatever its lengths (a
reward of the length ratio alone was gamed within a minute in a trial: tiny models collapsed to
strings of punctuation and 32-dash tokens). Varied text of the right lengths that shares no
words with the passage earns at most ``w`` (half); the rest is for writing about the passage.
Why overlap is added rather than multiplied: a freshly pre-trained tiny model (600 steps)
rarely reuses the passage's words at first (median f = 0 over 64 passages), so with overlap as
a factor only 1 sampled pair in 40 earned a non-zero reward (no learning signal); with this form
30-41 pairs of 64 did (mean 0.08-0.26, standard deviation 0.14-0.25, 24-48 new tokens).
Known limit: copying the passage scores well (an extractive "summary" and a verbatim
"expansion"); the reward measures form, not meaning.

``reward`` returns ``(value, details)``; details hold the four levels (``"gate"``,
``"length_ratio"``, ``"lexical_diversity"``, ``"passage_overlap"``) and the measurements
(``"char_ratio"``, ``"short_words"``, ``"long_words"``, ``"short_chars"``, ``"long_chars"``,
per-answer ``"short_diversity"``/``"long_diversity"``/``"short_overlap"``/``"long_overlap"``).

Early termination. Rewards are in [0, 1], so the trainers' default
``early_termination_threshold=-0.2`` (meant for rewards shifted to be <= 0) would stop every
multi-turn tree after its first turn. With ``WritingCollabMultiTurn-v0`` use
``early_termination_threshold=None``, or ``reward_shift=-1.0`` (rewards in [-1, 0]), with which
-0.2 means "stop expanding a node whose mean reward is above 0.8". Single-turn: irrelevant.

Multi-turn feedback (turn 2 onward), e.g. for ``"short"``::

    <passage> Your short version has 12 words and the long version has 30 words. The long one
    is 2.6 times as long as the short one, and it should be 1.6 to 3.2 times as long. The
    lengths are right. It should use more of the words above. In simple terms,

Advice, in this order: "Yours must have at least/at most N words." (own word count outside the
gate); "Yours should be shorter/longer." (ratio outside [1.6, 3.2]; which one depends on the
agent) or "The lengths are right."; "It should not repeat the same words." (own diversity < 1);
"It should use more of the words above." (own overlap < 1).

The ids ``WritingCollab-v0`` (1 turn) and ``WritingCollabMultiTurn-v0`` (2 turns) are declared in
:mod:`llm_marl.envs.registry`; ``make(id, ...)`` takes ``split``, ``render_mode``, ``num_turns``
and any :class:`WritingCollab` keyword.
"""

from llm_marl.tasks.writing.task import *  # noqa: F403 (the names and __all__ of llm_marl.tasks.writing.task)
from llm_marl.tasks.writing.task import __all__  # noqa: F401
