"""Argparse ``type=`` functions that check a value's range, so a bad option is refused while parsing.

Each function here returns a converter from an option's text to its value.
A value of the wrong kind or out of range raises
:class:`argparse.ArgumentTypeError` with ``expected <what>, got '<text>'``;
:class:`emulator.cli.main.OneLineParser` prints it on one line naming the option,
e.g. ``emu bench: error: field 'repeat': expected an integer >= 1, got '0'
(see emu bench --help)``, and exits with status 2, before anything runs.

The converters are pure and keep no state: one parser serves many calls.
Library code checks its own inputs as well (a
:class:`~emulator.emulation.session.replay.ReplayConfig` can be built without the command line).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from emulator.base.errors import UserError, printable
from emulator.model import cluster_placement, fabric
from emulator.runs import cluster_file
from emulator.runs.admission import MAX_DURATION_S, MAX_DURATION_TEXT, parse_duration
from emulator.runs.cluster_file import ClusterRun


def _refuse(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer ``>= minimum`` (and ``<= maximum`` when given), written as :func:`int` reads it (``"3"``,
    ``" 3"``, ``"+3"``, ``"1_000"``)."""
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if value < minimum or (maximum is not None and value > maximum):
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


def timeout_seconds(text: str) -> float:
    """Seconds > 0, at most :data:`emulator.runs.admission.MAX_DURATION_S` (NaN and infinity refused)."""
    return number(f"seconds > 0, {MAX_DURATION_TEXT}", lambda x: 0 < x <= MAX_DURATION_S)(text)


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``30min`` or ``1.5h`` (> 0, at most
    :data:`emulator.runs.admission.MAX_DURATION_S`; :func:`emulator.runs.admission.parse_duration`)."""
    try:
        return parse_duration(text)
    except (ValueError, OverflowError):
        raise _refuse(f"a duration > 0 such as 1800, 90s, 30m or 2h, {MAX_DURATION_TEXT}", text) from None


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cluster CLUSTER`` and ``--placement FILE``: run over a cluster's servers (docs/cluster.md)."""
    parser.add_argument("--cluster", metavar="CLUSTER", default=None,
                        help="spread the network over this cluster file's servers (docs/cluster.md); run on its head")
    parser.add_argument("--placement", metavar="FILE", default=None,
                        help="with --cluster: a placement file ({server: [node, ...]}) on top of the computed one")


def cluster_run(args: argparse.Namespace) -> ClusterRun | None:
    """The cluster file and placement file the arguments name, read and checked (None without ``--cluster``)."""
    if args.placement and not args.cluster:
        raise UserError("field 'placement': expected it with --cluster, got a placement file alone")
    if not args.cluster:
        return None
    cluster = cluster_file.load(args.cluster)
    cluster.require_private_underlay(f"cluster file {printable(args.cluster)}")
    if not args.placement:
        return ClusterRun(cluster)
    overrides = cluster_placement.read_overrides(args.placement, cluster.names)
    return ClusterRun(cluster, overrides, printable(args.placement))


def fabric_choice(text: str | None, command: str) -> fabric.FabricChoice:
    """``--fabric``'s text as the user's :class:`~emulator.model.fabric.FabricChoice`: where every command parses
    it, once (errors read ``<command>: fabric: field '<key>': ...``)."""
    return fabric.choose(text, where=f"{command}: fabric")
