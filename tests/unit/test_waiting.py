"""wait_until: the first truthy value, None at the deadline, errors from the condition pass through."""

from __future__ import annotations

import pytest

from emulator.base.waiting import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_returns_the_first_truthy_value():
    clock = FakeClock()
    values = iter([None, 0, "", {"installed": 3}])
    assert wait_until(lambda: next(values), 10.0, 0.5, clock=clock, sleep=clock.sleep) == {"installed": 3}
    assert clock.sleeps == [0.5, 0.5, 0.5]


def test_gives_none_at_the_deadline_without_sleeping_past_it():
    clock = FakeClock()
    assert wait_until(lambda: False, 1.2, 0.5, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps == [0.5, 0.5, pytest.approx(0.2)]
    assert clock.now == pytest.approx(1.2)


def test_asks_once_even_with_no_time():
    calls = []
    assert wait_until(lambda: calls.append(1), 0.0, clock=FakeClock(), sleep=pytest.fail) is None
    assert calls == [1]


def test_an_error_in_the_condition_ends_the_wait():
    clock = FakeClock()

    def died() -> bool:
        raise RuntimeError("controller exited")

    with pytest.raises(RuntimeError, match="controller exited"):
        wait_until(died, None, clock=clock, sleep=clock.sleep)
