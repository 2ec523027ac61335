"""Cluster "servers" made of namespaces on this one machine, for the integration tests of issue 28.

:class:`NamespaceServers` owns everything it starts, and ends it all by recorded pid:

* per server, a holder process (``sleep``) whose network, mount and UTS namespaces *are* the server, its
  host name the server's name, with private tmpfs mounts on ``/run`` (so ``/run/openvswitch``, ``/run/sshd``
  and the project's run-state root ``/run/ef-emu`` are its own), ``/etc/openvswitch`` and
  ``/var/log/openvswitch``;
* per server, its own ``ovsdb-server`` and ``ovs-vswitchd`` (userspace datapath) and its own ``sshd`` (own
  host key, key-only root login), their logs and sshd's configuration in ``FOLDER/NAME/``;
* the underlay: a network namespace with a Linux bridge, and a veth from it to each server (``uplink0``
  there, 10.77.0.1/24, 10.77.0.2/24, ... in server order);
* the client key ``FOLDER/cluster_key`` and the cluster file ``FOLDER/CLUSTER_NAME.yaml`` naming the servers.

Nothing is made in the machine's own namespaces: each veth is created in the underlay's namespace with its
peer placed straight into the server's, so the machine's interfaces, Open vSwitch and sshd never see the
servers. The namespaces vanish with their last process.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType

import yaml

from emulator.base.waiting import wait_until
from emulator.emulation.machine.started import proc_start_time
from emulator.runs import cluster_file
from emulator.runs.cluster_file import Cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
UNDERLAY = ipaddress.IPv4Network("10.77.0.0/24")
UNDERLAY_BRIDGE = "efunder"
#: The server's end of its underlay veth. Not ``ef*``: the project's cleanup treats such interfaces as its own.
UPLINK = "uplink0"
PRIVATE_MOUNTS = ("/run", "/etc/openvswitch", "/var/log/openvswitch")
OVS_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
OVS_DB = "/etc/openvswitch/conf.db"
OVS_DB_NAME = "Open_vSwitch"
#: As the Makefile's ``openvswitch`` target starts the machine's ovs-vswitchd (its comment says why).
OVS_GLIBC_TUNABLES = "glibc.malloc.trim_threshold=268435456"
OVS_DAEMONS = ("ovs-vswitchd", "ovsdb-server")
#: The order teardown ends a server's daemons in: whatever could still start something first.
DAEMONS = ("sshd", *OVS_DAEMONS)
SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
#: Files of the run-state root that outlive every run by design.
LOCK_FILES = frozenset({"network.lock"})
NAMESPACES = ("net", "mnt", "uts")
UNSHARE_FLAGS = {"net": "--net", "mnt": "--mount", "uts": "--uts"}
#: ``up-NAME`` must fit Linux's 15-character interface names.
MAX_NAME = 12
START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Proc:
    """A process as recorded: its pid and start time, so a recycled pid is never taken for it."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> Proc:
        return cls(pid, proc_start_time(pid))

    def alive(self) -> bool:
        now = proc_start_time(self.pid)
        return now is not None and now == self.start

    def kill(self) -> None:
        if self.pid <= 1 or self.pid == os.getpid():
            raise RuntimeError(f"namespace servers: refusing to kill pid {self.pid}")
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class _Server:
    name: str
    address: str
    holder: subprocess.Popen[bytes]
    namespaces: dict[str, int]
    #: The harness's own daemons in it, by name: sshd, ovs-vswitchd, ovsdb-server.
    daemons: dict[str, Proc] = field(default_factory=dict)
    sshd: subprocess.Popen[bytes] | None = None


class NamespaceServers:
    """Servers as namespaces, their underlay, Open vSwitch and sshd each, and a cluster file naming them.

    Built in the constructor (torn down again if any step fails); :meth:`close` (or leaving the ``with``
    block) tears everything down, and may be called again.
    """

    def __init__(self, folder: str, names: Sequence[str] = ("a", "b"), head: str = "a",
                 underlay_mtu: int = 9100, cluster_name: str = "nslab") -> None:
        _check_names(names, head)
        self.folder = os.path.abspath(folder)
        self.names = list(names)
        self.head = head
        self.underlay_mtu = underlay_mtu
        self.cluster_name = cluster_name
        self.cluster_path = os.path.join(self.folder, f"{cluster_name}.yaml")
        self.key = os.path.join(self.folder, "cluster_key")
        self._servers: dict[str, _Server] = {}
        self._underlay: subprocess.Popen[bytes] | None = None
        self._underlay_ns: dict[str, int] = {}
        #: Every process this harness ended or means to end, so that :meth:`remaining` can tell they are gone.
        self._ended: set[Proc] = set()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self.cluster: Cluster = cluster_file.load(self.cluster_path)

    def __enter__(self) -> NamespaceServers:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # --- commands in a server ---

    def pid(self, name: str) -> int:
        """The holder process whose network, mount and UTS namespaces are server ``name`` (``sleep`` itself:
        unshare runs without ``--fork`` and execs it in the new namespaces)."""
        return self._servers[name].holder.pid

    def namespaces(self, name: str) -> dict[str, int]:
        """Server ``name``'s namespaces: kind (net, mnt, uts) to inode, as ``/proc/PID/ns/KIND`` shows them."""
        return dict(self._servers[name].namespaces)

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """The argument list that runs ``argv`` in server ``name`` (for a :class:`subprocess.Popen` of one's own)."""
        return ["nsenter", "-t", str(self.pid(name)), "-n", "-m", "-u", "--", *argv]

    def run(self, name: str, argv: Sequence[str], timeout: float = 60.0,
            **kw: object) -> subprocess.CompletedProcess[str]:
        """``argv`` in server ``name``, its output captured as text (``kw`` goes to :func:`subprocess.run`)."""
        return subprocess.run(self.command(name, argv), timeout=timeout, text=True, capture_output=True,
                              **kw)  # type: ignore[call-overload]

    def emu(self, name: str, args: Sequence[str], timeout: float = 600.0,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``python -m emulator ARGS`` in server ``name``, in the repository's root."""
        # Entering a mount namespace moves nsenter to its "/": --wd takes it back to the repository.
        argv = ["nsenter", "-t", str(self.pid(name)), "-n", "-m", "-u", f"--wd={REPO_ROOT}", "--",
                sys.executable, "-m", "emulator", *args]
        return subprocess.run(argv, timeout=timeout, text=True, capture_output=True,
                              env=dict(os.environ if env is None else env))

    # --- fault injection ---

    def kill_sshd(self, name: str) -> None:
        """SIGKILL server ``name``'s sshd (the listener; sessions it started live on)."""
        server = self._servers[name]
        _end([server.daemons["sshd"]])
        if server.sshd is not None:
            server.sshd.wait()

    def kill_ovs(self, name: str) -> None:
        """SIGKILL server ``name``'s ovs-vswitchd and ovsdb-server."""
        _end([self._servers[name].daemons[d] for d in OVS_DAEMONS])

    def restart_ovs(self, name: str) -> None:
        """Start server ``name``'s Open vSwitch again (after :meth:`kill_ovs`), on its database as it was."""
        self._start_ovs(self._servers[name])

    # --- what is left ---

    def leftovers(self) -> list[str]:
        """One line per thing of the project's left in any server: its Open vSwitch bridges, interfaces named
        ``ef*``, processes other than the harness's own, files of its run-state root but the lock; [] when clean."""
        lines: list[str] = []
        for server in self._servers.values():
            if server.holder.poll() is not None:
                continue  # torn down
            lines += [f"{server.name}: bridge {b}" for b in self._bridges(server)]
            lines += [f"{server.name}: interface {i}" for i in _interfaces(server.holder.pid) if i.startswith("ef")]
            lines += [f"{server.name}: process {p.pid} {_describe(p.pid)}" for p in self._strangers(server)]
            lines += [f"{server.name}: file /run/ef-emu/{f}" for f in _run_state_files(server.holder.pid)]
        return lines

    def remaining(self) -> list[str]:
        """After :meth:`close`: one line per process the harness started or ended that still runs; [] when none."""
        return [f"process {p.pid} {_describe(p.pid)}" for p in sorted(self._ended, key=lambda p: p.pid) if p.alive()]

    # --- teardown ---

    def close(self) -> None:
        """End every process of the servers and the underlay by pid (daemons, then whatever else runs in their
        namespaces, then the holders); the namespaces vanish with them. Idempotent."""
        servers = list(self._servers.values())
        _end(self._record([s.daemons[d] for d in DAEMONS for s in servers if d in s.daemons]))
        held = [(s.holder, s.namespaces) for s in servers]
        if self._underlay is not None:
            held.append((self._underlay, self._underlay_ns))
        # Only a live holder pins its namespaces: once all their processes are gone, another namespace may get
        # the same inode. Nothing can enter them but through what already runs there: end it until none is left.
        pinned = [namespaces for holder, namespaces in held if holder.poll() is None]
        holders = {holder.pid for holder, _ in held}
        def ended() -> bool:
            strangers = [p for p in _processes_in(pinned) if p.pid not in holders]
            _end(self._record(strangers), timeout_s=1.0)
            return not strangers
        wait_until(ended, START_TIMEOUT_S, 0.0)
        for holder, _ in held:
            if holder.poll() is None:
                _end(self._record([Proc.of(holder.pid)]))
            holder.wait()
        for server in servers:
            if server.sshd is not None:
                server.sshd.wait()
        left = self.remaining()
        if left:
            raise RuntimeError(f"namespace servers: still running after teardown: {'; '.join(left)}")

    def _record(self, procs: Sequence[Proc]) -> list[Proc]:
        self._ended.update(p for p in procs if p.start is not None)
        return list(procs)

    # --- construction ---

    def _build(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        # Every build makes new host keys: an earlier build's record of them would fail ssh's check.
        known_hosts = os.path.join(self.folder, f"{self.cluster_name}.known_hosts")
        if os.path.exists(known_hosts):
            os.remove(known_hosts)
        _keygen(self.key, f"{self.cluster_name} client")
        shutil.copyfile(f"{self.key}.pub", self._authorized_keys)
        self._underlay, self._underlay_ns = _start_holder(["net"])
        self._in_underlay(["ip", "link", "add", UNDERLAY_BRIDGE, "mtu", str(self.underlay_mtu), "type", "bridge"])
        self._in_underlay(["ip", "link", "set", UNDERLAY_BRIDGE, "up"])
        for i, name in enumerate(self.names):
            self._add_server(name, str(UNDERLAY.network_address + 1 + i))
        self._check_pings()
        self._write_cluster_file()

    def _add_server(self, name: str, address: str) -> None:
        os.makedirs(os.path.join(self.folder, name), exist_ok=True)
        holder, namespaces = _start_holder(NAMESPACES)
        server = _Server(name, address, holder, namespaces)
        self._servers[name] = server
        self._check(name, ["hostname", name])
        for path in PRIVATE_MOUNTS:
            self._check(name, ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path])
        self._check(name, ["mkdir", "-m", "0755", "/run/sshd", "/run/openvswitch"])
        self._link(server)
        self._start_ovs(server)
        self._start_sshd(server)

    def _link(self, server: _Server) -> None:
        mtu = str(self.underlay_mtu)
        outer = f"up-{server.name}"
        # The peer is created straight in the server's namespace: never, even briefly, in the machine's.
        self._in_underlay(["ip", "link", "add", outer, "mtu", mtu, "type", "veth", "peer", "name", UPLINK,
                           "mtu", mtu, "netns", str(server.holder.pid)])
        self._in_underlay(["ip", "link", "set", outer, "master", UNDERLAY_BRIDGE, "up"])
        self._check(server.name, ["ip", "link", "set", "lo", "up"])
        self._check(server.name, ["ip", "addr", "add", f"{server.address}/{UNDERLAY.prefixlen}", "dev", UPLINK])
        self._check(server.name, ["ip", "link", "set", UPLINK, "up"])

    def _start_ovs(self, server: _Server) -> None:
        logs = os.path.join(self.folder, server.name)
        if not os.path.exists(f"/proc/{server.holder.pid}/root{OVS_DB}"):  # the server's own /etc/openvswitch
            self._check(server.name, ["ovsdb-tool", "create", OVS_DB, OVS_SCHEMA])
        # --detach returns once the daemon is ready; each pid is recorded before the next step can fail.
        self._check(server.name, ["ovsdb-server", OVS_DB, "--remote=punix:/run/openvswitch/db.sock", "--pidfile",
                                  "--detach", f"--log-file={logs}/ovsdb-server.log"])
        server.daemons["ovsdb-server"] = self._pidfile(server, "ovsdb-server")
        self._check(server.name, ["ovs-vsctl", "--no-wait", "init"])
        self._check(server.name, ["ovs-vswitchd", "--pidfile", "--detach", f"--log-file={logs}/ovs-vswitchd.log"],
                    env={**os.environ, "GLIBC_TUNABLES": OVS_GLIBC_TUNABLES})
        server.daemons["ovs-vswitchd"] = self._pidfile(server, "ovs-vswitchd")
        self._check(server.name, ["ovs-vsctl", "--timeout=10", "show"])

    def _start_sshd(self, server: _Server) -> None:
        here = os.path.join(self.folder, server.name)
        host_key = os.path.join(here, "ssh_host_ed25519_key")
        _keygen(host_key, f"{server.name} host")
        config = os.path.join(here, "sshd_config")
        Path(config).write_text(_sshd_config(server.address, host_key, self._authorized_keys), encoding="utf-8")
        self._check(server.name, [SSHD, "-t", "-f", config])
        log = os.path.join(here, "sshd.log")
        server.sshd = subprocess.Popen(self.command(server.name, [SSHD, "-D", "-f", config, "-E", log]),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # nsenter without a pid namespace execs rather than forks: this pid becomes sshd's.
        server.daemons["sshd"] = Proc.of(server.sshd.pid)
        if not wait_until(lambda: _listening(server, log), START_TIMEOUT_S):
            raise RuntimeError(f"server {server.name}: sshd does not listen on {server.address}:{SSH_PORT} "
                               f"after {START_TIMEOUT_S:.0f} s (see {log})")

    def _check_pings(self) -> None:
        for src in self._servers.values():
            for dst in self._servers.values():
                if src is not dst and not wait_until(partial(self._ping, src, dst), START_TIMEOUT_S, 0.1):
                    raise RuntimeError(f"server {src.name} cannot ping {dst.name} ({dst.address}) on the underlay")

    def _ping(self, src: _Server, dst: _Server) -> bool:
        return self.run(src.name, ["ping", "-c", "1", "-W", "1", dst.address], timeout=5).returncode == 0

    def _write_cluster_file(self) -> None:
        servers = [{"name": s.name, "ssh": s.address, "key": self.key, "underlay": s.address}
                   for s in self._servers.values()]
        # private: the underlay is a bridge in a namespace of its own, which nothing else reaches
        data = {"name": self.cluster_name, "head": self.head, "underlay_mtu": self.underlay_mtu,
                "private_underlay": True, "servers": servers}
        Path(self.cluster_path).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    @property
    def _authorized_keys(self) -> str:
        return os.path.join(self.folder, "authorized_keys")

    def _check(self, name: str, argv: Sequence[str], **kw: object) -> None:
        result = self.run(name, argv, timeout=30.0, **kw)
        if result.returncode != 0:
            raise RuntimeError(f"server {name}: {' '.join(argv)} failed ({result.returncode}): "
                               f"{(result.stderr or result.stdout).strip()}")

    def _in_underlay(self, argv: Sequence[str]) -> None:
        assert self._underlay is not None
        _checked(["nsenter", "-t", str(self._underlay.pid), "-n", "--", *argv])

    def _pidfile(self, server: _Server, daemon: str) -> Proc:
        path = f"/proc/{server.holder.pid}/root/run/openvswitch/{daemon}.pid"
        proc = Proc.of(int(Path(path).read_text(encoding="ascii").strip()))
        if _namespaces_of(proc.pid).get("net") != server.namespaces["net"]:
            raise RuntimeError(f"server {server.name}: {path} names pid {proc.pid}, which is not in the server")
        return proc

    # --- reading a server ---

    def _bridges(self, server: _Server) -> list[str]:
        if server.daemons.get("ovsdb-server", Proc(0, None)).alive():
            result = self.run(server.name, ["ovs-vsctl", "--timeout=5", "list-br"], timeout=10)
            if result.returncode == 0:
                return result.stdout.split()
        # ovsdb-server is down (killed, say): the bridges a restarted one would bring back are in the file.
        query = [OVS_DB_NAME, {"op": "select", "table": "Bridge", "where": [], "columns": ["name"]}]
        result = self.run(server.name, ["ovsdb-tool", "query", OVS_DB, json.dumps(query)], timeout=10)
        if result.returncode != 0:
            return [f"(unreadable: {result.stderr.strip()})"]
        return sorted(row["name"] for row in json.loads(result.stdout)[0]["rows"])

    def _strangers(self, server: _Server) -> list[Proc]:
        own = {server.holder.pid} | {p.pid for p in server.daemons.values()}
        return [p for p in _processes_in([server.namespaces]) if p.pid not in own]


def _check_names(names: Sequence[str], head: str) -> None:
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"server names must be distinct and at least one: {list(names)}")
    for name in names:
        if not cluster_file.SERVER_NAME.fullmatch(name) or len(name) > MAX_NAME:
            raise ValueError(f"server name {name!r}: letters, digits and -, at most {MAX_NAME} characters")
    if head not in names:
        raise ValueError(f"head {head!r} is not one of the servers {list(names)}")


def _start_holder(kinds: Sequence[str]) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``unshare`` of new namespaces of ``kinds`` running ``sleep infinity``, and those namespaces' inodes,
    once sleep runs in them; on any failure the holder is ended again."""
    flags = [UNSHARE_FLAGS[kind] for kind in kinds] + (["--propagation", "private"] if "mnt" in kinds else [])
    # Without --fork unshare execs sleep in place: the holder is the Popen's own pid.
    holder = subprocess.Popen(["unshare", *flags, "--", "sleep", "infinity"], stdin=subprocess.DEVNULL)
    sleep = os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep")

    def entered() -> bool:
        if holder.poll() is not None:
            raise RuntimeError(f"unshare {' '.join(flags)} exited with {holder.returncode}")
        try:
            return os.readlink(f"/proc/{holder.pid}/exe") == sleep
        except OSError:
            return False
    try:
        if not wait_until(entered, START_TIMEOUT_S, 0.005):
            raise RuntimeError(f"unshare {' '.join(flags)} did not start sleep within {START_TIMEOUT_S:.0f} s")
        return holder, _new_namespaces(holder.pid, kinds)
    except BaseException:
        holder.kill()
        holder.wait()
        raise


def _namespaces_of(pid: int) -> dict[str, int]:
    found = {}
    for kind in NAMESPACES:
        try:
            found[kind] = os.stat(f"/proc/{pid}/ns/{kind}").st_ino
        except OSError:
            pass
    return found


def _new_namespaces(pid: int, kinds: Sequence[str]) -> dict[str, int]:
    """The namespaces of ``kinds`` that ``pid`` was made with, checked to be none of this process's own: every
    process in them is ended at teardown, and the machine's own must never be among them."""
    found = _namespaces_of(pid)
    own = _namespaces_of(os.getpid())
    new = {kind: found[kind] for kind in kinds if kind in found}
    if len(new) != len(kinds) or any(own.get(kind) == inode for kind, inode in new.items()):
        raise RuntimeError(f"holder {pid} is not in new {'/'.join(kinds)} namespaces: {found}")
    return new


def _processes_in(namespaces: Sequence[Mapping[str, int]]) -> list[Proc]:
    """Every process in any of ``namespaces`` (of any kind: a Mininet host started in a server has a network
    namespace of its own but the server's mount namespace); never in this process's or init's namespaces."""
    own = set(_namespaces_of(os.getpid()).items()) | set(_namespaces_of(1).items())
    wanted = {(kind, inode) for ns in namespaces for kind, inode in ns.items()} - own
    return [Proc.of(pid) for pid in _pids() if wanted & set(_namespaces_of(pid).items())]


def _pids() -> Iterator[int]:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            yield int(entry)


def _end(procs: Sequence[Proc], timeout_s: float = START_TIMEOUT_S) -> None:
    """SIGKILL each process and wait until it is gone (a zombie counts as gone: its namespaces are released)."""
    for proc in procs:
        proc.kill()
    wait_until(lambda: not any(p.alive() for p in procs), timeout_s, 0.01)


def _interfaces(pid: int) -> list[str]:
    """The interfaces of ``pid``'s network namespace (``/proc/PID/net/dev`` is that namespace's view)."""
    try:
        lines = Path(f"/proc/{pid}/net/dev").read_text(encoding="ascii").splitlines()[2:]
    except OSError:
        return []
    return [line.split(":", 1)[0].strip() for line in lines]


def _run_state_files(pid: int) -> list[str]:
    # /proc/PID/root resolves paths in PID's mount namespace: the server's own /run.
    root = f"/proc/{pid}/root/run/ef-emu"
    found = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        found += [os.path.normpath(os.path.join(rel, f)) for f in files]
        if not files and not dirs and rel != ".":
            found.append(rel + "/")
    return sorted(f for f in found if f not in LOCK_FILES)


def _listening(server: _Server, log: str) -> bool:
    """True once sshd listens on the server's address (read from ``/proc/PID/net/tcp``: the server's view)."""
    assert server.sshd is not None
    if server.sshd.poll() is not None:
        raise RuntimeError(f"server {server.name}: sshd exited with {server.sshd.returncode}: "
                           f"{Path(log).read_text(encoding='utf-8', errors='replace').strip()}")
    address = int.from_bytes(ipaddress.IPv4Address(server.address).packed, "little")
    local = f"{address:08X}:{SSH_PORT:04X}"
    try:
        lines = Path(f"/proc/{server.sshd.pid}/net/tcp").read_text(encoding="ascii").splitlines()[1:]
    except OSError:
        return False
    listen = "0A"
    return any(f[1] == local and f[3] == listen for f in (line.split() for line in lines))


def _sshd_config(address: str, host_key: str, authorized_keys: str) -> str:
    return "\n".join([
        f"ListenAddress {address}",
        f"Port {SSH_PORT}",
        f'HostKey "{host_key}"',
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # Quoted: a bare space would separate two files.
        f'AuthorizedKeysFile "{authorized_keys}"',
        # The keys live in a test's temporary folder, whose owners and modes sshd's checks were not made for.
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "MaxSessions 500",
        "MaxStartups 500",
        "PidFile /run/sshd.pid",
        "PermitTunnel no",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _keygen(path: str, comment: str) -> None:
    for old in (path, f"{path}.pub"):
        if os.path.exists(old):
            os.remove(old)
    _checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def _checked(argv: Sequence[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")


def _describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(encoding="utf-8", errors="replace").replace("\0", " ").strip()
    except OSError:
        return "(gone)"

