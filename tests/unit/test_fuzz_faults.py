"""Fuzzing fault specs (``--fault``, experiment ``faults:``): a valid Fault or one clean UserError, nothing else."""

from __future__ import annotations

from fuzz_support import FUZZ
from hypothesis import given
from hypothesis import strategies as st

from emulator.base.errors import UserError
from emulator.model import topology
from emulator.runs import fault_plan as faults

TOPO = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
RANKS, STEPS, REPEAT = 8, 6, 2

ACTIONS = st.one_of(st.sampled_from(faults.ACTIONS), st.text(max_size=8))
TARGETS = st.one_of(st.sampled_from(["s1-s3", "s3-s1", "h1-s1", "s1-s2", "s1-", "-", "3", "-1", "8", "x", " s1 - s3 "]),
                    st.integers(-3, 12).map(str), st.text(max_size=8))
WHENS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f"{f}s"),
                  st.integers(-2, 9).map(lambda n: f"step={n}"),
                  st.sampled_from(["1.5s", "0", "step=", "step=x", "s", "1e999s", "-0s", "1,5s"]),
                  st.text(max_size=8))
EXTRAS = st.one_of(st.just(""), st.integers(-1, 4).map(lambda n: f",rep={n}"),
                   st.sampled_from([",rep=", ",seed=1", ",", ",rep=1,rep=2"]), st.text(max_size=5))


@st.composite
def spec_strings(draw) -> str:
    action, when, extra = draw(ACTIONS), draw(WHENS), draw(EXTRAS)
    target = draw(st.one_of(st.none(), TARGETS))
    at = draw(st.sampled_from(["@", "@", "@", "", "@@"]))
    return f"{action}{'' if target is None else ':' + target}{at}{when}{extra}"


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10), st.floats(allow_nan=True), st.text(max_size=6),
                   st.lists(st.integers(), max_size=2), TARGETS)
MAPPINGS = st.dictionaries(st.one_of(st.sampled_from(["action", "target", "at", "step", "rep"]), st.text(max_size=5)),
                           st.one_of(VALUES, ACTIONS), max_size=6)


def _fault_or_user_error(spec: object) -> None:
    try:
        plan = faults.parse_faults([spec], TOPO, RANKS, STEPS, REPEAT)  # type: ignore[list-item]
    except UserError as exc:
        assert "\n" not in str(exc), str(exc)
        return
    (f,) = plan
    assert f.action in faults.ACTIONS and (f.at_s is None) != (f.step is None) and 0 <= f.rep < REPEAT
    assert faults.parse_fault(f.describe(), TOPO, RANKS, STEPS) == f  # the canonical form reads back


@FUZZ
@given(st.one_of(spec_strings(), st.text(max_size=30)))
def test_fault_strings_parse_or_raise_one_user_error(spec):
    _fault_or_user_error(spec)


@FUZZ
@given(st.one_of(MAPPINGS, VALUES))
def test_fault_mappings_parse_or_raise_one_user_error(spec):
    _fault_or_user_error(spec)
