"""Argparse ``type=`` functions that check a value's range, so a bad option is refused while parsing.

Each function here returns a converter from an option's text to its value.
A value of the wrong kind or out of range raises
:class:`argparse.ArgumentTypeError` with ``expected <what>, got '<text>'``;
:class:`emulator.cli.OneLineParser` prints it on one line naming the option,
e.g. ``emu bench: error: field 'repeat': expected an integer >= 1, got '0'
(see emu bench --help)``, and exits with status 2, before anything runs.

The converters are pure and keep no state: one parser serves many calls.
Library code checks its own inputs as well (a
:class:`~emulator.replay.ReplayConfig` can be built without the command line).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _refuse(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer ``>= minimum``, written as :func:`int` reads it (``"3"``, ``" 3"``, ``"+3"``, ``"1_000"``)."""
    expected = f"an integer >= {minimum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if value < minimum:
            raise _refuse(expected, text)
        return value

    return convert


def number(expected: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """A float, as :func:`float` reads it, for which ``accept`` holds; ``expected`` says which ones in the error.

    NaN fails every comparison, so a range written as comparisons refuses it.
    """

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if not accept(value):
            raise _refuse(expected, text)
        return value

    return convert


def positive(unit: str, *, finite: bool = False) -> Callable[[str], float]:
    """A number of ``unit`` > 0; with ``finite``, infinity is refused too."""
    if finite:
        return number(f"finite {unit} > 0", lambda x: 0 < x < math.inf)
    return number(f"{unit} > 0", lambda x: x > 0)
