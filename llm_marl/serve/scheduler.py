"""The batching scheduler: concurrent requests share decoding steps.

Requests arrive on the web server's event loop; the model runs on ONE worker thread that
:class:`Scheduler` owns. :meth:`Scheduler.submit` queues a :class:`~llm_marl.serve.batch.Job`
and returns a ``concurrent.futures.Future`` of it. Whenever the worker is free it takes every
queued job that runs on the same model as the oldest one (a full model's agent, or any agent of
a LoRA team: :func:`~llm_marl.serve.batch.engine_of`), up to ``max_batch_rows`` answers, and
decodes them together (:func:`~llm_marl.serve.batch.decode_jobs`). Requests that arrive while a
batch decodes wait for the next one, so the more requests are pending, the more rows each decode
step serves: throughput grows with concurrency (static batching; a request does not join a
decode already under way).

Before taking a batch the worker waits a moment (``gather_seconds``, 50 ms at most) until the
queue holds as many requests as the last batch had plus those that were queued when it ended:
clients that the last batch answered send their next requests a little later, and without the
wait they would form a second batch that alternates with the first, halving the rows per step.
A lone client (a batch of one, nothing queued) never waits.

Limits: at most ``max_queue`` requests waiting or decoding (:meth:`submit` raises a 429
:class:`~llm_marl.serve.protocol.APIError` past it). A job whose decode raises gets that error
(the worker and every other request go on). :attr:`Scheduler.records` keeps the latest batches
(:class:`~llm_marl.serve.batch.BatchRecord`: requests, rows, steps, tokens), which is how a test
sees that concurrent requests were decoded in one batch. :meth:`Scheduler.hold` pauses the
worker between batches (requests still queue): tests line requests up with it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from typing import Any, Iterator

from llm_marl.serve import protocol
from llm_marl.serve.batch import BatchRecord, Job, decode_jobs, engine_of

__all__ = ["Scheduler"]

log = logging.getLogger("llm_marl.serve")


class Scheduler:
    """Queues jobs and decodes them in batches on one worker thread (see the module docstring).

    Args:
        max_queue: requests waiting or decoding at most; more get a 429.
        max_batch_rows: answers (rows) decoded together at most (a bigger request runs alone).
        gather_seconds: before a batch, wait up to this long for the clients the previous batch
            answered to send their next requests (see the module docstring).
    """

    def __init__(self, max_queue: int = 256, max_batch_rows: int = 64, gather_seconds: float = 0.05) -> None:
        if max_queue < 1 or max_batch_rows < 1:
            raise ValueError(f"max_queue and max_batch_rows must be >= 1, got {max_queue} and {max_batch_rows}")
        self.max_queue = max_queue
        self.max_batch_rows = max_batch_rows
        self.gather_seconds = gather_seconds
        self._last_jobs = 0
        self.records: collections.deque[BatchRecord] = collections.deque(maxlen=1000)
        """The latest batches, oldest first."""
        self._queue: collections.deque[tuple[Job, concurrent.futures.Future]] = collections.deque()
        self._active = 0
        self._held = 0
        self._stopping = False
        self._changed = threading.Condition()
        self._model_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the caller's side

    def start(self) -> "Scheduler":
        """Start the worker thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="llm-marl-serve-decoder", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the worker after its current batch; queued jobs get a 503-like server error."""
        with self._changed:
            self._stopping = True
            waiting = list(self._queue)
            self._queue.clear()
            self._changed.notify_all()
        for job, future in waiting:
            job.cancelled.set()
            if future.set_running_or_notify_cancel():
                future.set_exception(protocol.server_error("the server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue ``job``; its future gets the job back, decoded (or the error that stopped it).
        A 429 :class:`~llm_marl.serve.protocol.APIError` when ``max_queue`` requests are in."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._changed:
            if self._stopping:
                raise protocol.server_error("the server is shutting down")
            if self._active >= self.max_queue:
                raise protocol.queue_full(self.max_queue)
            self._active += 1
            self._queue.append((job, future))
            self._changed.notify_all()
        return future

    def cancel(self, job: Job) -> None:
        """End ``job``: dropped if still queued, its rows ended at the next step if decoding."""
        job.cancelled.set()
        with self._changed:
            for entry in list(self._queue):
                if entry[0] is job:
                    self._queue.remove(entry)
                    self._active -= 1
                    entry[1].cancel()

    @property
    def pending(self) -> int:
        """Jobs queued, not yet decoding."""
        with self._changed:
            return len(self._queue)

    @property
    def active(self) -> int:
        """Jobs queued or decoding."""
        with self._changed:
            return self._active

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Within: the worker takes no new batch (the one decoding finishes); jobs still queue."""
        with self._changed:
            self._held += 1
        try:
            yield
        finally:
            with self._changed:
                self._held -= 1
                self._changed.notify_all()

    def wait_pending(self, count: int, timeout: float = 60.0) -> bool:
        """Block until at least ``count`` jobs are queued (tests); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._queue) >= count, timeout)

    # ------------------------------------------------------------------ the worker

    def _take(self) -> list[tuple[Job, concurrent.futures.Future]] | None:
        with self._changed:
            self._changed.wait_for(lambda: self._stopping or (self._queue and not self._held))
            if self._stopping:
                return None
            self._gather()
            if self._stopping or not self._queue:
                return None if self._stopping else []
            engine = engine_of(self._queue[0][0].policy)
            batch, rows, rest = [], 0, collections.deque()
            while self._queue:
                job, future = self._queue.popleft()
                same = engine_of(job.policy) is engine
                if same and (not batch or rows + job.rows <= self.max_batch_rows):
                    batch.append((job, future))
                    rows += job.rows
                else:
                    rest.append((job, future))
            self._queue = rest
            return batch

    def _gather(self) -> None:
        """Wait (the lock released), up to ``gather_seconds``, until the queue holds as many jobs
        as the last batch had plus those queued when it ended: the clients it answered, if they
        come back at once, join this batch."""
        target = min(self._last_jobs + len(self._queue), self.max_batch_rows)
        self._last_jobs = 0
        deadline = time.monotonic() + self.gather_seconds
        while not self._stopping and not self._held and len(self._queue) < target:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.wait(left)

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            live = [(job, future) for job, future in batch if future.set_running_or_notify_cancel()]
            try:
                if live:
                    record = decode_jobs([job for job, _ in live], self._model_lock)
                    self.records.append(record)
                    self._last_jobs = len(live)
                for job, future in live:
                    future.set_result(job)
            except BaseException as exc:  # one batch failed: its requests get the error, the server goes on
                log.exception("llm-marl serve: a batch of %d request(s) failed", len(live))
                error = protocol.server_error(f"{type(exc).__name__}: {exc}")
                for _, future in live:
                    if not future.done():
                        future.set_exception(error)
            finally:
                with self._changed:
                    self._active -= len(batch)
                    self._changed.notify_all()
