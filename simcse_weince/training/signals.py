"""Stop signals: Ctrl-C (SIGINT) and SIGTERM (what Slurm, Kubernetes, ``timeout`` and ``kill`` send) alike.

Inside a training loop, :class:`InterruptFlag` turns the first signal into a flag that the loop checks after each
step: the loop saves a checkpoint, says how to resume and raises :class:`Interrupted`; a second signal raises at
once. Outside the loop (loading, evaluation, between the cells of a comparison) :func:`sigterm_interrupts` makes
SIGTERM raise :class:`Interrupted` at once, as Python's own SIGINT handler raises KeyboardInterrupt. The CLI exits
with :func:`exit_code`: 128 + the signal's number, the shells' convention (130 for SIGINT, 143 for SIGTERM).

Nothing here imports torch: the CLI installs these handlers before any command loads its modules.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

logger = logging.getLogger(__name__)

#: the signals that ask a run to stop at its next step boundary
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; ``signum`` says which (a KeyboardInterrupt, so every ``except
    KeyboardInterrupt`` that handles Ctrl-C handles SIGTERM too)."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(signal_name(self.signum))


def exit_code(interruption: KeyboardInterrupt) -> int:
    """128 + the signal's number; a plain KeyboardInterrupt is Ctrl-C's (130)."""
    return 128 + getattr(interruption, "signum", int(signal.SIGINT))


def _install(signums, handler) -> dict:
    """Install ``handler`` for ``signums``; returns the previous handlers (none outside the main thread, where
    Python refuses signal handlers: signals are left alone there)."""
    previous = {}
    for signum in signums:
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:
            break
    return previous


def _restore(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM raises :class:`Interrupted` wherever the program is, as Ctrl-C raises KeyboardInterrupt: the
    stack unwinds (a run folder being replaced is put back) instead of the process dying without a word."""

    def raise_interrupted(signum, frame):
        if frame is not None and frame.f_code.co_name == "__del__":
            # an exception raised in a finalizer is printed and dropped ("Exception ignored in ..."): the stop
            # would be lost, so the signal comes again once the finalizer is done
            threading.Timer(0.01, signal.raise_signal, (signum,)).start()
            return
        raise Interrupted(signum)

    previous = _install((signal.SIGTERM,), raise_interrupted)
    try:
        yield
    finally:
        _restore(previous)


class InterruptFlag:
    """Ctrl-C (SIGINT) or SIGTERM sets a flag that the loop checks after each step, so a checkpoint can be saved at
    a clean step boundary; ``signum`` remembers which signal came (the exit code follows it). A second signal
    interrupts at once."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict = {}

    @property
    def raised(self) -> bool:
        return self.signum is not None

    def _handler(self, signum, frame):
        if self.signum is not None:
            raise Interrupted(signum)
        self.signum = signum
        if signum == signal.SIGINT:
            logger.warning("Ctrl-C: saving a checkpoint after this step (press again to quit at once)")
        else:
            logger.warning(
                "%s: saving a checkpoint after this step (a second %s quits at once)",
                signal_name(signum), signal_name(signum),
            )  # fmt: skip

    def interruption(self) -> Interrupted:
        """The exception that ends the run once its checkpoint is saved."""
        return Interrupted(self.signum if self.signum is not None else signal.SIGINT)

    def describe(self) -> str:
        """``interrupted`` (Ctrl-C) or ``interrupted by SIGTERM``, for the message that names the checkpoint."""
        if self.signum is None or self.signum == signal.SIGINT:
            return "interrupted"
        return f"interrupted by {signal_name(self.signum)}"

    def __enter__(self):
        self.previous = _install(STOP_SIGNALS, self._handler)
        return self

    def __exit__(self, *exc):
        _restore(self.previous)
        self.previous = {}
        return False
