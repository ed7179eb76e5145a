"""Stopping a training run safely on Ctrl-C (SIGINT) or SIGTERM (what schedulers send).

While :meth:`~llm_marl.learners.reinforce.trainer.MAGRPOTrainer.train` runs in the main thread, the
first SIGINT or SIGTERM only asks it to stop: the current dataset batch finishes, a checkpoint
is written (when the run writes one: an ``output_dir`` and ``save_final_checkpoint``), and :class:`TrainingInterrupted` is raised,
carrying the signal, the checkpoint path and the conventional exit code (130 for SIGINT, 143
for SIGTERM). A second signal stops at once: :class:`TrainingInterrupted` with no checkpoint
is raised from wherever the program is. The previous handlers are restored when training ends.

``TrainingInterrupted`` subclasses :class:`KeyboardInterrupt`, so ``except Exception`` in user
code does not swallow it.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal; ``checkpoint`` is where it can resume (None: nothing written)."""

    def __init__(self, signum: int, checkpoint: str | None, *, immediate: bool = False):
        self.signum = signum
        self.checkpoint = checkpoint
        self.immediate = immediate
        self.exit_code = _EXIT_CODES.get(signum, 128 + signum)
        name = signal.Signals(signum).name
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint written"
        super().__init__(f"stopped by {name} ({'at once' if immediate else 'at a safe point'}; {where})")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


class StopRequests:
    """Context manager: while active (main thread only), SIGINT/SIGTERM set :attr:`signum`
    instead of killing the program; a second one raises :class:`TrainingInterrupted` at once.
    ``checkpoints``: whether the stop writes a checkpoint (only what the notice says)."""

    def __init__(self, checkpoints: bool = True) -> None:
        self.checkpoints = checkpoints
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for signum in _EXIT_CODES:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            self.__exit__()
            raise TrainingInterrupted(signum, None, immediate=True)
        self.signum = signum
        then = ("and writing a checkpoint (send it again to stop at once, without a checkpoint)" if self.checkpoints
                else "(this run writes no checkpoint: no output_dir, or save_final_checkpoint off; send it again to stop at once)")
        print(
            f"\n[llm_marl] {signal.Signals(signum).name} received: stopping after this batch {then}",
            file=sys.stderr,
            flush=True,
        )
