"""The ``emu`` command line: one parser, subcommands registered by modules.

Each module named in :data:`COMMAND_MODULES` has a ``register(subparsers)``
function that adds its subcommands; every subcommand sets ``func``, which takes
the parsed arguments and returns the exit status. :class:`UserError` from
anywhere becomes one line on stderr and exit status 2; argparse errors too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from emulator.errors import UserError, printable

COMMAND_MODULES = (
    "emulator.commands.topo",
    "emulator.commands.net",
    "emulator.commands.controller",
    "emulator.commands.schedule",
    "emulator.commands.replay",
    "emulator.commands.experiment",
    "emulator.commands.calibrate",
    "emulator.commands.analyze",
    "emulator.commands.bench",
)


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are a single line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {printable(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="emu", description="Packet-level network emulator for distributed training.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"emu: {printable(exc)}", file=sys.stderr)  # one line, whatever the input held
        return exc.exit_status
    except KeyboardInterrupt:
        print("emu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
