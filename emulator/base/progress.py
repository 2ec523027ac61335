"""A long job's progress on the console: a bar on a terminal, a line every few seconds otherwise.

:class:`Meter` counts what a job has done of what it has to do (cells proved
and predicted, trace files imported, ...) and shows it on its stream (stderr
by default, so a command's own output stays as it was), from a thread of its
own, so that one step that takes a minute still shows the time going on:

* on a terminal (the stream's ``isatty``): one line redrawn in place,
  ``what [######------] n/N unit, 12s``, once the job has run
  :data:`QUIET_S` (a shorter job shows nothing); cleared when the job ends,
  so the command's output follows on a clean line;
* otherwise (a log, a pipe, CI): ``what: n/N unit, 12s`` every
  :data:`EVERY_S`, and, when it said anything, one last line with the total
  time when the job ends.

A job of unknown length (``total`` 0) shows its elapsed time alone. Counting
(:meth:`Meter.advance`) costs the caller one addition; the rest happens in
:meth:`Meter.poll`, which the meter's thread calls and tests call themselves,
with a clock of their own. Also the console's two formats,
:func:`format_duration` and :func:`progress_bar`. Pure: it writes only to the
stream it is given.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

#: A job shorter than this shows no bar on a terminal.
QUIET_S = 2.0
#: Seconds between two lines when the stream is not a terminal.
EVERY_S = 10.0
#: Seconds between two redraws of the bar on a terminal.
REDRAW_S = 0.25


def format_duration(seconds: float) -> str:
    """``42s``, ``1m01s``, ``1h02m`` (rounded to the second; negative reads as 0)."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def progress_bar(done: int, total: int, width: int = 24) -> str:
    """``[######------]``: ``done`` of ``total`` in ``width`` characters (full when there is nothing to do)."""
    filled = min(width, int(width * done / total)) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object without a terminal
        return False


class Meter:
    """``what``: ``done`` of ``total`` ``unit`` (0: unknown), shown on ``stream`` as the module docstring says.

    Use it as a context manager (its thread runs inside the ``with``), call
    :meth:`advance` after each piece and :meth:`phase` when the job goes on
    with a count of another kind.
    """

    def __init__(self, what: str, total: int = 0, unit: str = "", *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None,
                 every_s: float = EVERY_S, quiet_s: float = QUIET_S):
        self.stream = sys.stderr if stream is None else stream
        self.tty = _isatty(self.stream) if tty is None else tty
        self.clock, self.every_s, self.quiet_s = clock, every_s, quiet_s
        self.what, self.total, self.unit, self.done = what, total, unit, 0
        self.start = self.last_line = clock()
        self.said = False  # a line was written (not a terminal)
        self.drawn = 0  # width of the bar on screen (a terminal)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def advance(self, n: int = 1) -> None:
        """``n`` more pieces done."""
        self.done += n

    def phase(self, what: str, total: int = 0, unit: str = "") -> None:
        """The job goes on with ``total`` pieces of another kind; the time counts on."""
        self.what, self.total, self.unit, self.done = what, total, unit, 0

    def count(self) -> str:
        """``3/8 cells``, or nothing for a job of unknown length."""
        if not self.total:
            return ""
        return f"{min(self.done, self.total)}/{self.total}" + (f" {self.unit}" if self.unit else "")

    def poll(self) -> None:
        """Redraw the bar (a terminal) or write the periodic line when it is due."""
        now = self.clock()
        elapsed = format_duration(now - self.start)
        count = self.count()
        with self._lock:
            if self.tty:
                if now - self.start >= self.quiet_s:
                    bar = f" {progress_bar(self.done, self.total)}" if self.total else ""
                    self._draw(f"{self.what}{bar} {count + ', ' if count else ''}{elapsed}")
            elif now - self.last_line >= self.every_s:
                self.stream.write(f"{self.what}: {count + ', ' if count else ''}{elapsed}\n")
                self.stream.flush()
                self.last_line, self.said = now, True

    def _draw(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self.drawn))
        self.stream.flush()
        self.drawn = len(text)

    def close(self) -> None:
        """Stop the thread; clear the bar, or write the last line when the periodic ones said anything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.drawn:
                self.stream.write("\r" + " " * self.drawn + "\r")
                self.stream.flush()
                self.drawn = 0
            elif self.said:
                count = self.count()
                self.stream.write(f"{self.what}: {count + ' ' if count else ''}done in "
                                  f"{format_duration(self.clock() - self.start)}\n")
                self.stream.flush()
                self.said = False

    def _run(self) -> None:
        interval = REDRAW_S if self.tty else min(1.0, max(REDRAW_S, self.every_s))
        while not self._stop.wait(interval):
            self.poll()

    def __enter__(self) -> Meter:
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
