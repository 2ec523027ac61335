"""The ``emu`` command line: one parser, subcommands registered by modules.

Each module named in :data:`COMMAND_MODULES` has a ``register(subparsers)``
function that adds its subcommands; every subcommand sets ``func``, which takes
the parsed arguments and returns the exit status. :class:`UserError` from
anywhere becomes one line on stderr and exit status 2; argparse errors too.
Options whose range argparse checks use the ``type=`` functions of
:mod:`emulator.cli.arguments`; an error about an option's value names it as
``field '<option>'``, like every other error about a field.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from emulator.base.errors import MAX_LINE, UserError, printable, shorten

COMMAND_MODULES = (
    "emulator.cli.commands.topo",
    "emulator.cli.commands.net",
    "emulator.cli.commands.controller",
    "emulator.cli.commands.schedule",
    "emulator.cli.commands.replay",
    "emulator.cli.commands.mpirun",
    "emulator.cli.commands.experiment",
    "emulator.cli.commands.calibrate",
    "emulator.cli.commands.analyze",
    "emulator.cli.commands.bench",
    "emulator.cli.commands.cluster",
    "emulator.cli.commands.nccl_tests",
    "emulator.cli.commands.validate",
)


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are a single line and exit status 2.

    An error about an option's value reads ``field '<option>': <message>``
    (``<option>`` without its dashes), e.g. ``emu bench: error: field
    'repeat': expected an integer >= 1, got '0' (see emu bench --help)``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("exit_on_error", False)  # argument errors reach parse_known_args below, not error()
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]  # typeshed overloads it
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as exc:
            self.error(argument_message(exc))

    def error(self, message: str) -> NoReturn:
        self.exit(2, one_line(f"{self.prog}: error: {printable(message)} (see {self.prog} --help)") + "\n")


def one_line(message: str) -> str:
    """An error line as printed: the last guard, after every message cut what it echoes, that none is longer than
    :data:`~emulator.base.errors.MAX_LINE` characters, whatever the input held."""
    return shorten(printable(message), MAX_LINE)


def argument_message(exc: argparse.ArgumentError) -> str:
    """An argparse error as one message: an option's is ``field 'name': ...``, others as argparse words them."""
    name = exc.argument_name or ""
    if name.startswith("-"):  # "--repeat", or "-o/--output"
        return f"field '{name.split('/')[-1].lstrip('-')}': {exc.message}"
    return str(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="emu", description="Packet-level network emulator for distributed training.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed on one line (2)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(one_line(f"emu: {printable(exc)}"), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("emu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
