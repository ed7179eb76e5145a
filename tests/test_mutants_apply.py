"""The mutation harness (tests/mutants.py) stays meaningful: every planted bug still applies.

A mutant whose original snippet moved away counts as not killed, and the score in docs/development.md would
silently fall; this test names it as soon as the code it plants a bug in changes."""

from __future__ import annotations

import os

import pytest

from mutants import MUTANTS, REPO


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_still_applies_to_exactly_one_place(mutant):
    path = os.path.join(REPO, mutant.file)
    assert os.path.exists(path), f"{mutant.name}: {mutant.file} does not exist"
    source = open(path, encoding="utf-8").read()
    assert source.count(mutant.original) == 1, f"{mutant.name}: its original snippet is in {mutant.file} {source.count(mutant.original)} times"
    assert mutant.original != mutant.mutated
    assert all(os.path.exists(os.path.join(REPO, test.split("::")[0])) for test in mutant.tests), mutant.tests
