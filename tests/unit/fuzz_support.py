"""Shared pieces of the property-based fuzz tests (``test_fuzz_*.py``).

* :data:`WEIRD` -- values of every wrong kind (types, signs, sizes, NaN, unicode, nesting);
* :func:`mutate` -- one structured corruption of a valid JSON-like document, so the
  fuzzers reach deep validation instead of failing at the first field;
* :func:`user_error_or` -- call a parser: its result, or ``None`` after a one-line
  :class:`UserError` (anything else propagates and fails the test), within :func:`bounded`'s time and memory;
* :func:`run_cli` / :func:`check_cli` -- ``emulator.cli.main.main`` with captured output,
  asserting the bad-input contract (exit 2, one line, no traceback);
* :class:`Started` and :func:`forbid_starting` -- every edge that starts a process or
  brings a network up, replaced by a function that raises :class:`Started`;
* :func:`snapshot` -- the files under a directory, to prove bad input wrote nothing.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from emulator.base.errors import UserError

#: Examples per fuzz test: a few hundred per reader in ``make test`` (its tests add up), ``make soak`` sets
#: ``EF_HOSTILE_EXAMPLES`` (1000 or more).
EXAMPLES = int(os.environ.get("EF_HOSTILE_EXAMPLES", "100"))
#: ``make test`` draws the same examples every run (derandomized: a failure there is reproducible on any machine,
#: never a flake that the next run does not see); ``make soak`` draws new ones each time (it is there to find
#: what the fixed ones miss, and hypothesis prints the failing input and a ``@reproduce_failure`` blob). No example
#: database either way: nothing is written into the checkout, and a run does not depend on an earlier one.
SOAK = "EF_HOSTILE_EXAMPLES" in os.environ
#: Every fuzz test: no per-example deadline (a 2-core CI machine is slow; :func:`bounded` is the bound).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, database=None, print_blob=SOAK,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

ODD_STRINGS = ("", " ", "nothing", "none", "null", "~", "h0", "h-1", "h1", "h9999", "s1", "é", "日本",
               "\x00", "\n", "a\nb", "\t", "'", '"', "\\", "1e3", "-1", "0", "NaN", "inf", "64KiB", "1Kb",
               "-5MiB", "0B", "99999999999999999999TiB", "ring", "hdrm", "bigraph", "data", "scratch",
               "send", "recv", "star:hosts=2", "fattree:k=3", "../x", "/dev/null", "%s", "{}", "[]",
               "\U0001f600", "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2, 3, 4, 7, 2**31, 2**63, -(2**63), 10**30, 1 << 16, (1 << 16) + 1, 1025]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.5, -0.0, 1e308, 1e-300]),
    st.text(max_size=12),
    st.sampled_from(ODD_STRINGS),
)

#: Values of every kind, including containers of the wrong shape.
WEIRD = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-2, 2)), scalars, max_size=3),
    st.lists(st.lists(scalars, max_size=2), max_size=2),
)


def _children(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return list(node)
    if isinstance(node, list):
        return list(range(len(node)))
    return []


def mutate(data: st.DataObject, doc: Any, extra_keys: tuple[str, ...] = ()) -> Any:
    """A deep copy of ``doc`` with one random corruption somewhere in it.

    The corruption is one of: a value replaced by :data:`WEIRD`, a key
    removed, an unknown (or known but misplaced, from ``extra_keys``) key
    added, a container emptied, a list entry duplicated or dropped, a value
    wrapped in a list or a mapping, a number negated/enlarged/turned into a
    string. The walk from the root descends at random, so every depth is hit.
    """
    doc = copy.deepcopy(doc)
    holder: Any = None
    key: Any = None
    node = doc
    while _children(node) and data.draw(st.integers(0, 3), label="depth") > 0:
        holder = node
        key = data.draw(st.sampled_from(_children(node)), label="key")
        node = node[key]
    ops = ["replace", "wrap_list", "wrap_map", "as_string"]
    if isinstance(node, dict):
        ops += ["drop_key", "add_key", "empty"]
    if isinstance(node, list):
        ops += ["empty", "dup", "drop_item", "append_weird"]
    if isinstance(node, int | float) and not isinstance(node, bool):
        ops += ["negate", "huge", "plus_one", "minus_one", "float", "nan"]
    op = data.draw(st.sampled_from(ops), label="mutation")
    new: Any = node
    if op == "replace":
        new = data.draw(WEIRD, label="value")
    elif op == "wrap_list":
        new = [node]
    elif op == "wrap_map":
        new = {"value": node}
    elif op == "as_string":
        new = str(node)
    elif op == "drop_key" and node:
        del node[data.draw(st.sampled_from(list(node)), label="dropped")]
    elif op == "add_key":
        name = data.draw(st.one_of(st.sampled_from(extra_keys or ("x",)), st.text(max_size=6)), label="new key")
        node[name] = data.draw(WEIRD, label="new value")
    elif op == "empty":
        node.clear()
    elif op == "dup" and node:
        i = data.draw(st.integers(0, len(node) - 1), label="dup index")
        node.insert(i, copy.deepcopy(node[i]))
    elif op == "drop_item" and node:
        del node[data.draw(st.integers(0, len(node) - 1), label="drop index")]
    elif op == "append_weird":
        node.append(data.draw(WEIRD, label="appended"))
    elif op == "negate":
        new = -node - 1 if isinstance(node, int) else -node
    elif op == "huge":
        new = data.draw(st.sampled_from([2**31, 2**63, 10**30, 2**64 + 1, 1e300]), label="huge")
    elif op == "plus_one":
        new = node + 1
    elif op == "minus_one":
        new = node - 1
    elif op == "float":
        new = node + 0.5
    elif op == "nan":
        new = math.nan
    if new is not node:
        if holder is None:
            return new
        holder[key] = new
    return doc


#: The hostile-input contract (issue 49): no reader or command takes longer on one input, or more memory above
#: what the process already has, and no error line is longer.
MAX_SECONDS = 10.0
MAX_EXTRA_BYTES = 1 << 30
MAX_ERROR_CHARS = 2000
MAX_MESSAGE_CHARS = 10 * MAX_ERROR_CHARS


class TookTooLong(BaseException):  # noqa: N818 - BaseException: no `except Exception` in the code under test eats it
    """Raised by :func:`bounded`'s timer: one input kept a reader or command past :data:`MAX_SECONDS`."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise TookTooLong(f"one input took more than {MAX_SECONDS:g} s")


def _address_space() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[0]) * resource.getpagesize()


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Run the block with at most :data:`MAX_SECONDS` of wall-clock time and :data:`MAX_EXTRA_BYTES` of address
    space beyond what the process holds now.

    Cheap enough for every example (two ``setrlimit`` and one ``setitimer``, no subprocess): the memory bound is
    the process's own ``RLIMIT_AS``, lowered for the block and restored after it, so an input that makes a reader
    allocate without bound fails with :class:`MemoryError` instead of taking the machine; the time bound is a
    ``SIGALRM`` that raises :class:`TookTooLong` (and the elapsed time is checked after the block too, for code
    that the signal cannot interrupt).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + MAX_EXTRA_BYTES
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, MAX_SECONDS)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    elapsed = time.monotonic() - start
    assert elapsed <= MAX_SECONDS, f"one input took {elapsed:.1f} s (at most {MAX_SECONDS:g} s)"


def assert_one_line(message: str) -> None:
    """The bad-input contract of a message: one line, no traceback; as the command line prints it
    (:func:`emulator.cli.main.one_line`, which cuts the middle of a longer one) at most :data:`MAX_ERROR_CHARS`
    characters, and not built from the whole input either (at most :data:`MAX_MESSAGE_CHARS`: an alias bomb once
    made an 80 MB message before anything cut it)."""
    from emulator.cli.main import one_line

    assert message.strip(), "empty error message"
    assert "\n" not in message.rstrip("\n"), f"error is not one line: {message[:300]!r}"
    assert len(message) <= MAX_MESSAGE_CHARS, f"error message of {len(message)} characters: {message[:300]!r}..."
    assert len(one_line(message.rstrip("\n"))) <= MAX_ERROR_CHARS, message[:300]
    assert "Traceback" not in message, message[:300]


def user_error_or(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` within :func:`bounded`, or ``None`` when it raised a one-line :class:`UserError`."""
    try:
        with bounded():
            return fn(*args, **kwargs)
    except UserError as exc:
        assert_one_line(str(exc))
        assert exc.exit_status == 2
        return None


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

class Started(BaseException):  # noqa: N818 - a signal, not an error; BaseException so no `except Exception` eats it
    """Raised by the fakes of :func:`forbid_starting`: the input was accepted and something would start."""


def run_cli(argv: list[str]) -> tuple[int | None, str, str]:
    """``emulator.cli.main.main(argv)`` -> ``(status, stdout, stderr)``; status ``None`` if something started."""
    from emulator.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    status: int | None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), bounded():
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except Started:
            status = None
    return status, out.getvalue(), err.getvalue()


def check_cli(argv: list[str], root: str | None = None, before: set[str] | None = None) -> int | None:
    """Run the CLI; for exit status 2 assert one stderr line and (given ``root``) no new files."""
    status, _out, err = run_cli(argv)
    assert status in (None, 0, 1, 2, 130), (status, argv, err)
    if status == 2:
        assert err.endswith("\n"), (argv, err)
        assert_one_line(err)
        if root is not None and before is not None:
            assert snapshot(root) == before, f"bad input {argv!r} wrote files: {snapshot(root) - before}"
    else:
        assert "Traceback" not in err, err
    return status


def fast_parser(mp: pytest.MonkeyPatch) -> None:
    """Build the ``emu`` argument parser once (argparse construction is ~10 ms, mostly gettext look-ups).

    ``main`` still parses every argv with the real parser.
    """
    import emulator.cli.main

    mp.setattr(emulator.cli.main, "build_parser", functools.cache(emulator.cli.main.build_parser))


@pytest.fixture(scope="module")
def cli_fixture():
    with pytest.MonkeyPatch.context() as mp:
        fast_parser(mp)
        forbid_starting(mp)
        yield


def snapshot(root: str) -> set[str]:
    """Every file and directory under ``root`` (relative paths)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def _fake(name: str) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        raise Started(name)
    return fake


class _FakeClass:
    label = "?"

    def __init__(self, *args: Any, **kwargs: Any):
        raise Started(self.label)


def _must_pass(what: str, check: Callable[[], Any]) -> None:
    """Inside a fake start edge: the arguments it got must be valid, else bad input started something."""
    try:
        check()
    except UserError as exc:
        raise AssertionError(f"{what} was started with bad input ({exc})") from None


class _FakeNetwork(_FakeClass):
    label = "EmulatedNetwork"

    def __init__(self, topo: Any, controller: Any = None, routing: str = "shortest", seed: int = 0,
                 datapath: str = "auto", **kwargs: Any):
        from controllers.core import parse_listen
        from emulator.emulation.machine import system
        from emulator.model import routing as routing_mod

        if controller is None:
            _must_pass("a network", lambda: routing_mod.check_policy(topo, routing))
            assert isinstance(seed, int) and seed >= 0, f"a network was started with seed {seed!r}"
        else:
            _must_pass("a network", lambda: parse_listen(f"{controller[0]}:{controller[1]}"))
        _must_pass("a network", lambda: system.choose_datapath(datapath, module_loaded=True))
        raise Started(self.label)


class _FakeController(_FakeClass):
    label = "ControllerProcess"

    def __init__(self, settings: Any, **kwargs: Any):
        _must_pass("a controller", settings.check)
        raise Started(self.label)


def _fake_foreground(settings: Any, *args: Any) -> None:
    _must_pass("a controller", settings.check)
    raise Started("run_foreground")


def _fake_replay(cfg: Any, *args: Any, **kwargs: Any) -> None:
    from emulator.emulation.session import replay

    _must_pass("a replay", lambda: replay.prepare(cfg))
    raise Started("replay")


def forbid_starting(mp: pytest.MonkeyPatch) -> None:
    """Replace every edge that starts a process, a controller or a network with a :class:`Started` raiser.

    Also makes ``require_root`` pass (so the fuzzers reach the checks after
    it) and ``interrupt_on_sigterm`` do nothing (no signal handlers in the
    test process).
    """
    import subprocess

    import controllers.launcher
    import emulator.cli.commands.bench
    import emulator.cli.commands.calibrate
    import emulator.cli.commands.experiment
    import emulator.cli.commands.net
    import emulator.cli.commands.replay
    import emulator.emulation.machine.cleanup
    import emulator.emulation.machine.system
    import emulator.emulation.network.controller_process
    import emulator.emulation.network.emulated_network
    import emulator.emulation.session.replay
    import emulator.selfcheck.live.bench_run
    import emulator.selfcheck.live.calibration
    import emulator.study.live.runner

    mp.setattr(emulator.emulation.network.emulated_network, "EmulatedNetwork", _FakeNetwork)
    mp.setattr(emulator.emulation.session.replay, "EmulatedNetwork", _FakeNetwork)
    mp.setattr(emulator.emulation.session.replay, "ControllerProcess", _FakeController)
    mp.setattr(emulator.cli.commands.net, "EmulatedNetwork", _FakeNetwork)
    mp.setattr(emulator.emulation.network.controller_process, "ControllerProcess", _FakeController)
    mp.setattr(controllers.launcher, "run_foreground", _fake_foreground)
    mp.setattr(emulator.emulation.session.replay, "replay", _fake_replay)
    mp.setattr(emulator.cli.commands.replay, "replay", _fake_replay)
    for module, name in ((emulator.emulation.session.replay, "ReplaySession"), (emulator.study.live.runner, "Runner")):
        mp.setattr(module, name, type(f"Fake{name}", (_FakeClass,), {"label": name}))
    for module, name in ((subprocess, "Popen"), (subprocess, "run"), (subprocess, "call"),
                         (subprocess, "check_call"), (subprocess, "check_output"), (os, "system"),
                         (emulator.emulation.machine.system, "run"), (emulator.selfcheck.live.calibration, "calibrate"),
                         (emulator.selfcheck.live.bench_run, "bench"), (emulator.emulation.machine.cleanup, "clean")):
        mp.setattr(module, name, _fake(f"{module.__name__}.{name}"))
    for module in (emulator.emulation.machine.system, emulator.cli.commands.net, emulator.cli.commands.replay,
                   emulator.cli.commands.calibrate, emulator.cli.commands.bench):
        if hasattr(module, "require_root"):
            mp.setattr(module, "require_root", lambda: None)
        if hasattr(module, "interrupt_on_sigterm"):
            mp.setattr(module, "interrupt_on_sigterm", lambda: None)
    mp.setattr(emulator.cli.commands.experiment, "interrupt_on_sigterm", lambda: None)
