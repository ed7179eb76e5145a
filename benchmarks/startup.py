"""How long `llm-marl --help`, `llm-marl list` and `llm-marl models` take to start, each in a
fresh process (issue 35: under 2 s on the project's 2-core machine; they import neither torch
nor transformers, which tests/test_first_hour.py checks without timing anything).

    python benchmarks/startup.py                 # 5 rounds, interleaved; prints the machine first
    python benchmarks/startup.py --rounds 10

Each round runs the three commands once each, in turn, so a change in the machine's load hits
them alike; the table gives each command's fastest and median wall time. The command is the
installed ``llm-marl`` script beside this Python when there is one (what a user runs), else
``python -c "from llm_marl.cli import main; ..."`` on this checkout. Run it on a quiet machine:
on a loaded one the numbers say more about the load than about the command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import print_machine  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = (["--help"], ["list"], ["models"])


def command_line(args: list[str]) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "llm-marl")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script, *args]
    return [sys.executable, "-c", "import sys; from llm_marl.cli import main; sys.exit(main(sys.argv[1:]))", *args]


def time_once(args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    done = subprocess.run(command_line(args), capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"llm-marl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    print_machine()
    print(f"command: {' '.join(command_line(['...']))}")
    times: dict[str, list[float]] = {" ".join(args): [] for args in COMMANDS}
    for _ in range(ns.rounds):
        for args in COMMANDS:
            times[" ".join(args)].append(time_once(list(args)))
    print(f"\n{'llm-marl ...':<16} {'fastest':>8} {'median':>8}   ({ns.rounds} rounds, seconds)")
    for name, values in times.items():
        print(f"{name:<16} {min(values):>8.2f} {statistics.median(values):>8.2f}")


if __name__ == "__main__":
    main()
