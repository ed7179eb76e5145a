"""Regenerate tests/comlrl_suite/expectations.json from a fresh run of CoMLRL's suite on llm_marl.

    python tests/comlrl_suite/update.py [outcomes.json]

Entries of tests that still fail keep their reasons; tests that now pass are dropped; a new
failure gets ``private`` when its source names underscore names, else ``TODO`` (listed at the
end: give each a reason, see suite.py). Prints the counts for docs/migrating.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite  # noqa: E402


def main() -> int:
    old = suite.load_expectations()["expected"] if suite.EXPECTATIONS.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        outcomes, messages, tests = suite.run_suite(Path(tmp))
        expected = {}
        for node, outcome in outcomes.items():
            if outcome not in ("failed", "error"):
                continue
            if node in old and old[node].get("reason") != "TODO":
                expected[node] = old[node]
            elif names := suite.private_from_message(tests, node, messages.get(node, "")) or suite.private_names(tests, node):
                expected[node] = {"reason": "private", "names": names}
            else:
                expected[node] = {"reason": "TODO", "message": messages.get(node, "")}
        if len(sys.argv) > 1:  # a path: the run's outcomes and messages, for reading the failures
            Path(sys.argv[1]).write_text(json.dumps({"outcomes": outcomes, "messages": messages}, indent=1))
    suite.dump_expectations(expected)
    print("counts:", suite.counts(outcomes))
    todo = [node for node, entry in expected.items() if entry.get("reason") == "TODO"]
    print(f"{len(expected)} expected failures, {len(todo)} lacking a reason:")
    for node in todo:
        print("  ", node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
