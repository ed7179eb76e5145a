"""The rollout viewer on a large run: does a page of 5,000 recorded trees open and switch steps
within a second in headless Chromium?

It records ``--steps`` train batches of ``--trees`` trees each (default 100 x 50 = 5,000) into a
run folder through the trainer's own recorder (RolloutRecorder, schema v1): two agents, K=4
aligned answers, 2 turns (5 nodes per tree), prompts of 250-450 and answers of 40-200 characters
(the default run's writing prompts and 32-token answers). Then, for the self-contained page
(``llm-marl view``) and for the served page (``--serve``), it measures in Chromium:

- first tree: navigation start until the first tree is in the page (``performance.now()`` when
  the viewer has drawn it, recorded by the page as ``llmMarlViewer.drawnAt``);
- first paint: navigation start until the browser first paints (``first-contentful-paint``);
- loaded: navigation start until the load event (the whole page read, every step selectable);
- open wall: what the test harness waited, from sending the navigation to the load event and the
  first tree (includes the DevTools round trips);
- switch: selecting another step until its first tree is drawn and two animation frames have
  passed (so layout and paint are included), over ``--switches`` random steps: median and max.

Run: ``python benchmarks/viewer.py`` (about a minute). The numbers are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import print_machine  # noqa: E402

from llm_marl.learners.buffer import samples_from_trees  # noqa: E402
from llm_marl.runs.recording import RolloutRecorder  # noqa: E402
from llm_marl.learners.tree import RolloutNode, _compute_returns  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.viewer import make_server, write_page  # noqa: E402
from llm_marl.viewer.chromium import Chromium, find_chromium  # noqa: E402

WORDS = ("the assignment statement evaluates expression list and assigns the single resulting object to each "
         "target from left to right module import name binding scope function returns value loop iterates").split()
AGENTS = ("writer", "editor")
K = 4


def text(rng: random.Random, low: int, high: int) -> str:
    words, size, length = [], rng.randint(low, high), 0
    while length < size:
        words.append(rng.choice(WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)


def tree(rng: random.Random, index: int) -> RolloutNode:
    """A 2-turn aligned tree (root + K children) with realistic text sizes and random rewards."""

    def node(turn: int) -> RolloutNode:
        made = RolloutNode(turn, index, {a: text(rng, 250, 450) for a in AGENTS})
        made.completions = {
            a: [Completion(t, tuple(rng.randrange(1000) for _ in range(len(t) // 4))) for t in (text(rng, 40, 200) for _ in range(K))]
            for a in AGENTS
        }
        made.joint = [(k, k) for k in range(K)]
        made.rewards = [round(rng.random(), 4) for _ in range(K)]
        made.details = [{"length": rng.randint(10, 90)} for _ in range(K)]
        made.children = [None] * K
        return made

    root = node(0)
    root.children = [node(1) for _ in range(K)]
    _compute_returns(root, 1.0)
    return root


def record_run(run_dir: str, steps: int, trees: int, seed: int = 0) -> int:
    settings = {"num_turns": 2, "joint_mode": "aligned", "cross_aggregation": "sum", "advantage_mode": "mean",
                "advantage_normalization": True, "early_termination_threshold": None, "discount": 1.0, "reference_kl_coef": None}
    recorder = RolloutRecorder(run_dir, 1, settings, AGENTS)
    rng = random.Random(seed)
    metrics = open(os.path.join(run_dir, "metrics.jsonl"), "w")
    recording = 0.0
    for step in range(steps):
        roots = [tree(rng, step * trees + i) for i in range(trees)]
        samples = samples_from_trees(roots, AGENTS, advantage_mode="mean", normalize=True)
        started = time.perf_counter()
        recorder.train_batch(step, roots, samples)
        recording += time.perf_counter() - started
        metrics.write(json.dumps({"step": step, "train/turn_1/reward_mean": rng.random(), "train/writer/loss": rng.random()}) + "\n")
    metrics.close()
    print(f"recorder: {1000 * recording / (steps * trees):.2f} ms per tree (serializing and appending, in the trainer)")
    return steps * trees


OPEN = "window.llmMarlViewer.ready.then(() => window.llmMarlViewer.drawnAt)"
PAINT = "(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: null}).startTime"
LOADED = "performance.getEntriesByType('navigation')[0].loadEventStart"
SWITCH = """(async () => { const t0 = performance.now(); await window.llmMarlViewer.selectStep(%d);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  return [performance.now() - t0, document.querySelectorAll('#tree .node').length]; })()"""


def measure(browser: Chromium, url: str, steps: int, switches: int, rng: random.Random) -> dict[str, float]:
    started = time.perf_counter()
    browser.open(url)
    opened_ms = browser.evaluate(OPEN)
    wall_open = (time.perf_counter() - started) * 1000
    loaded_ms = browser.evaluate(LOADED)
    painted_ms = browser.evaluate(PAINT)
    times = []
    for _ in range(switches):
        ms, nodes = browser.evaluate(SWITCH % rng.randrange(steps))
        assert nodes == 1 + K, nodes
        times.append(ms)
    if browser.console_errors:
        raise RuntimeError(f"console errors: {browser.console_errors}")
    return {"first_tree_ms": round(opened_ms, 1), "first_paint_ms": None if painted_ms is None else round(painted_ms, 1), "loaded_ms": round(loaded_ms, 1), "open_wall_ms": round(wall_open, 1),
            "switch_median_ms": round(statistics.median(times), 1), "switch_max_ms": round(max(times), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trees", type=int, default=50, help="trees per step")
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--run-dir", help="where to record (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="measure the trees already recorded in --run-dir")
    ns = parser.parse_args()
    print_machine()
    if find_chromium() is None:
        raise SystemExit("no Chromium: install the Debian package `chromium`")
    run_dir = ns.run_dir or tempfile.mkdtemp(prefix="llm-marl-viewer-bench-")
    os.makedirs(run_dir, exist_ok=True)
    started = time.perf_counter()
    if ns.reuse:
        ns.steps = len(os.listdir(os.path.join(run_dir, "rollouts")))
        count = sum(1 for name in os.listdir(os.path.join(run_dir, "rollouts")) for _ in open(os.path.join(run_dir, "rollouts", name)))
    else:
        count = record_run(run_dir, ns.steps, ns.trees)
    recorded_s = time.perf_counter() - started
    started = time.perf_counter()
    page = write_page(run_dir)
    written_s = time.perf_counter() - started
    rollouts = sum(os.path.getsize(os.path.join(run_dir, "rollouts", f)) for f in os.listdir(os.path.join(run_dir, "rollouts")))
    print(f"{count} trees in {ns.steps} steps: {'reused' if ns.reuse else 'recorded'} in {recorded_s:.1f} s ({rollouts / 1e6:.1f} MB of JSON Lines); "
          f"page written in {written_s:.1f} s ({os.path.getsize(page) / 1e6:.1f} MB)")
    rng = random.Random(1)
    with Chromium.start() as browser:
        print("self-contained page:", measure(browser, "file://" + os.path.abspath(page), ns.steps, ns.switches, rng))
        server = make_server(run_dir, port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            print("served page:        ", measure(browser, f"http://127.0.0.1:{server.server_address[1]}/", ns.steps, ns.switches, rng))
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
