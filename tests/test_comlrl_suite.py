"""CoMLRL's own test suite, migrated by docs/migrating.md's one line, runs on llm_marl.

The fixture downloads the ``comlrl==1.4.3`` sdist with pip (CoMLRL is not installed), extracts
its ``tests/``, applies the sed line read from docs/migrating.md and runs pytest on it in a
subprocess against this checkout (``tests/comlrl_suite/suite.py``). Every test must pass except
those ``tests/comlrl_suite/expectations.json`` lists, each with its reason; a test that newly
fails, or newly passes while listed, fails the check with the list. A failed download fails it
too (no silent skip). After a change that moves outcomes: ``python tests/comlrl_suite/update.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "comlrl_suite"))

import suite  # noqa: E402


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    try:
        outcomes, messages, tests = suite.run_suite(tmp_path_factory.mktemp("comlrl_suite"))
    except suite.DownloadFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    return outcomes, messages, tests


def test_every_comlrl_test_passes_except_the_expected_failures(suite_run):
    outcomes, messages, _ = suite_run
    expected = suite.load_expectations()["expected"]
    problems = suite.compare(outcomes, expected)
    lines = [f"{p}  [{messages.get(p.rsplit(': ', 1)[-1], '')[:160]}]" if p.startswith("newly f") or p.startswith("newly e") else p
             for p in problems]
    assert not problems, (f"CoMLRL's suite on llm_marl differs from tests/comlrl_suite/expectations.json ({len(problems)}; "
                          "rerun python tests/comlrl_suite/update.py and give new failures a reason):\n" + "\n".join(lines))


def test_all_modules_collect(suite_run):
    outcomes, messages, _ = suite_run
    broken = {node: messages.get(node, "") for node in outcomes if "::" not in node}
    assert not broken


def test_every_expected_failure_carries_a_reason_that_checks_out(suite_run):
    *_, tests = suite_run
    assert suite.reason_problems(suite.load_expectations()["expected"], tests) == []


def test_a_failed_download_fails_in_one_line(tmp_path, monkeypatch):
    """No index reachable (a closed local port): the check fails saying so, it does not skip."""
    for name, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/simple",
                        "PIP_FIND_LINKS": str(tmp_path), "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(suite.DownloadFailed) as err:
        suite.fetch_tests(tmp_path)
    assert str(err.value).startswith("could not download the comlrl==1.4.3 sdist with pip: ") and "\n" not in str(err.value)
