"""Fuzzing topology specs: any string or mapping either builds or is one clean UserError (CLI: one line, status 2)."""

from __future__ import annotations

import contextlib
import io
from unittest import mock

from fuzz_support import FUZZ
from hypothesis import given
from hypothesis import strategies as st

from emulator.base.errors import UserError
from emulator.cli import main as cli
from emulator.model import topology

#: Every registered kind and its keys (a new kind is fuzzed with no change here), then the rate and server keys.
KINDS = list(topology.KINDS)
KEYS = [key for kind in topology.KINDS.values() for key in kind.keys] + [
    "bw", "host_bw", "switch_bw", "servers", "accels_per_server", "nics_per_server", "pcie_bw", "nic_placement"]
# Small integers keep the specs that do build small; a few large and odd ones test the limits.
NUMBERS = st.one_of(st.integers(-2, 9), st.sampled_from([16, 40, 513, 1025, 10**9, 2**64]))
VALUES = st.one_of(
    NUMBERS.map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["packed", "spread", "hdrm", " 4 ", "0x10", "1_0", "1e3", "nan", "-inf", "", "true", "٣"]),
    st.text(max_size=6),
)
NAMES = st.one_of(st.sampled_from(KEYS), st.text(max_size=8))


@st.composite
def spec_strings(draw) -> str:
    kind = draw(st.one_of(st.sampled_from(KINDS), st.text(max_size=6)))
    pairs = draw(st.lists(st.tuples(NAMES, VALUES), max_size=9))
    joiner = draw(st.sampled_from([",", ",", ",", ", ", ",,", ";"]))
    body = joiner.join(draw(st.sampled_from(["{}={}", "{}={}", "{}", "{}=={}", "{} = {}"])).format(k, v)
                       for k, v in pairs)
    return draw(st.sampled_from(["{}:{}", "{}:{}", "{}{}", "{}:{},", ":{}{}"])).format(kind, body)


SPECS = st.one_of(spec_strings(), st.text(max_size=40))
MAPPING_VALUES = st.one_of(NUMBERS, st.floats(), st.booleans(), st.none(), VALUES,
                           st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                                   st.integers(), max_size=1))
MAPPINGS = st.dictionaries(st.one_of(NAMES, st.just("kind"), st.integers(0, 3)),
                           st.one_of(MAPPING_VALUES, st.sampled_from(KINDS)), max_size=9)


def _builds_or_user_error(spec: object) -> None:
    try:
        topology.parse_spec(spec)  # type: ignore[arg-type]
        topo = topology.build(spec)  # type: ignore[arg-type]
    except UserError as exc:
        assert "\n" not in str(exc), str(exc)
        return
    assert topology.build(topo.spec) == topo  # whatever builds has a canonical spec that rebuilds it
    assert len(topo.hosts) <= topology.MAX_HOSTS and len(topo.switches) <= topology.MAX_SWITCHES


@FUZZ
@given(SPECS)
def test_spec_strings_build_or_raise_one_user_error(spec):
    _builds_or_user_error(spec)


@FUZZ
@given(st.one_of(MAPPINGS, MAPPINGS.map(lambda m: {"kind": "bigraph", "upper": 2, "lower": 2,
                                                   "hosts_per_switch": 2, **m}),
                 st.builds(lambda s, a, n, p: {"kind": "star", "hosts": 6, "servers": s, "accels_per_server": a,
                                               "nics_per_server": n, "nic_placement": p},
                           MAPPING_VALUES, MAPPING_VALUES, MAPPING_VALUES, MAPPING_VALUES)))
def test_spec_mappings_build_or_raise_one_user_error(spec):
    _builds_or_user_error(spec)


PARSER = cli.build_parser()  # built once: building it is most of a call's time, and parsers are reusable


@FUZZ
@given(SPECS.filter(lambda s: "/" not in s and "\x00" not in s), st.booleans())
def test_cli_topo_show_succeeds_or_says_one_line_and_exits_2(spec, as_json):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(cli, "build_parser", return_value=PARSER):
        try:
            status = cli.main(["topo", "show", spec, *(["--json"] if as_json else [])])
        except SystemExit as exc:  # argparse: a spec that looks like an option
            status = exc.code
    if status == 0:
        assert out.getvalue() and not err.getvalue()
    else:
        assert status == 2
        assert err.getvalue().count("\n") == 1 and err.getvalue().endswith("\n"), err.getvalue()
