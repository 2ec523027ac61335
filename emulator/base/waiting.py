"""Waiting for a condition with a deadline: the one polling loop of the project.

:func:`wait_until` calls ``ready`` every ``interval_s`` until it returns
something truthy (returned) or ``timeout_s`` passes (None). A condition that
can never come true any more (a process that died) raises from ``ready``, so
the caller's error names what happened rather than "timed out".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(ready: Callable[[], T], timeout_s: float | None, interval_s: float = 0.05, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T | None:
    """The first truthy value of ``ready()``, or None once ``timeout_s`` has passed (never, for None).

    ``ready`` is called at least once, even with a timeout of 0.
    """
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        value = ready()
        if value:
            return value
        now = clock()
        if deadline is not None and now >= deadline:
            return None
        sleep(interval_s if deadline is None else max(0.0, min(interval_s, deadline - now)))
