"""Starting and stopping the OpenFlow controller as a child process on loopback.

:class:`ControllerProcess` runs ``python -m emulator controller ...`` (the
os-ken app of :mod:`controllers`) with a status file, waits until it listens
and until every switch has its entries, and stops it by pid. Its files live
in a run-state directory (:mod:`emulator.emulation.machine.started`, label ``controller``):

* ``ef-controller-<port>.pid`` -- the controller's pid;
* ``state.json`` -- the controller's status (connected and installed
  switches, failed links, cut-off pairs), rewritten atomically on change;
* ``controller.log`` -- its log, unless ``log_file`` names another file.

The child is recorded in the run state, so ``emu clean`` can kill it if its
owner dies. Nothing is killed by name.

A controller started where our switches already look for its address (a
restart: a fault, a rebuild, another policy on the same network) points
them at it again (:func:`reconnect_switches`). Open vSwitch 3.1 doubles
its wait between attempts to reach a controller that is gone (1, 2, 4, 8 s)
although Mininet sets ``max_backoff=1000``: measured here, switches came back
5.8-8.2 s after a restarted controller listened, and 0.6 s when pointed at
it again.

Typical use (callers need not import :mod:`controllers`:
:meth:`ControllerProcess.for_network` builds its settings)::

    with ControllerProcess.for_network("topology.json", "bigraph") as ctl:
        with EmulatedNetwork(topo, controller=ctl.address) as en:
            ctl.wait_installed()
            ...

This module and :mod:`emulator.cli.commands.controller` are the only ones of
:mod:`emulator` that import :mod:`controllers` (an import-linter contract in
``setup.cfg``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from controllers.core import DEFAULT_STATS_INTERVAL, Settings, connections_log
from emulator.base.files import PROJECT_ROOT, read_json_object
from emulator.base.naming import BRIDGE_RE, NAME_PREFIX
from emulator.base.waiting import wait_until
from emulator.emulation.machine.started import StartedRecord
from emulator.emulation.machine.system import Runner, run

#: What Mininet gives every controller record (``OVSSwitch(reconnectms=1000)``), given again after a re-point.
MAX_BACKOFF_MS = 1000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listening(host: str, port: int, proc_net_tcp: str = "/proc/net/tcp") -> bool:
    """True when a socket listens on ``host:port`` (read from /proc, no connection made)."""
    want_port = f"{port:04X}"
    want_hosts = {proc_net_address(host), "00000000"}
    try:
        with open(proc_net_tcp, encoding="ascii") as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                addr, _, p = parts[1].partition(":")
                if p == want_port and parts[3] == "0A" and addr in want_hosts:
                    return True
    except OSError:
        return False
    return False


def proc_net_address(host: str) -> str:
    """An IPv4 address as ``/proc/net/tcp`` writes it: 8 hex digits, in the host's (little-endian) byte order."""
    return "".join(f"{int(x):02X}" for x in reversed(host.split(".")))


def bridges_looking_for(target: str, bridges_csv: str, controllers_csv: str) -> list[str]:
    """Our bridges whose controller is ``target``, from ``ovs-vsctl --format=csv --data=bare --no-headings``
    listings of Bridge (``name,controller``) and Controller (``_uuid,target``)."""
    uuids = set()
    for line in controllers_csv.splitlines():
        uuid, _, their_target = line.partition(",")
        if their_target.strip().strip('"') == target:
            uuids.add(uuid.strip())
    out = []
    for line in bridges_csv.splitlines():
        name, _, controllers = line.partition(",")
        name = name.strip()
        if BRIDGE_RE.match(name) and uuids & set(controllers.strip().strip('"').split()):
            out.append(name)
    return sorted(out)


def reconnect_switches(target: str, runner: Runner = run) -> list[str]:
    """Point every bridge of ours that looks for ``target`` at it again, so it connects now rather than
    after Open vSwitch's backoff (see the module docstring); return those bridges.

    Two transactions: one that removes their controller and one that gives it
    back (the same record in one transaction changes nothing, so Open vSwitch
    would keep the waiting connection). The bridges keep their entries
    meanwhile (``fail_mode=secure``).
    """
    listing = ["ovs-vsctl", "--timeout=10", "--format=csv", "--data=bare", "--no-headings"]
    bridges = runner([*listing, "--columns=name,controller", "list", "Bridge"])
    controllers = runner([*listing, "--columns=_uuid,target", "list", "Controller"])
    if bridges.returncode != 0 or controllers.returncode != 0:
        return []
    names = bridges_looking_for(target, bridges.stdout, controllers.stdout)
    if not names:
        return []
    runner(["ovs-vsctl", "--timeout=10", *[a for n in names for a in ("--", "del-controller", n)]])
    runner(["ovs-vsctl", "--timeout=10", *[a for n in names for a in ("--", "set-controller", n, target)]])
    runner(["ovs-vsctl", "--timeout=10",
            *[a for n in names for a in ("--", "set", "Controller", n, f"max_backoff={MAX_BACKOFF_MS}")]])
    return names


def controller_command(settings: Settings, state_file: str, python: str = sys.executable) -> list[str]:
    """The argument list that runs the controller in the foreground."""
    cmd = [python, "-m", "emulator", "controller", "--topology", settings.topology,
           "--routing", settings.routing, "--listen", f"{settings.listen[0]}:{settings.listen[1]}",
           "--ecmp-seed", str(settings.seed), "--stats-interval", repr(float(settings.stats_interval)),
           "--state-file", state_file, "--lanes", str(settings.lanes)]
    if settings.stats_file:
        cmd += ["--stats-file", settings.stats_file]
    return cmd


class ControllerProcess:
    """One controller child process; a context manager (:meth:`start` / :meth:`stop`).

    Arguments:
        settings: what to run; checked before anything starts (:class:`UserError`).
        log_file: where the controller's log goes (default: ``controller.log``
            in the run-state directory, removed on stop).
    """

    def __init__(self, settings: Settings, *, log_file: str | None = None):
        self.settings = settings
        self.topo = settings.check()
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None
        self.state: StartedRecord | None = None
        self.state_file = ""
        self.pid_file = ""
        self.last_log = ""  # the log as it was when the controller stopped

    @classmethod
    def for_network(cls, topology_path: str, routing: str, seed: int = 0, *, stats_file: str | None = None,
                    stats_interval_s: float = DEFAULT_STATS_INTERVAL, log_file: str | None = None,
                    host: str = "127.0.0.1", lanes: int = 1) -> ControllerProcess:
        """A controller of the topology file (or spec) ``topology_path`` that listens on a free port of ``host``.

        ``routing`` and ``seed`` pick the policy, ``lanes`` how many agent
        connections per host pair it routes exactly; ``stats_file`` (JSON lines)
        receives the port counters every ``stats_interval_s`` seconds. Checks
        the settings (:class:`UserError`) but starts nothing.
        """
        settings = Settings(topology=topology_path, routing=routing, seed=seed, stats_file=stats_file,
                            stats_interval=stats_interval_s, listen=(host, free_port(host)), lanes=lanes)
        return cls(settings, log_file=log_file)

    def __enter__(self) -> ControllerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return self.settings.listen

    def start(self, timeout: float = 20.0) -> None:
        """Start the controller and wait until it listens. Raises RuntimeError if it does not."""
        host, port = self.settings.listen
        if listening(host, port):
            raise RuntimeError(f"something already listens on {host}:{port}")
        self.state = StartedRecord.create("controller")
        self.state_file = os.path.join(self.state.path, "state.json")
        self.pid_file = os.path.join(self.state.path, f"{NAME_PREFIX}-controller-{port}.pid")
        log_path = self.log_file or os.path.join(self.state.path, "controller.log")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PROJECT_ROOT, os.environ.get("PYTHONPATH")])))
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(controller_command(self.settings, self.state_file), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.state.record_process("controller", self.proc.pid, listen=f"{host}:{port}")
        with open(self.pid_file, "w", encoding="ascii") as fh:
            fh.write(f"{self.proc.pid}\n")
        proc = self.proc

        def up() -> bool:
            return proc.poll() is None and listening(host, port) and os.path.exists(self.state_file)

        if not wait_until(lambda: up() or proc.poll() is not None, timeout) or proc.poll() is not None:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"controller did not start listening on {host}:{port}: {tail}")
        reconnect_switches(self.target)

    @property
    def target(self) -> str:
        """The address switches are given for this controller (``tcp:IP:PORT``)."""
        host, port = self.settings.listen
        return f"tcp:{host}:{port}"

    def status(self) -> dict:
        """The controller's last status (see :meth:`controllers.core.ControllerCore.status`)."""
        return read_json_object(self.state_file) or {}

    def connections_offset(self) -> int:
        """Where the log of learned connections ends now: :meth:`learned_connections` from here gives what is
        learned after this moment."""
        try:
            return os.path.getsize(connections_log(self.state_file)) if self.state_file else 0
        except FileNotFoundError:
            return 0

    def learned_connections(self, offset: int = 0) -> list[tuple[str, str, int, int]]:
        """The TCP connections the controller learned (``ecmp``) after ``offset`` of its log, each as its
        lower-sorted direction's (src host, dst host, sport, dport)."""
        try:
            with open(connections_log(self.state_file), encoding="utf-8") as fh:
                fh.seek(offset)
                lines = fh.read().splitlines()
        except (FileNotFoundError, ValueError):
            return []
        out = []
        for line in lines:
            try:
                src, dst, sport, dport = json.loads(line)
                out.append((str(src), str(dst), int(sport), int(dport)))
            except (ValueError, TypeError):
                continue  # a line cut short by a crash
        return out

    def wait_installed(self, timeout: float = 60.0, switches: int | None = None,
                       no_failures: bool = True) -> dict:
        """Wait until every switch is connected and has confirmed its entries; return the status.

        With ``no_failures`` also wait until the controller sees no link down
        (right after bring-up some ports may still report down for a moment).
        """
        want = len(self.topo.switches) if switches is None else switches
        def installed() -> dict | None:
            st = self.status()
            if len(st.get("installed", [])) >= want and not (no_failures and st.get("failed_links")):
                return st
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"controller exited: {self.log_tail()}")
            return None

        st = wait_until(installed, timeout)
        if st is None:
            raise RuntimeError(f"only {len(self.status().get('installed', []))} of {want} switches installed "
                               f"after {timeout:g} s: {self.log_tail()}")
        return st

    def log_path(self) -> str:
        return self.log_file or (os.path.join(self.state.path, "controller.log") if self.state else "")

    def log_text(self) -> str:
        if self.state is None and not self.log_file:
            return self.last_log
        try:
            with open(self.log_path(), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        return " | ".join(self.log_text().strip().splitlines()[-lines:]) or "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to the switches. The log is kept; :meth:`start` may follow."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)
        self.stop()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; remove the run-state directory. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self.state is not None:
            self.last_log = self.log_text()
            self.state.remove()
            self.state = None
