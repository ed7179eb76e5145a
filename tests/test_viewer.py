"""`llm-marl view`: the self-contained page, the loopback server, and the page in a real browser.

The browser tests open the page in headless Chromium (Debian package ``chromium``; .ci/run
installs it) and check what is rendered: the tree's node count, a selected node's answers and
advantages, no console errors; they save a screenshot under the test's tmp folder. They are
skipped, saying why, only where no Chromium is installed.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import threading
import urllib.error
import urllib.request

import pytest

from llm_marl import DialogueEnv, MAGRPOConfig, MAGRPOTrainer, TabularPolicy
from llm_marl.cli import main
from llm_marl.runs.recording import read_trees, rollout_files
from llm_marl.viewer import build_page, make_server, write_page
from llm_marl.viewer.chromium import Chromium, find_chromium
from toy_tasks import MENU, ColourMatch

NO_CHROMIUM = "no Chromium on this machine: install the Debian package `chromium` (.ci/run does) to run the browser tests"


class Tricky(ColourMatch):
    """ColourMatch whose prompts hold text that must not break the page: a closing script tag."""

    def initial_observations(self, item):
        return {a: f"item {item['id']}: {a}, name a colour </script><b>not bold</b>" for a in self.agents}

    def transition(self, item, actions, history):
        return {a: text + " </script><b>not bold</b>" for a, text in super().transition(item, actions, history).items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A small recorded run: cross mode, 2 turns, early termination, evaluations, 3 batches."""
    out = tmp_path_factory.mktemp("viewer") / "run"
    args = MAGRPOConfig(
        num_turns=2, num_generations=3, joint_mode="cross", num_train_epochs=1, agent_learning_rate=0.3,
        early_termination_threshold=1.4, eval_interval=2, eval_num_samples=2, logging_steps=1,
        progress_bar=False, output_dir=str(out), rollout_log_steps=1, seed=3,
    )
    trainer = MAGRPOTrainer(env=DialogueEnv(Tricky(num_items=3, num_turns=2)), policies=[TabularPolicy(list(MENU)), TabularPolicy(list(MENU))], args=args)
    trainer.train()
    return out


def test_view_writes_one_self_contained_file(run_dir, capsys):
    assert main(["view", str(run_dir)]) == 0
    assert f"wrote {run_dir / 'viewer.html'}" in capsys.readouterr().out
    page = (run_dir / "viewer.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?https?:""", page)  # nothing fetched
    assert page.count("<script") == 2 + len(rollout_files(run_dir))  # index + code + one inert block per step
    assert "</script><b>" not in page and "\\u003c/script>\\u003cb>" in page  # prompt text cannot close a script
    files = [path for _, _, path in rollout_files(run_dir)]
    # the step shown first (train batch 0, file 1) as plain text before the code, the others packed after it
    plain = re.findall(r'<script type="application/x-ndjson" id="rollouts-(\d+)">\n(.*?)\n</script>', page, re.S)
    assert [n for n, _ in plain] == ["1"] and page.index('id="rollouts-1"') < page.index('"use strict"')
    assert json.loads(plain[0][1].split("\n")[0]) == read_trees(files[1])[0]
    packed = re.findall(r'<script type="application/octet-stream" data-encoding="gzip\+base64" id="rollouts-(\d+)">([^<]*)</script>', page)
    assert [int(n) for n, _ in packed] == [0, 2, 3, 4] and page.index('id="rollouts-0"') > page.index('"use strict"')
    for (n, data) in packed:
        assert gzip.decompress(base64.b64decode(data)).decode() == open(files[int(n)]).read().rstrip("\n")
    index = json.loads(re.search(r'id="llm-marl-index">(.*?)</script>', page, re.S).group(1))
    assert [(e["kind"], e["step"]) for e in index["entries"]] == [
        ("eval", 0), ("train", 0), ("train", 1), ("eval", 2), ("train", 2)]
    assert index["entries"][1]["trees"] == [[0, len(read_trees(str(run_dir / "rollouts" / "step-000000.jsonl"))[0]["nodes"]),
                                              pytest.approx(index["entries"][1]["trees"][0][2])]]
    assert "train/turn_1/reward_mean" in index["metrics"]


def test_view_names_a_missing_run(tmp_path, capsys):
    assert main(["view", str(tmp_path / "nowhere")]) == 2  # bad usage, as every other command
    assert re.search(r"run directory .*nowhere.* does not exist", capsys.readouterr().err)


def test_served_page_and_files(run_dir):
    server = make_server(str(run_dir), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = urllib.request.urlopen(base + "/").read().decode()
        assert 'data-encoding="gzip+base64"' not in page and '"chunk": null' in page  # trees are fetched per step
        served = urllib.request.urlopen(base + "/rollouts/step-000001.jsonl").read().decode()
        assert served == (run_dir / "rollouts" / "step-000001.jsonl").read_text()
        for path in ("/rollouts/../metrics.jsonl", "/rollouts/%2e%2e/summary.json", "/metrics.jsonl", "/rollouts/x.jsonl"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(base + path)
    finally:
        server.shutdown()
        server.server_close()


def test_train_names_the_view_command(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--env", "CoordinationGame-v0", "--policy", "tabular", "--num_turns", "1", "--num_train_epochs", "2",
            "--eval_interval", "0", "--progress_bar", "false", "--rollout_log_steps", "1", "--output_dir", str(out)]
    assert main(argv) == 0
    assert f"llm-marl view {out}" in capsys.readouterr().out
    assert [(k, s) for k, s, _ in rollout_files(out)] == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]  # before, 2 batches, after
    from llm_marl.cli import DEFAULT_RUN

    assert DEFAULT_RUN["rollout_log_steps"] == 1  # the default run records every batch


# --- in the browser ---------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason=NO_CHROMIUM)

STATE = """(() => { const v = window.llmMarlViewer; return v.ready.then(() => ({
  nodes: document.querySelectorAll('#tree .node').length,
  early: document.querySelectorAll('#tree .node.early_terminated').length,
  edges: document.querySelectorAll('#tree .edge').length,
  info: document.getElementById('info').textContent,
  step: document.getElementById('step').selectedOptions[0].textContent,
  curves: document.querySelectorAll('#curves .chart').length })); })()"""

ANSWERS = """Array.from(document.querySelectorAll('#node-panel tr.answer')).map(tr => ({
  agent: tr.dataset.agent, k: Number(tr.dataset.k), text: tr.querySelector('.text').textContent,
  ret: Number(tr.querySelector('.return').dataset.value), adv: Number(tr.querySelector('.adv').dataset.value),
  base: Number(tr.querySelector('.adv-baseline').dataset.value), colour: tr.style.background }))"""


def answers_of(node, agents):
    return [
        {"agent": a, "k": k, "text": c["text"], "ret": node["agents"][a]["returns"][k],
         "adv": node["agents"][a]["advantages"][k], "base": node["agents"][a]["advantages_baseline"][k]}
        for a in agents for k, c in enumerate(node["agents"][a]["completions"])
    ]


@needs_chromium
def test_page_in_chromium(run_dir, tmp_path):
    page = write_page(str(run_dir), str(tmp_path / "viewer.html"))
    records = read_trees(str(run_dir / "rollouts" / "step-000001.jsonl"))
    record = records[0]
    with Chromium.start() as browser:
        browser.open("file://" + page)
        first = browser.evaluate(STATE)
        assert first["step"].startswith("train batch 0")  # opens on the first train step
        # switch to train batch 1 as a person would: the step <select> fires "change"
        browser.evaluate("(() => { const s = document.getElementById('step'); s.value = '2'; s.dispatchEvent(new Event('change')); return window.llmMarlViewer.selectTree(0); })()")
        shown = browser.evaluate(STATE)
        assert shown["step"].startswith("train batch 1")
        assert shown["nodes"] == len(record["nodes"])
        assert shown["early"] == sum(n["status"] == "early_terminated" for n in record["nodes"])
        assert shown["edges"] == sum(c is not None for n in record["nodes"] for c in n["children"])
        assert shown["curves"] >= 4 and f"item {record['item']}" in shown["info"]
        # click a node of turn 2: its agents' answers, returns and advantages
        chosen = next(n for n in record["nodes"] if n["turn"] == 1)
        browser.evaluate(f"document.querySelector('#tree .node[data-id=\"{chosen['id']}\"]').dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        rows = browser.evaluate(ANSWERS)
        assert [{k: r[k] for k in ("agent", "k", "text", "ret", "adv", "base")} for r in rows] == answers_of(chosen, record["agents"])
        positive = [r for r in rows if r["adv"] > 0]
        negative = [r for r in rows if r["adv"] < 0]
        assert positive and negative
        assert all("39, 174, 96" in r["colour"] for r in positive) and all("192, 57, 43" in r["colour"] for r in negative)
        prompt = browser.evaluate("document.querySelector('#node-panel .agent[data-agent=\"left\"] .prompt').textContent")
        assert prompt == chosen["observations"]["left"] and "</script><b>not bold</b>" in prompt
        heading = browser.evaluate("document.querySelector('#node-panel h2').textContent")
        assert heading.startswith(f"node {chosen['id']} · turn 2") and f"j{chosen['parent_joint']}" in heading
        shot = browser.screenshot(str(tmp_path / "viewer.png"))
        assert browser.console_errors == []
    assert os.path.getsize(shot) > 10_000


@needs_chromium
def test_served_page_loads_steps_from_the_server(run_dir, tmp_path):
    server = make_server(str(run_dir), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    record = read_trees(str(run_dir / "rollouts" / "eval-000002.jsonl"))[1]
    try:
        with Chromium.start() as browser:
            browser.open(f"http://127.0.0.1:{server.server_address[1]}/")
            browser.evaluate("window.llmMarlViewer.ready.then(() => window.llmMarlViewer.selectStep(3)).then(() => window.llmMarlViewer.selectTree(1))")
            shown = browser.evaluate(STATE)
            assert shown["step"].startswith("eval before batch 2") and shown["nodes"] == len(record["nodes"])
            rows = browser.evaluate(ANSWERS.replace("Number(tr.querySelector('.adv').dataset.value)", "tr.querySelector('.adv').textContent")
                                    .replace("Number(tr.querySelector('.adv-baseline').dataset.value)", "null"))
            assert [(r["agent"], r["text"], r["ret"], r["adv"]) for r in rows] == [
                (a, record["nodes"][0]["agents"][a]["completions"][0]["text"], record["nodes"][0]["agents"][a]["returns"][0], "–")
                for a in record["agents"]]  # evaluation episodes: one answer each, no advantages
            browser.screenshot(str(tmp_path / "served.png"))
            assert browser.console_errors == []
    finally:
        server.shutdown()
        server.server_close()


@needs_chromium
def test_a_broken_page_is_caught(tmp_path):
    """The console-error check itself: a page that throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><script>null.x</script><p>hi</p>")
    with Chromium.start() as browser:
        browser.open(page.as_uri())
        assert browser.evaluate("document.querySelector('p').textContent") == "hi"
        assert len(browser.console_errors) == 1 and "null" in browser.console_errors[0]


def test_build_page_without_recordings(tmp_path):
    page = build_page(str(tmp_path))
    assert '"entries": []' in page


def test_item_list_from_lines_in_any_key_order(run_dir, tmp_path):
    """The item list is read from each line's leading keys; a line written with other key order
    (by hand, by another tool) is parsed whole and gives the same summary."""
    (tmp_path / "rollouts").mkdir()
    source = (run_dir / "rollouts" / "step-000000.jsonl").read_text().splitlines()
    record = json.loads(source[0])
    (tmp_path / "rollouts" / "step-000000.jsonl").write_text(json.dumps(record, sort_keys=True) + "\n")
    page = build_page(str(tmp_path))
    index = json.loads(re.search(r'id="llm-marl-index">(.*?)</script>', page, re.S).group(1))
    expected = [record["item"], len(record["nodes"]), sum(record["nodes"][0]["rewards"]) / len(record["nodes"][0]["rewards"])]
    assert index["entries"][0]["trees"] == [pytest.approx(expected)]
    assert build_page(str(run_dir)).count(f'[{record["item"]}, {len(record["nodes"])}, ') >= 1
    (tmp_path / "rollouts" / "step-000000.jsonl").write_text('{"item": 1}\n')
    with pytest.raises(ValueError, match=r"step-000000.jsonl, line 1: not a recorded rollout tree"):
        build_page(str(tmp_path))


def test_browser_failures_are_named(monkeypatch):
    from llm_marl.viewer.chromium import BrowserError

    monkeypatch.setenv("LLM_MARL_CHROMIUM", "/bin/false")  # a "browser" that exits at once
    with pytest.raises(BrowserError, match=r"Target.createTarget: Chromium (exited with code 1|closed its DevTools pipe).*; Chromium.s stderr ends with"):
        Chromium.start(timeout=20)  # both attempts fail, the last error is raised
    monkeypatch.delenv("LLM_MARL_CHROMIUM")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_chromium() is None
    with pytest.raises(BrowserError, match="no Chromium found"):
        Chromium()


@needs_chromium
def test_actor_critic_page_shows_the_critic(tmp_path):
    """The critic's values and targets per answer; with agent_advantage_normalization [true,
    false] the recorded advantages of left are null (whitened only at the update) and right's are
    y - V as trained, and the legend names the normalized agent."""
    from llm_marl.learners import IACConfig, IACTrainer

    args = IACConfig(num_turns=2, num_generations=2, num_train_epochs=1, agent_learning_rate=0.1, critic_learning_rate=0.1,
                     eval_interval=0, logging_steps=1, progress_bar=False, early_termination_threshold=None,
                     output_dir=str(tmp_path / "run"), rollout_log_steps=1, seed=3, agent_advantage_normalization=[True, False])
    IACTrainer(env=DialogueEnv(ColourMatch(num_items=1, num_turns=2)),
               policies=[TabularPolicy(list(MENU)), TabularPolicy(list(MENU))], args=args).train()
    node = read_trees(str(tmp_path / "run" / "rollouts" / "step-000000.jsonl"))[0]["nodes"][0]
    with Chromium.start() as browser:
        browser.open("file://" + write_page(str(tmp_path / "run")))
        rows = browser.evaluate("window.llmMarlViewer.ready.then(() => Array.from(document.querySelectorAll('#node-panel tr.answer')).map("
                                "tr => [Number(tr.querySelector('.value').dataset.value), Number(tr.querySelector('.target').dataset.value)]))")
        assert rows == [[v, t] for a in ("left", "right") for v, t in zip(node["agents"][a]["critic"]["values"], node["agents"][a]["critic"]["targets"])]
        assert browser.evaluate("document.querySelector('#node-panel .legend').textContent").endswith("normalized for left")
        assert browser.console_errors == []
    right = node["agents"]["right"]
    assert node["agents"]["left"]["advantages"] is None
    assert right["advantages"] == pytest.approx([y - v for y, v in zip(right["critic"]["targets"], right["critic"]["values"])], abs=1e-6)
