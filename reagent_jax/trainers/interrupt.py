"""Clean stops: Ctrl-C or SIGTERM (a pod's preemption notice) ends a training stage at the end of
its current step, with a checkpoint there, instead of losing the steps since the last one.

The first signal sets a flag that the stage loop reads after each step; a second Ctrl-C stops at
once (`KeyboardInterrupt`, the steps since the last checkpoint are lost and said to be). The
loop then raises `StopRequested`, which `launch/train.py` turns into one line with the command
that resumes, and a non-zero exit (128 + the signal number, as a shell reports it).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Callable, Iterator, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(Exception):
    """A stage stopped on a signal after saving its checkpoint at `step`."""

    def __init__(self, stage: str, step: int, signum: int):
        self.stage, self.step, self.signum = stage, step, signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at {stage} step {step} "
                         "(checkpoint saved)")


class GracefulStop:
    """Holds the signal a stage was asked to stop by (None: keep going)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def agree(self) -> None:
        """Multi-host: every process adopts the signal any of them got, so all stop after the same
        step (one would otherwise wait forever in the next step's collectives). One tiny
        all-gather per step; nothing on a single process."""
        if jax.process_count() == 1:
            return
        got = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
        if got.max() > 0 and self.signum is None:
            self.signum = int(got.max())


@contextlib.contextmanager
def stop_on_signals(stage: str, last_checkpoint: Callable[[], int]) -> Iterator[GracefulStop]:
    """SIGINT/SIGTERM handlers for the duration of a stage (main thread only; elsewhere, e.g. a
    notebook's worker thread, signals keep their usual behaviour). `last_checkpoint()` names the
    step a forced stop would resume from."""
    stop = GracefulStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.requested and signum == signal.SIGINT:
            log.warning("%s: second Ctrl-C, stopping now; the run resumes from step %d", stage, last_checkpoint())
            raise KeyboardInterrupt
        stop.signum = signum
        log.warning("%s: %s received; finishing the current step, then saving a checkpoint "
                    "(Ctrl-C again stops now, resuming from step %d)", stage, signal.Signals(signum).name,
                    last_checkpoint())

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
