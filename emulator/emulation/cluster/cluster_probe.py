"""The probes of ``emu cluster check``: what one server has, read through a
:data:`~emulator.emulation.machine.system.Runner`.

Each function takes the runner of the server it reads
(:func:`emulator.emulation.cluster.remote_shell.remote_runner`: the head's runs
locally, every other server's over ssh) and returns the findings of
:mod:`emulator.runs.cluster_check`, so unit tests check them with scripted
results. :func:`tunnel_mtu` takes both ends' runners: it builds a VXLAN
tunnel between the head and a server out of names of the project's own
(:func:`emulator.runs.cluster_check.tunnel_names`), pings through it with
don't-fragment set, and removes what it made whatever happened.
"""

from __future__ import annotations

import json
import re
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from emulator.base.errors import FieldError
from emulator.emulation.machine.system import Result, Runner
from emulator.runs.cluster_check import (
    ICMP_HEADERS,
    PROBE_ADDRESSES,
    PROBE_DSTPORT,
    PROBE_PINGS,
    PROBE_PREFIX,
    CalibrationStatus,
    ClockOffset,
    ClockSample,
    Reading,
    Ssh,
    Tunnel,
    TunnelNames,
    Versions,
    offset_from,
)
from emulator.runs.cluster_file import Server

#: The project's distribution, as installed (setup.cfg's name).
PROJECT_DIST = "eflops-emulator"
#: Run there with the head's interpreter: the project's version (``emulator.__version__``, and the installed
#: distribution's where it differs) and a digest of its code, so two servers at the same version number but
#: with different code differ. Self-contained: it must run on a server whatever version it has.
PROJECT_SCRIPT = (
    "import hashlib, importlib.metadata, pathlib, emulator\n"
    "root = pathlib.Path(emulator.__file__).resolve().parent.parent\n"
    "digest = hashlib.sha256()\n"
    "for top in ('emulator', 'controllers'):\n"
    "    for path in sorted((root / top).rglob('*.py')):\n"
    "        digest.update(path.relative_to(root).as_posix().encode() + b'\\0' + path.read_bytes() + b'\\0')\n"
    f"installed = importlib.metadata.version({PROJECT_DIST!r})\n"
    "version = emulator.__version__ if installed == emulator.__version__ else "
    "f'{emulator.__version__} (installed as {installed})'\n"
    "print(f'{version} code {digest.hexdigest()[:12]}')\n"
)
MININET_SCRIPT = "import mininet.net; print(mininet.net.VERSION)"
#: Clock readings per server; the one with the shortest round trip counts.
CLOCK_SAMPLES = 5


def _why(res: Result) -> str:
    """A failed command's exit status and the last line it wrote to stderr."""
    lines = [line.strip() for line in (res.stderr or res.stdout).splitlines() if line.strip()]
    return f"exit status {res.returncode}" + (f": {lines[-1]}" if lines else "")


def reach(runner: Runner, clock: Callable[[], float] = time.monotonic) -> Ssh:
    """Whether ``true`` runs on the server, and the round trip it took (an ssh login included)."""
    start = clock()
    res = runner(["true"])
    rtt = clock() - start
    return Ssh(True, rtt_s=rtt) if res.returncode == 0 else Ssh(False, rtt_s=rtt, error=_why(res))


def _reading(res: Result, parse: Callable[[str], str]) -> Reading:
    if res.returncode != 0:
        return Reading(None, _why(res))
    try:
        value = parse(res.stdout).strip()
    except (IndexError, ValueError):
        value = ""
    return Reading(value) if value else Reading(None, f"unreadable output {res.stdout.strip()[:80]!r}")


def _ovs(text: str) -> str:
    """``ovs-vsctl (Open vSwitch) 3.1.0`` -> ``3.1.0``."""
    return text.splitlines()[0].split()[-1]


def versions(runner: Runner, python: str = sys.executable) -> Versions:
    """The server's kernel, Open vSwitch, Mininet and project, the last two read with ``python`` (the head's
    interpreter: the Mininet the project imports, which a bare ``python3`` on the PATH need not be)."""
    return Versions(kernel=_reading(runner(["uname", "-r"]), str),
                    ovs=_reading(runner(["ovs-vsctl", "--version"]), _ovs),
                    mininet=_reading(runner([python, "-c", MININET_SCRIPT]), str),
                    project=_reading(runner([python, "-c", PROJECT_SCRIPT]), str))


def chrony(runner: Runner) -> str:
    """chronyc tracking's "System time" (how far chrony finds the clock from its sources), or why there is none."""
    res = runner(["chronyc", "tracking"])
    if res.returncode == 127 or "command not found" in res.stderr:
        return "no chrony"
    if res.returncode != 0:
        return f"chronyc: {_why(res)}"
    for line in res.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "System time":
            return value.strip()
    return "chronyc: no System time line"


DATE = ["date", "+%s.%N"]


def clock_offset(runner: Runner, clock: Callable[[], float] = time.time, samples: int = CLOCK_SAMPLES,
                 chrony_line: str = "") -> ClockOffset:
    """The server's CLOCK_REALTIME less ``clock`` (the head's), from ``samples`` round trips of ``date +%s.%N``
    through ``runner`` (:func:`emulator.runs.cluster_check.offset_from`); ``chrony_line`` goes with it.

    Through a :class:`ClockSession`, each round trip is the network's and
    the shell's alone; through an ssh runner, each includes a login, which
    widens the uncertainty (half the shortest round trip) to a login's time.
    """
    readings: list[ClockSample] = []
    for _ in range(samples):
        sent = clock()
        res = runner(DATE)
        received = clock()
        if res.returncode != 0:
            return ClockOffset(None, None, len(readings), chrony_line, error=_why(res))
        try:
            readings.append(ClockSample(sent, float(res.stdout.strip()), received))
        except ValueError:
            return ClockOffset(None, None, len(readings), chrony_line,
                               error=f"date printed {res.stdout.strip()[:40]!r}")
    return offset_from(readings, chrony_line)


#: The shell a :class:`ClockSession` keeps on the server: each line it reads, it answers with the time.
CLOCK_SHELL = ["sh", "-c", "while read -r _; do date +%s.%N; done"]


class ClockSession:
    """A :data:`~emulator.emulation.machine.system.Runner` of ``date +%s.%N`` alone, answered by one shell kept open on
    the server (:data:`CLOCK_SHELL`, started by ``start``: :func:`emulator.emulation.cluster.remote_shell.popen` of the
    server), so that a round trip costs no ssh login. :meth:`close` ends it."""

    def __init__(self, start: Callable[..., subprocess.Popen[str]], timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self.errors = ""
        self.closed = False
        self.proc = start(CLOCK_SHELL, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __call__(self, command: Sequence[str]) -> Result:
        if list(command) != DATE:
            raise ValueError(f"a clock session runs {shlex.join(DATE)} only, not {shlex.join(command)}")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.closed:
            return Result(self.proc.returncode or 255, "", self.errors or "the clock session is closed")
        timed_out = False
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
            timed_out = not ready
            line = self.proc.stdout.readline() if ready else ""  # "": end of file, the shell (its ssh) is gone
        except OSError:  # a broken pipe: gone too
            line = ""
        if line:
            return Result(0, line, "")
        self.close()
        if timed_out:
            return Result(124, "", f"no answer within {self.timeout_s:g} s")
        return Result(self.proc.returncode or 255, "", self.errors)

    def close(self) -> None:
        """End the shell: its input closed (it exits), killed if it has not within the timeout; what it wrote
        to stderr is kept in :attr:`errors`."""
        if self.closed:
            return
        self.closed = True
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            self.errors = self.proc.stderr.read() if self.proc.stderr is not None else ""
        except (OSError, ValueError):
            pass
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> ClockSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------- the tunnel
class _SetUpFailed(Exception):
    pass


def _end(runner: Runner, own: Server, peer: Server, address: str, names: TunnelNames, mtu: int,
         undo: list[tuple[Runner, list[str]]]) -> None:
    """One end of the probe's tunnel on ``own``: each step's undoing is pushed on ``undo`` once it is done."""
    def step(command: list[str], undoing: list[str] | None = None) -> Result:
        res = runner(command)
        if res.returncode != 0:
            raise _SetUpFailed(f"on {own.name}, `{shlex.join(command)}` failed: {_why(res)}")
        if undoing is not None:
            undo.append((runner, undoing))
        return res

    ns, dev = names.namespace, names.device
    if not step(["ip", "-o", "-4", "addr", "show", "to", f"{own.underlay}/32"]).stdout.strip():
        raise _SetUpFailed(f"{own.name} has no address {own.underlay} (its underlay in the cluster file)")
    step(["ip", "netns", "add", ns], ["ip", "netns", "del", ns])
    step(["ip", "link", "add", dev, "mtu", str(mtu), "type", "vxlan", "id", str(names.vni), "local", own.underlay,
          "remote", peer.underlay, "dstport", str(PROBE_DSTPORT), "df", "set"], ["ip", "link", "del", dev])
    step(["ip", "link", "set", dev, "netns", ns])
    undo[-1] = (runner, ["ip", "-n", ns, "link", "del", dev])  # the device is in the namespace now
    step(["ip", "-n", ns, "addr", "add", f"{address}/{PROBE_PREFIX}", "dev", dev])
    step(["ip", "-n", ns, "link", "set", dev, "up"])


def _route(runner: Runner, peer: str) -> str:
    """Which device the route to ``peer`` leaves by, and that device's MTU ("" where unknown)."""
    found = re.search(r"\bdev (\S+)", runner(["ip", "-o", "route", "get", peer]).stdout)
    if found is None:
        return ""
    mtu = re.search(r"\bmtu (\d+)", runner(["ip", "-o", "link", "show", "dev", found.group(1)]).stdout)
    return f"; the route to {peer} leaves by {found.group(1)}" + (f", MTU {mtu.group(1)}" if mtu else "")


def tunnel_mtu(head_runner: Runner, server_runner: Runner, head: Server, server: Server, mtu: int,
               names: TunnelNames) -> Tunnel:
    """Whether ``mtu``-byte packets cross a VXLAN tunnel between ``head`` and ``server`` whole.

    On each end: a network namespace, a VXLAN device made in the root
    namespace (where its UDP socket stays: ``local`` its underlay address,
    ``remote`` the other end's, don't-fragment set on the outer packets so an
    underlay too small for them drops them instead of fragmenting them) and
    moved into the namespace, with an address of :data:`PROBE_ADDRESSES`.
    Then ``ping -M do`` from the head's namespace; everything made is removed
    in reverse order, whatever happened.
    """
    undo: list[tuple[Runner, list[str]]] = []
    try:
        _end(head_runner, head, server, PROBE_ADDRESSES[0], names, mtu, undo)
        _end(server_runner, server, head, PROBE_ADDRESSES[1], names, mtu, undo)
        ping = head_runner(["ip", "netns", "exec", names.namespace, "ping", "-M", "do", "-s", str(mtu - ICMP_HEADERS),
                            "-c", str(PROBE_PINGS), "-i", "0.2", "-W", "2", PROBE_ADDRESSES[1]])
        counts = re.search(r"(\d+) packets transmitted, (\d+) received", ping.stdout)
        replies = f"{counts.group(2)}/{counts.group(1)}" if counts else f"0/{PROBE_PINGS}"
        if ping.returncode == 0:
            return Tunnel(mtu, True, f"{replies} echo replies")
        why = [line.strip() for line in ping.stderr.splitlines() if line.strip()]
        return Tunnel(mtu, False, f"{replies} echo replies to {mtu - ICMP_HEADERS}-byte pings with don't-fragment"
                      + (f" ({why[-1]})" if why else "") + _route(head_runner, server.underlay))
    except _SetUpFailed as exc:
        return Tunnel(mtu, False, str(exc))
    finally:
        for runner, command in reversed(undo):
            runner(command)


# ---------------------------------------------------------------- calibration
def calibration_command(profile_spec: str, make: bool = False, python: str = sys.executable) -> list[str]:
    """``emu cluster calibration`` with the head's interpreter: a server's calibration at the profile's MTU."""
    return [python, "-m", "emulator", "cluster", "calibration", "--fabric", profile_spec, *(["--make"] if make else [])]


def calibration(runner: Runner, profile_spec: str, mtu: int, make: bool = False,
                python: str = sys.executable) -> CalibrationStatus:
    """The server's calibration at the profile's MTU as ``emu cluster calibration`` reports it there (with
    ``make``: made, a minimal one, where there is none)."""
    res = runner(calibration_command(profile_spec, make, python))
    if res.returncode != 0:
        return CalibrationStatus("", mtu, False, error=_why(res))
    lines = res.stdout.strip().splitlines()
    try:
        return CalibrationStatus.from_json(json.loads(lines[-1]) if lines else None)
    except (ValueError, FieldError) as exc:
        return CalibrationStatus("", mtu, False, error=f"unreadable report: {exc}")



#: What a server prints of itself for admission: available and total bytes (cgroup-aware, as on the head), cores.
MACHINE_SCRIPT = ("import os; from emulator.emulation.machine.system import memory_available; "
                  "a, t = memory_available(); print(a, t, os.cpu_count())")


def machine(runner: Runner, python: str = sys.executable) -> tuple[int, int, int] | None:
    """A server's memory available and in all (bytes) and its cores, measured there by the project's own
    code; None when it does not answer."""
    res = runner([python, "-c", MACHINE_SCRIPT])
    if res.returncode != 0:
        return None
    try:
        available, total, cores = (int(x) for x in res.stdout.split())
    except ValueError:
        return None
    return available, total, cores
