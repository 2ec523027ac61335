"""Fuzzing the schedule format and ``emu schedule check``: a schedule or one line of error, never a traceback.

Random text and structured corruptions of valid generated schedules go
through :func:`emulator.model.schedule.format.loads` / ``from_dict`` / ``validate``,
:func:`emulator.model.prediction.check.check` and the CLI (``emu schedule check``,
``emu schedule gen``): the result is a schedule (or a report), or a
:class:`UserError` / exit status 2 with exactly one line naming the problem.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile

import pytest
import yaml
from fuzz_support import FUZZ, WEIRD, check_cli, cli_fixture, mutate, snapshot, user_error_or
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.prediction.check import check
from emulator.model.schedule import format as fmt
from emulator.model.workloads import training

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

#: Small valid schedules of every shape the generators make (scratch buffers, local ops, several chunks).
BASES = (
    ("ring", "star:hosts=3", 96),
    ("hd", "star:hosts=4", 64),
    ("hdrm", "bigraph:upper=2,lower=2,hosts_per_switch=1", 64),
    ("dbtree", "star:hosts=3", 96),
    ("hier", "leafspine:leaves=2,spines=1,hosts_per_leaf=2", 64),
)
OP_KEYS = tuple(sorted(fmt._OP_KEYS | fmt._RANK_KEYS | fmt._TOP_KEYS))


@functools.cache
def base(i: int) -> tuple[dict, str]:
    algo, spec, size = BASES[i]
    sched = generate(algo, topology.build(spec), size)
    return sched.to_dict(), spec


def _yamlish_text() -> st.SearchStrategy[str]:
    """Text that is often YAML/JSON and often almost a schedule."""
    fragments = st.sampled_from([
        "version: 1\n", "size: 64\n", "chunks: 2\n", "ranks:\n", "- rank: 0\n", "  host: h1\n", "  ops: []\n",
        "{", "}", "[", "]", ": ", "- ", "&a ", "*a", "!!python/object:os.system ", "!!binary ", "? ",
        "\n", "\t", "---\n", "...\n", "%YAML 1.1\n", "'", '"', "1" * 5000, "0x1F", "1e400", ".nan", "~",
        "format: eflops-emulator-schedule\n", "2001-12-14t21:59:43.10-05:00", "<<: *a\n",
    ])
    return st.one_of(st.text(max_size=200), st.lists(fragments, max_size=12).map("".join))


@FUZZ
@given(text=_yamlish_text(), as_json=st.booleans())
def test_loads_random_text(text, as_json):
    """Any text: a schedule, or one line of UserError (YAML and JSON readers alike)."""
    user_error_or(fmt.loads, text, "schedule 'fuzz'", "json" if as_json else "yaml")


@FUZZ
@given(value=st.one_of(WEIRD, st.text(alphabet="0123456789 kKMGTiBb.-+e_", max_size=12)),
       where=st.sampled_from(["schedule", "bench"]))
def test_parse_size(value, where):
    size = user_error_or(fmt.parse_size, value, where, "size")
    if size is not None:
        assert isinstance(size, int) and size > 0


@FUZZ
@given(data=st.data(), which=st.integers(0, len(BASES) - 1))
def test_from_dict_mutated_schedules(data, which):
    """One corrupted field of a valid schedule: a valid Schedule (then ``check`` works too) or one line of error."""
    doc, spec = base(which)
    bad = mutate(data, doc, OP_KEYS)
    sched = user_error_or(fmt.from_dict, bad, "schedule 'fuzz'")
    if sched is None:
        return
    assert user_error_or(fmt.validate, sched) == sched  # what parses also round-trips
    report = user_error_or(check, sched, topology.build(spec), "shortest", where="schedule 'fuzz'")
    if report is not None:
        json.dumps(report.to_json())  # the report is always printable


@FUZZ
@given(data=st.data(), which=st.integers(0, len(BASES) - 1), suffix=st.sampled_from([".json", ".yaml"]),
       extra=st.lists(st.sampled_from(["--json", "--routing", "ecmp", "--routing", "bogus", "--fabric", "alpha_us=nan",
                                       "--fabric", "dilation=1", "--gamma", "inf", "--gamma", "1e-9", "--seed", "-3",
                                       "--topology", "star:hosts=2", "--topology", "star:hosts=0"]),
                      max_size=3))
def test_schedule_check_cli_mutated_files(data, which, suffix, extra):
    """``emu schedule check`` on a corrupted file: exit 0/1, or 2 with one stderr line and nothing written."""
    doc, spec = base(which)
    bad = mutate(data, doc, OP_KEYS)
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "s" + suffix)
        with open(path, "w", encoding="utf-8") as fh:
            if suffix == ".json":
                json.dump(bad, fh)
            else:
                yaml.dump(bad, fh, Dumper=yaml.CSafeDumper)
        before = snapshot(root)
        check_cli(["schedule", "check", path, *extra], root, before)


@FUZZ
@given(algo=st.one_of(st.sampled_from(["ring", "hd", "hdrm", "dbtree", "hier"]), st.text(max_size=6)),
       spec=st.one_of(st.sampled_from([s for _, s, _ in BASES] + ["star:hosts=1", "bigraph:upper=2,lower=2,"
                                                                   "hosts_per_switch=4"]), st.text(max_size=10)),
       size=st.one_of(st.sampled_from(["64", "96", "1KiB", "0", "-4", "3", "1Kb", "1e3", "64KiB"]),
                      st.text(max_size=6)),
       options=st.lists(st.sampled_from(["--placement", "identity", "--placement", "random", "--placement", "hdrm",
                                         "--placement", "x", "--chunks", "0", "--chunks", "2", "--chunks", "-1",
                                         "--chunks", "99999999999", "--seed", "-1", "--seed", "x"]), max_size=4),
       out=st.sampled_from(["o.yaml", "o.json", "sub/o.yaml", "", "."]))
def test_schedule_gen_cli(algo, spec, size, options, out):
    """``emu schedule gen`` with random arguments: a written schedule that loads, or exit 2 and no file."""
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, out) if out else out
        before = snapshot(root)
        status = check_cli(["schedule", "gen", "--algo", algo, "--topology", spec, "--size", size, *options,
                            "-o", path], root, before)
        if status == 0:
            assert fmt.load(path).algorithm == algo


@settings(FUZZ, max_examples=150)
@given(model=st.sampled_from(["resnet50", "resnet", "", "RESNET50", "vgg16", "resnet50 "]),
       algo=st.sampled_from(["ring", "hd", "hdrm", "dbtree", "direct", "bogus", ""]),
       batch=st.one_of(st.none(), st.sampled_from([-1, 0, 1, 8, 1 << 17]), st.booleans()),
       scale=st.one_of(st.sampled_from([1000.0, 1e6, 0.5, 0, -3, float("nan"), float("inf"), True]),
                       st.floats(min_value=2000, max_value=1e7)),
       hosts=st.sampled_from([2, 3, 4]))
def test_training_iteration_inputs(model, algo, batch, scale, hosts):
    """The model table's inputs (name, batch, scale, algorithm, rank count): one line of error or a valid schedule."""
    topo = topology.build(f"star:hosts={hosts}")
    sched = user_error_or(training.gen, model, algo, topo, batch=batch, scale=scale)
    if sched is not None:
        assert fmt.validate(sched) == sched and sched.compute_ops > 0
