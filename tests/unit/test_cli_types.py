"""The argparse ``type=`` range checks and how the ``emu`` parser words an option's error."""

from __future__ import annotations

import argparse
import math

import pytest

from emulator.cli import arguments as cli_types
from emulator.cli.main import main


def test_int_at_least_reads_what_int_reads_and_refuses_below_the_minimum():
    at_least_1 = cli_types.int_at_least(1)
    assert [at_least_1(t) for t in ("1", " 7", "+3", "1_000")] == [1, 7, 3, 1000]
    for text, given in (("0", "'0'"), ("-2", "'-2'"), ("x", "'x'"), ("", "''"), ("1.5", "'1.5'")):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            at_least_1(text)
        assert str(err.value) == f"expected an integer >= 1, got {given}"


def test_numbers_refuse_nan_and_what_the_range_leaves_out():
    seconds = cli_types.positive("seconds")
    assert seconds("0.5") == 0.5 and seconds("inf") == math.inf
    finite = cli_types.positive("milliseconds", finite=True)
    assert finite("1e-3") == 1e-3
    cases = ((seconds, "0", "seconds > 0"), (seconds, "nan", "seconds > 0"), (seconds, "-1", "seconds > 0"),
             (finite, "inf", "finite milliseconds > 0"), (finite, "x", "finite milliseconds > 0"),
             (cli_types.number("Mbit/s in (0, 1000]", lambda x: 0 < x <= 1000), "1000.5", "Mbit/s in (0, 1000]"))
    for convert, text, expected in cases:
        with pytest.raises(argparse.ArgumentTypeError) as err:
            convert(text)
        assert str(err.value) == f"expected {expected}, got {text!r}"


@pytest.mark.parametrize("argv, line", [
    (["bench", "--repeat", "0"],
     "emu bench: error: field 'repeat': expected an integer >= 1, got '0' (see emu bench --help)"),
    (["replay", "s.yaml", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--timeout", "nan"],
     "emu replay: error: field 'timeout': expected seconds > 0, at most 7 days (604800 s), got 'nan' (see emu replay --help)"),
    (["schedule", "check", "s.yaml", "--gamma", "inf"],
     "emu schedule check: error: field 'gamma': expected a finite number >= 0, got 'inf' "
     "(see emu schedule check --help)"),
    (["up", "star:hosts=2", "--ecmp-seed", "-1"],
     "emu up: error: field 'ecmp-seed': expected an integer in 0..4294967295, got '-1' (see emu up --help)"),
    (["topo", "export", "star:hosts=2", "-o"],  # an option with a short name is named by its long one
     "emu topo export: error: field 'output': expected one argument (see emu topo export --help)"),
    (["up", "star:hosts=2", "--datapath", "x"],
     "emu up: error: field 'datapath': invalid choice: 'x' (choose from 'auto', 'user', 'kernel') "
     "(see emu up --help)"),
    (["topo", "show"],  # not about an option: argparse's words
     "emu topo show: error: the following arguments are required: SPEC (see emu topo show --help)"),
])
def test_an_option_error_is_one_line_naming_the_field_and_status_2(argv, line, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", line + "\n")


def test_a_bad_subcommand_keeps_argparse_words_and_help_exits_0(capsys):
    assert main(["bogus"]) == 2
    assert capsys.readouterr().err.startswith("emu: error: argument COMMAND: invalid choice: 'bogus' (choose from ")
    assert main(["bench", "--help"]) == 0
    assert "--bringup-rounds N" in capsys.readouterr().out
