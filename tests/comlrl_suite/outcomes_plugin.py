"""A pytest plugin for the CoMLRL suite run: writes to the JSON file named by
``COMLRL_SUITE_OUTCOMES`` each test's outcome ({"outcomes": {node id: "passed" | "failed" |
"error" | "skipped"}, "messages": {node id: the failure's last line}}; a test module that cannot
be imported is one entry, its path, with "error")."""

from __future__ import annotations

import json
import os

_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = text.replace(os.environ.get("COMLRL_SUITE_REPO", "\0") + os.sep, "")  # paths relative to the checkout
    return text.strip().splitlines()[-1][:300] if text.strip() else ""


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "error"
        _messages[report.nodeid] = _message(report)


def pytest_runtest_logreport(report):
    if report.when == "teardown" and _outcomes.get(report.nodeid) in ("failed", "error"):
        return  # the call's failure stands
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = "error" if report.failed and report.when != "call" else report.outcome
        if report.failed:
            _messages[report.nodeid] = _message(report)


def pytest_sessionfinish(session):
    with open(os.environ["COMLRL_SUITE_OUTCOMES"], "w") as f:
        json.dump({"outcomes": dict(sorted(_outcomes.items())), "messages": dict(sorted(_messages.items()))}, f, indent=1)
