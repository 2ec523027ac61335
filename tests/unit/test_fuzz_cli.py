"""Fuzzing the whole ``emu`` command line and the controller's settings parsers.

Random argument vectors for every subcommand -- a mix of its real options,
other commands' options, valid and invalid values, existing and missing
files -- through :func:`emulator.cli.main.main`, with every edge that would start
a process, a controller or a network replaced by a raiser
(:func:`fuzz_support.forbid_starting`). The contract: exit status 0/1, or 2
with exactly one line on stderr and no file created; reaching a start edge
is allowed only for input that passed every check. And
:func:`controllers.core.parse_listen`, :meth:`Settings.from_env` and
:meth:`Settings.check` on random text and values.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from fuzz_support import FUZZ, ODD_STRINGS, WEIRD, check_cli, cli_fixture, snapshot, user_error_or
from hypothesis import given
from hypothesis import strategies as st

from controllers.core import Settings, parse_listen
from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule import format as fmt

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
COMMANDS = (["topo", "show"], ["topo", "export"], ["up"], ["clean"], ["controller"], ["pingall"],
            ["schedule", "gen"], ["schedule", "check"], ["schedule", "import"], ["replay"], ["run"], ["report"],
            ["calibrate"], ["analyze"], ["bench"], ["schedule"], ["topo"], [], ["bogus"])
OPTIONS = ("--topology", "--routing", "--listen", "--ecmp-seed", "--stats-interval", "--stats-file", "--state-file",
           "--log-level", "--json", "--controller", "--datapath", "--force", "--algo", "--size", "--placement",
           "--seed", "--chunks", "-o", "--output", "--fabric", "--gamma", "--index", "--out", "--repeat", "--warmup",
           "--timeout", "--pcap", "--check", "--new", "--bw", "--quick", "--bin", "--bringup-rounds", "-h", "--",
           "--to", "--rep", "--collective", "--root", "--model", "--batch", "--scale", "--instances", "--lanes",
           "--max-time", "--allow-untrusted")
VALUES = ("roce100", "alpha_us=-1", "dilation=1e9", "link_gbps=0,mtu=9000", "preset=ib200,mtu=40", "star:hosts=3", "star:hosts=2", "bigraph:upper=2,lower=2,hosts_per_switch=1", "fattree:k=3", "nope:x=1",
          "shortest", "ecmp", "bigraph", "dmodk", "bogus", "ring", "hdrm", "hd", "64", "96", "1KiB", "0", "-1", "3",
          "nan", "inf", "-inf", "1e9", "0.01", "99999999999999999999", "127.0.0.1:6653", "127.0.0.1:0",
          "10.255.255.1:6653", "localhost:6653", "::1", ":6653", "127.0.0.1", "user", "kernel", "auto", "DEBUG",
          "s.yaml", "e.yaml", "t.json", "missing.yaml", "x.xml", "out", "out/sub", "s1-s2", "h1-s1,s1-s2", "h9-s1",
          ".", "", "-", "--", "a b", "a\nb", "é", "resnet50", "vgg16", "allgather", "alltoall", "broadcast", "reduce",
          "reduce_scatter", "p2p", "direct", "dbtree", "1e6", "1000000", "30m", "1s", "2h", "8GiB")


@st.composite
def argvs(draw) -> list[str]:
    argv = list(draw(st.sampled_from(COMMANDS)))
    if argv and argv[0] in ("up", "pingall", "run", "report", "analyze", "schedule", "topo") and draw(st.booleans()):
        argv.append(draw(st.sampled_from(VALUES)))  # the positional argument, most of the time
    if argv[:2] == ["schedule", "check"] or argv[:1] == ["replay"]:
        argv.append("s.yaml")
    tokens = st.one_of(st.sampled_from(OPTIONS), st.sampled_from(VALUES), st.sampled_from(ODD_STRINGS),
                       st.text(max_size=8))
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 2)):
            argv += [draw(st.sampled_from(OPTIONS)), draw(st.sampled_from(VALUES))]
        else:
            argv.append(draw(tokens))
    return argv


SCHEDULE_TEXT = fmt.dumps(generate("ring", topology.build("star:hosts=3"), 96))


def _workdir(root: str) -> None:
    with open(os.path.join(root, "s.yaml"), "w", encoding="utf-8") as fh:
        fh.write(SCHEDULE_TEXT)
    shutil.copy(os.path.join(ROOT, "experiments", "tiny.yaml"), os.path.join(root, "e.yaml"))
    with open(os.path.join(root, "t.json"), "w", encoding="utf-8") as fh:
        fh.write('{"not": "a topology"}')
    with open(os.path.join(root, "x.xml"), "w", encoding="utf-8") as fh:
        fh.write("<algo/>")


@FUZZ
@given(argv=argvs())
def test_cli_random_argv(argv):
    """Any argv: exit 0/1, or 2 with one stderr line and no file created; nothing starts before every check."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        _workdir(root)
        os.chdir(root)  # relative paths in argv, and results/ defaults, land here
        try:
            before = snapshot(root)
            check_cli(argv, root, before)
        finally:
            os.chdir(cwd)


@FUZZ
@given(command=st.sampled_from([["up", "star:hosts=2"], ["controller", "--topology", "star:hosts=2", "--routing",
                                                        "shortest"], ["pingall", "star:hosts=2", "--routing", "ecmp"],
                                ["replay", "s.yaml", "--topology", "star:hosts=3", "--routing", "shortest", "--out",
                                 "out"]]),
       extra=st.lists(st.tuples(st.sampled_from(["--routing", "--ecmp-seed", "--controller", "--datapath", "--listen",
                                                 "--stats-file", "--state-file", "--stats-interval", "--repeat",
                                                 "--warmup", "--timeout", "--pcap", "--log-level", "--fabric"]),
                                st.sampled_from(VALUES)), max_size=3))
def test_cli_starting_commands(command, extra):
    """Commands that start things, from a valid base: one wrong option must stop them before anything starts."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        _workdir(root)
        os.chdir(root)
        try:
            before = snapshot(root)
            check_cli(command + [x for pair in extra for x in pair], root, before)
        finally:
            os.chdir(cwd)


# ---------------------------------------------------------------------------
# The controller's settings
# ---------------------------------------------------------------------------

listen_texts = st.one_of(
    st.text(max_size=24),
    st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "0.0.0.0", "256.1.1.1", "1.2.3", "::1", "",
                                                         "localhost", " 127.0.0.1", "127.0.0.1\n", "١٢٧.0.0.1"]),
              st.one_of(st.integers(-2, 70000).map(str), st.sampled_from(["", "x", "1e3", " 1", "+1", "٣", "0x10",
                                                                          "6653\n", "1_0"]))),
)


@FUZZ
@given(text=st.one_of(listen_texts, WEIRD))
def test_parse_listen(text):
    got = user_error_or(parse_listen, text)
    if got is not None:
        host, port = got
        assert 1 <= port <= 65535 and isinstance(host, str)


env_values = st.one_of(st.sampled_from(["star:hosts=2", "fattree:k=4", "bigraph:upper=2,lower=2,hosts_per_switch=1",
                                        "shortest", "ecmp", "bigraph", "bogus", "0", "-1", "nan", "inf", "1e-9",
                                        "0.5", "3600", "99999999999999999999", "", "x", "é", "1_000"]),
                       st.text(max_size=8))


@FUZZ
@given(env=st.dictionaries(st.sampled_from(["EF_TOPOLOGY", "EF_ROUTING", "EF_ECMP_SEED", "EF_STATS_FILE",
                                            "EF_STATS_INTERVAL", "EF_STATE_FILE", "EF_OTHER"]), env_values),
       listen=st.one_of(st.none(), st.tuples(st.sampled_from(["127.0.0.1", "1.2.3", "", "0.0.0.0"]),
                                             st.one_of(st.integers(-1, 70000), WEIRD))))
def test_settings_from_env_and_check(env, listen):
    """``EF_*`` environment -> Settings -> check(): a topology, or one line of UserError."""
    settings = user_error_or(Settings.from_env, env)
    if settings is None:
        return
    if listen is not None:
        settings = Settings(topology=settings.topology, routing=settings.routing, seed=settings.seed,
                            stats_interval=settings.stats_interval, listen=listen)
    user_error_or(settings.check)
