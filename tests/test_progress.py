"""Every long phase shows progress with an estimate (issue 35): evaluation counts items done of
total, moving while one batch decodes; building the tiny model counts its pre-training steps.
(Fetching and converting a named model: tests/test_named_models.py.)"""

from __future__ import annotations

import pytest

from llm_marl.runs import progress


class Recorder:
    """A stand-in bar that keeps every count it was moved to."""

    def __init__(self, total, desc, unit):
        self.total, self.desc, self.unit, self.n, self.seen = total, desc, unit, 0, []

    def update(self, n=1):
        self.n += n
        self.seen.append(self.n)

    def close(self):
        pass


@pytest.fixture
def shown(monkeypatch):
    bars: list[Recorder] = []

    def bar(total, desc, unit, *, show=True):
        if not show:
            return progress.Quiet()
        bars.append(Recorder(total, desc, unit))
        return bars[-1]

    monkeypatch.setattr(progress, "bar", bar)
    previous = progress.enable(True)
    yield bars
    progress.enable(previous)


def _tiny_trainer(tmp_path, **fields):
    from llm_marl.cli import DEFAULT_RUN, build_trainer

    options = dict(DEFAULT_RUN, train_items=4, eval_num_samples=6, eval_batch_size=6, max_new_tokens=8,
                   output_dir=str(tmp_path / "run"), rollout_log_steps=0)
    options.update(fields)
    return build_trainer(options)


def test_an_evaluation_counts_items_done_of_total_while_one_batch_decodes(tmp_path, shown):
    trainer = _tiny_trainer(tmp_path)
    trainer.evaluate()
    [bar] = [b for b in shown if b.desc == "evaluating"]
    assert bar.total == 6 and bar.unit == "item" and bar.n == 6
    inside = [n for n in bar.seen if 0 < n < 6]
    assert inside, f"the bar only moved at the end of the batch: {bar.seen}"
    assert bar.seen == sorted(bar.seen)


def test_an_evaluation_of_several_batches_counts_each(tmp_path, shown):
    trainer = _tiny_trainer(tmp_path, eval_batch_size=2)
    trainer.evaluate()
    [bar] = [b for b in shown if b.desc == "evaluating"]
    assert {2, 4, 6} <= set(bar.seen) and bar.n == 6


def test_no_bar_without_progress_bar(tmp_path, shown):
    trainer = _tiny_trainer(tmp_path, progress_bar=False)
    trainer.evaluate()
    assert not [b for b in shown if b.desc == "evaluating"]


def test_building_the_tiny_model_counts_its_steps_and_says_it_happens_once(tmp_path, capsys):
    from llm_marl.policies.tiny import build_tiny_model

    corpus = ["The quick brown fox jumps over the lazy dog. " * 4, "A second short passage of plain words. " * 4] * 4
    previous = progress.enable(True)
    try:
        build_tiny_model(tmp_path / "tiny", corpus=corpus, vocab_size=300, n_embd=16, n_head=2, n_layer=1,
                         n_positions=32, pretrain_steps=3, batch_size=2)
    finally:
        progress.enable(previous)
    err = capsys.readouterr().err
    assert "building the tiny model once" in err and "3 pre-training steps" in err
    assert "3/3" in err
    assert "loss_type" not in err


def test_phase_says_the_estimate_and_the_time_taken(capsys):
    with progress.phase("converting x (once)", "about 40 s", show=True):
        pass
    err = capsys.readouterr().err
    assert "llm-marl: converting x (once) (about 40 s) ..." in err
    assert "llm-marl: converting x (once): done in 0 s" in err
    with progress.phase("quiet", "about 1 s", show=False):
        pass
    assert capsys.readouterr().err == ""
