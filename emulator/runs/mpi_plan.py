"""``emu mpirun``'s pure part: what an Open MPI run over the emulated fabric is, before anything starts.

Open MPI (Debian's 4.1) runs inside Mininet hosts this way (measured here,
docs/fidelity.md): ``mpirun`` itself runs inside rank 0's host; it starts an
``orted`` in every other host through a *launch agent* (``plm_rsh_agent``), a
shell script this module writes (:func:`launch_agent_script`) that maps a
host's IP address to the pid of its namespace and runs the command there with
``mnexec -a PID``; the hostfile lists host IPs with one slot each
(:func:`hostfile_text`; host names cost about 100 s of resolver timeouts);
the out-of-band and TCP transports are confined to the hosts' subnet; ranks
are not bound to cores (every emulated host sees the machine's two cores, so
Open MPI's default binding would pile every rank onto core 0).

This module owns the checks of ``emu mpirun``'s input (:func:`check` gives
one :class:`~emulator.base.errors.FieldError` per bad field: an unknown program,
``--np`` above the hosts, a bad placement name or file, a malformed or
reserved ``--mca``), the rank-to-host map (:func:`rank_hosts`), the
``mpirun`` command line (:func:`mpirun_command`). What the run measured is
:mod:`emulator.runs.mpi_results`'; the live side is
:mod:`emulator.emulation.mpi.mpi_run`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.errors import FieldError
from emulator.base.naming import HOST_SUBNET
from emulator.model import routing
from emulator.model.collectives.placements import PLACEMENTS, placement_hosts
from emulator.model.fabric import FabricProfile, OnNetwork, Resolved
from emulator.model.latency import SHAPER_BURST_BYTES, LatencyModel
from emulator.model.prediction.cost import path_byte_s
from emulator.model.topology import DEFAULT_MTU, Topology, tcp_goodput_factor, tcp_payload_bytes

WHERE = "mpirun"
#: Open MPI's launcher; Debian's openmpi-bin puts it on the PATH.
MPIRUN = "mpirun"
#: util-linux's prlimit: starts mpirun under the run's memory limit (RLIMIT_DATA, soft and hard).
PRLIMIT = "prlimit"
#: The bundled benchmark (:mod:`emulator.runs.allreduce_bench`): ``emu mpirun`` asks it for a JSON copy of its rows.
BENCH_PROGRAM = "emu-allreduce-bench"
BENCH_JSON = "bench.json"
DEFAULT_TIMEOUT_S = 900.0
#: Open MPI's progress engine busy-polls; at this niceness its ranks (mpirun's children, and the orteds the
#: launch agent starts) spin only on CPU time that the datapath, the kernel and the controller leave idle.
DEFAULT_NICE = 19
#: What ``emu mpirun`` sets itself: the launch agent and the interfaces are what make Open MPI work in the
#: emulated hosts at all, and the output files are where the run's folder collects each rank's output.
RESERVED_MCA = ("plm_rsh_agent", "plm_rsh_no_tree_spawn", "oob_tcp_if_include", "btl_tcp_if_include",
                "orte_output_filename", "btl_tcp_port_min_v4", "btl_tcp_port_range_v4")
#: The ports the ranks' TCP transport listens on: below the kernel's ephemeral ports, so that a connection
#: with one end here is the transport's, not the out-of-band channel's (the prediction routes it by its ports,
#: emulator.runs.mpi_prediction), and below the agents' source ports. An aligned power-of-two block: a host's
#: queue keeps these connections' packets in order with one masked match
#: (:func:`emulator.emulation.network.tc_commands.host_queue_commands`).
BTL_PORT_MIN = 16384
BTL_PORT_RANGE = 1024
#: The least the library may hold per socket (bytes): a kernel's default receive buffer.
MIN_QUEUE_BYTES = 128 << 10
#: The preloaded library that gives Open MPI's messages the fabric's latency (``emulator/emulation/mpi/mpi_latency.c``;
#: ``make setup`` builds it into the venv's ``lib``).
LATENCY_LIBRARY = "ef-mpi-latency.so"
#: Messages up to this size go eagerly (no rendezvous), in one fragment of the TCP transport.
TCP_EAGER_BYTES = 1 << 20
#: Larger messages: a rendezvous carrying this much data, then fragments of :data:`TCP_FRAGMENT_BYTES`, at most
#: :data:`SEND_PIPELINE_DEPTH` of them queued in the transport at a time. The reply to a rendezvous crosses the
#: connection that carries the replier's own data, first in first out: in an exchange one side's data started
#: after the other's by what that side had queued (its fragments in the transport and the socket's unsent
#: bytes), about 40 ms with two fragments of 32 KiB. With one of 16 KiB a 4 MiB Rabenseifner on 16 ranks of
#: BiGraph without latency went from 1.09-1.14 of the model to 1.07-1.09 (docs/fidelity.md, 2026-12-05 morning).
TCP_RENDEZVOUS_DATA_BYTES = 4 << 10
TCP_FRAGMENT_BYTES = 16 << 10
SEND_PIPELINE_DEPTH = 1
#: How long the library makes a rank's ``sched_yield()`` sleep (microseconds), in every run (latency or not).
#: Open MPI's main thread yields in a loop while it waits (``mpi_yield_when_idle``); sixteen such loops kept
#: about a quarter of this machine's two cores busy, and a 16 MiB ring on 16 ranks of BiGraph ran at 1.10-1.15
#: of the model with 16% idle; sleeping 100 us, 1.07-1.08 with 30% idle. Sixteen threads waking every 100 us
#: still took most of a core (a 4 MiB Rabenseifner without latency: 57-61% idle over the run); every 1 ms,
#: 67-69% idle, and that Rabenseifner went from 1.11-1.16 of the model to 1.09-1.14 (docs/fidelity.md). A rank
#: notices a finished request at most this much (and the kernel's 50 us timer slack) late, against the 40 ms of
#: the default profile's dilated per-message latency and the 26 ms a 64 KiB message takes on a link.
YIELD_SLEEP_US = 1000
#: The TCP transport's flags without ``put``: large messages use the send protocol (fragments pipelined on the
#: socket), not the RDMA emulation that sends the whole rest of a message as one fragment.
TCP_FLAGS_WITHOUT_PUT = "send,inplace,need-ack,need-csum,hetero-rdma"
#: Host settings for the time of an MPI run (then :data:`HOST_SYSCTLS_AFTER`): what a socket may hold unsent.
#: Open MPI's transport takes a fragment as sent once it is in the socket: without a bound, the socket holds
#: megabytes, and a rendezvous reply written after them waits that long (docs/fidelity.md).
HOST_SYSCTLS = (("net.ipv4.tcp_notsent_lowat", str(32 << 10)),)
#: The kernel's defaults of :data:`HOST_SYSCTLS` (a new network namespace's), restored after the run.
HOST_SYSCTLS_AFTER = (("net.ipv4.tcp_notsent_lowat", "4294967295"),)
#: Set unless the user gives their own value (docs/fidelity.md, "Open MPI over the fabric" and "why Open MPI
#: lost half the link"). Open MPI's TCP transport carries both directions between two ranks, and its own control
#: messages, on one connection, first in first out: whatever is queued on it delays a partner's rendezvous
#: reply. So:
#:
#: * TCP between hosts and loopback within a rank (one rank per host);
#: * the TCP transport's progress thread, which waits in the kernel where the main thread's progress loop spins
#:   (the cores stay idle at the same busbw);
#: * the main thread yields while it waits (``mpi_yield_when_idle``): every rank shares this machine's cores, and
#:   without it sixteen spinning main threads kept the progress threads that had bytes to read off the cores,
#:   a wait of about 13 ms per step (a 64 KiB ring on 16 ranks of a star: 453 ms without, 55 ms with);
#: * no ``put``: with it, the rest of a message after the rendezvous went as one fragment, and the reply to the
#:   partner's rendezvous waited behind all of it, so an exchange's two directions took turns;
#: * messages up to :data:`TCP_EAGER_BYTES` eager (no handshake), a rendezvous with little data and one small
#:   fragment at a time above it (a reply waits behind little of the replier's data). Eager above 1 MiB too was
#:   no better: it lets a rank that finished a step send the next one's data into links its partners still
#:   share (a 4 MiB Rabenseifner on leaf-spine with ECMP: 1.00-1.26 of the model, against 1.03-1.10).
DEFAULT_MCA = (("btl", "tcp,self"), ("btl_tcp_progress_thread", "1"), ("mpi_yield_when_idle", "1"),
               ("btl_tcp_flags", TCP_FLAGS_WITHOUT_PUT),
               ("btl_tcp_eager_limit", str(TCP_EAGER_BYTES)),
               ("btl_tcp_rndv_eager_limit", str(TCP_RENDEZVOUS_DATA_BYTES)),
               ("btl_tcp_max_send_size", str(TCP_FRAGMENT_BYTES)),
               ("pml_ob1_send_pipeline_depth", str(SEND_PIPELINE_DEPTH)))
_MCA_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class MpiRunConfig(OnNetwork):
    """``emu mpirun``'s input, as given: the network it runs on (the topology and the real fabric it stands for,
    :func:`emulator.model.fabric.resolve` without the servers' interconnect), the program, and how."""

    network: Resolved
    routing: str
    out: str
    program: tuple[str, ...]
    seed: int = 0
    placement: str = "identity"
    np: int | None = None  # default: every host of the topology
    mca: tuple[tuple[str, str], ...] = ()
    datapath: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    nice: int = DEFAULT_NICE
    #: RLIMIT_DATA of every process of the run (bytes); None: sized from the admission estimate
    #: (:func:`emulator.runs.admission.mpi_rank_limit_bytes`)
    memory_limit_bytes: int | None = None
    #: the fabric's per-message and per-switch latency on Open MPI's messages (:data:`LATENCY_LIBRARY`); off:
    #: the links stand for its bandwidth only
    latency: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"topology": self.topology, "routing": self.routing, "out": self.out, "program": list(self.program),
                "seed": self.seed, "placement": self.placement, "np": self.np,
                "mca": [list(kv) for kv in self.mca], "fabric": self.fabric.spec(), "datapath": self.datapath,
                "timeout_s": self.timeout_s, "nice": self.nice, "memory_limit_bytes": self.memory_limit_bytes,
                "latency": self.latency}


def message_profile(profile: FabricProfile, latency: bool) -> FabricProfile:
    """``profile`` as an Open MPI run's messages get it: all of it with ``latency`` (the preloaded
    :data:`LATENCY_LIBRARY`), else its rates only, none of its per-message and per-switch latency (there is no
    netem here)."""
    return profile if latency else profile.changed(alpha_us=0.0, switch_latency_us=0.0)


#: Open MPI's ob1 header on an eager message (bytes): a message goes eagerly when it fits the eager limit with it.
EAGER_HEADER_BYTES = 64


def eager_bytes(mca: Sequence[tuple[str, str]]) -> int:
    """The largest message Open MPI sends eagerly in a run with the user's ``mca`` (or the default limit)."""
    given = dict(mca).get("btl_tcp_eager_limit", str(TCP_EAGER_BYTES))
    try:
        return max(0, int(given) - EAGER_HEADER_BYTES)
    except ValueError:
        return TCP_EAGER_BYTES - EAGER_HEADER_BYTES


#: Open MPI's choice of how its event loop waits (two names for one parameter); the latency library interposes
#: ``poll``, Open MPI's default here.
EVENT_LOOP_MCA = ("opal_event_include", "event_external_event_include")


def check_latency_mca(mca: Sequence[tuple[str, str]]) -> None:
    """:class:`FieldError` when the user's ``mca`` moves Open MPI's event loop off ``poll``, which the latency
    library needs to hold bytes back."""
    for key, value in mca:
        if key in EVENT_LOOP_MCA and value != "poll":
            raise FieldError(WHERE, "mca", f"{key} poll (the latency library holds bytes back by interposing "
                             "poll), or --latency off", value)


def has_latency(profile: FabricProfile) -> bool:
    """True when the profile asks for any per-message or per-switch latency."""
    return profile.alpha_s > 0 or profile.switch_latency_s > 0


@dataclass(frozen=True)
class LatencyHold:
    """How long the preloaded library holds bytes from ``sender`` that reached ``receiver`` (IPs) before it
    hands them to the program: ``seconds``, and ``byte_s`` per byte of the segment they came in."""

    receiver: str
    sender: str
    seconds: float
    #: The path's links' seconds per payload byte: a frame's serialisation on every link, which the emulated
    #: links do not charge it (:meth:`emulator.model.latency.PathLatency.unshaped_s`)
    byte_s: float = 0.0


def latency_holds(topo: Topology, hosts: Sequence[str], model: LatencyModel, policy: str = "shortest",
                  seed: int = 0, mtu: int = DEFAULT_MTU) -> list[LatencyHold]:
    """Per ordered pair of the ranks' hosts: the profile's message latency over their path's switches, less
    this machine's own latency the bytes have already spent on the way (the calibrated ``data``), never below
    0; and what the emulated links do not charge a frame (its serialisation and the shapers' burst on every
    link of the path ``policy`` routes a transport connection on). The agents' rule without its rendezvous
    part: Open MPI sends eagerly up to its eager limit, and its rendezvous is its own messages, each held in
    turn. The agents give back the serialisation of a message's last frame; the library, that cannot tell
    where a message ends, gives back every frame's (the same for a message's last byte). Under ``ecmp`` a
    connection's own path may differ from the one taken here; its links have the same rates wherever the
    fabric's equal-cost paths do."""
    goodput = tcp_goodput_factor(mtu)
    pairs = [(receiver, sender) for receiver in hosts for sender in hosts if sender != receiver]
    routes = routing.routes(topo, policy, [routing.Flow(sender, receiver, routing.IPPROTO_TCP, BTL_PORT_MIN,
                                                        BTL_PORT_MIN) for receiver, sender in pairs], seed=seed)
    out = []
    for (receiver, sender), route in zip(pairs, routes, strict=True):
        path = model.path(topo.switch_hops(sender, receiver))
        byte_s = path_byte_s(topo, route, goodput)
        out.append(LatencyHold(topo.host(receiver).ip, topo.host(sender).ip,
                               max(0.0, path.message_target_s - path.data_s) + SHAPER_BURST_BYTES * byte_s, byte_s))
    return out


def queue_bytes(holds: Sequence[LatencyHold], link_mbps: float, mtu: int = DEFAULT_MTU) -> int:
    """How much the library may hold per socket: what a link delivers during the longest hold (of a full
    frame), twice (for the bytes a program has not read yet); at least :data:`MIN_QUEUE_BYTES`."""
    frame = tcp_payload_bytes(mtu)
    longest = max((h.seconds + h.byte_s * frame for h in holds), default=0.0)
    return max(MIN_QUEUE_BYTES, int(2 * longest * link_mbps * 1e6 / 8))


def latency_file_text(holds: Sequence[LatencyHold]) -> str:
    """The library's file (``EF_LATENCY_FILE``): one ``RECEIVER SENDER SECONDS BYTE_SECONDS`` line per pair."""
    return "".join(f"{h.receiver} {h.sender} {h.seconds:.9f} {h.byte_s:.6e}\n" for h in holds)


def yield_environment(library: str) -> list[tuple[str, str]]:
    """What every rank's environment gets in any run: the library preloaded, and how long a yielding main
    thread sleeps (:data:`YIELD_SLEEP_US`). Without it sixteen waiting main threads spun in ``sched_yield()``:
    both cores busy through a 4 MiB allreduce without latency (docs/fidelity.md)."""
    return [("LD_PRELOAD", library), ("EF_YIELD_SLEEP_US", str(YIELD_SLEEP_US))]


def latency_environment(library: str, holds_file: str, queue: int) -> list[tuple[str, str]]:
    """:func:`yield_environment`, and for the latency the library's file, the BTL's ports (only sockets on
    them are held: Open MPI's start-up and control connections are not the fabric's) and the bytes it may hold
    per socket (:func:`queue_bytes`)."""
    return yield_environment(library) + [
        ("EF_LATENCY_FILE", holds_file), ("EF_LATENCY_PORTS", f"{BTL_PORT_MIN} {BTL_PORT_MIN + BTL_PORT_RANGE - 1}"),
        ("EF_LATENCY_QUEUE_BYTES", str(queue))]


def parse_mca(pairs: Sequence[Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """``--mca KEY VALUE`` pairs, checked: Open MPI parameter names, non-empty one-line values, none reserved."""
    out: dict[str, str] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise FieldError(WHERE, "mca", "KEY VALUE", " ".join(pair))
        key, value = pair
        if not _MCA_NAME.match(key):
            raise FieldError(WHERE, "mca", "an Open MPI parameter name (lower-case letters, digits and _, e.g. "
                             "btl_tcp_eager_limit) followed by its value", key)
        if not value or not value.isprintable():
            raise FieldError(WHERE, "mca", f"a non-empty one-line value for {key}", value)
        if key in RESERVED_MCA:
            raise FieldError(WHERE, "mca", f"a parameter emu mpirun does not set itself ({', '.join(RESERVED_MCA)} "
                             "are its own)", key)
        out[key] = value
    return tuple(out.items())


def mca_settings(user: Sequence[tuple[str, str]], launch_agent: str) -> list[tuple[str, str]]:
    """Every MCA parameter of the run: the reserved ones, the defaults the user did not replace, the user's."""
    given = dict(user)
    own = [("plm_rsh_agent", launch_agent), ("plm_rsh_no_tree_spawn", "1"), ("oob_tcp_if_include", HOST_SUBNET),
           ("btl_tcp_if_include", HOST_SUBNET), ("btl_tcp_port_min_v4", str(BTL_PORT_MIN)),
           ("btl_tcp_port_range_v4", str(BTL_PORT_RANGE))]
    return own + [(k, v) for k, v in DEFAULT_MCA if k not in given] + list(user)


def read_placement_file(path: str) -> list[str]:
    """Host names, one per line in rank order (``#`` starts a comment); :class:`FieldError` if unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise FieldError(WHERE, "placement", "identity, hdrm, random or a readable file of host names",
                         f"{path} ({exc.__class__.__name__})") from None
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def rank_hosts(topo: Topology, placement: str, np: int | None, seed: int = 0,
               read_file: Callable[[str], list[str]] = read_placement_file) -> list[str]:
    """The host of every rank ``0..np-1``: the first ``np`` of the placement's order.

    ``placement`` is one of :data:`emulator.model.collectives.placements.PLACEMENTS`
    (hdrm as for schedules) or a file naming one host per rank
    (:func:`read_placement_file`; each host at most once, at least ``np`` of them).
    """
    hosts = len(topo.hosts)
    if np is not None and not 1 <= np <= hosts:
        raise FieldError(WHERE, "np", f"a number of ranks in 1..{hosts} (one rank per host of {topo.spec})", np)
    if placement in PLACEMENTS:
        try:
            order = placement_hosts(topo, placement, seed)
        except FieldError as exc:
            raise FieldError(WHERE, exc.field, exc.expected, exc.given) from None
    elif os.path.isfile(placement):
        order = read_file(placement)
        names = {h.name for h in topo.hosts}
        unknown = [n for n in order if n not in names]
        if unknown:
            raise FieldError(WHERE, "placement", f"host names of {topo.spec} (h1..h{hosts}) in {placement}", unknown[0])
        twice = sorted({n for n in order if order.count(n) > 1})
        if twice:
            raise FieldError(WHERE, "placement", f"each host at most once in {placement}", twice[0])
        if not order or (np is not None and len(order) < np):
            raise FieldError(WHERE, "placement", f"at least {np or 1} hosts in {placement}", len(order))
    else:
        raise FieldError(WHERE, "placement", f"one of {', '.join(PLACEMENTS)} or a file of host names",
                         placement)
    return order[:np] if np is not None else order


def resolve_program(name: str, which: Callable[[str], str | None] = shutil.which,
                    own_bin: str | None = None) -> str:
    """The absolute path of the program to run: a path as given, else this venv's scripts first, then PATH."""
    if not name:
        raise FieldError(WHERE, "program", "a program after --, e.g. -- emu-allreduce-bench --algo ring", "nothing")
    if os.sep in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return os.path.abspath(name)
        raise FieldError(WHERE, "program", "an executable file", name)
    if own_bin is not None:
        mine = os.path.join(own_bin, name)
        if os.path.isfile(mine) and os.access(mine, os.X_OK):
            return mine
    found = which(name)
    if found is None:
        raise FieldError(WHERE, "program", "a program on PATH or in this emulator's venv (e.g. emu-allreduce-bench)",
                         name)
    return os.path.abspath(found)


def program_argv(program: Sequence[str], resolved: str, out: str) -> list[str]:
    """What the ranks run: the resolved program and its arguments; the bundled benchmark also writes its rows
    as JSON into the run's folder, unless the user named a file."""
    argv = [resolved, *program[1:]]
    if os.path.basename(resolved) == BENCH_PROGRAM and "--json" not in argv:
        argv += ["--json", os.path.join(out, BENCH_JSON)]
    return argv


#: How many times ``emu mpirun`` starts Open MPI when its daemons fail to start (no rank ran): Debian's 4.1
#: orted sometimes aborts in hwloc at start-up here (docs/fidelity.md), and a second start works.
START_ATTEMPTS = 3
#: What mpirun prints when a daemon died before any rank started.
DAEMON_START_FAILURES = ("ORTE was unable to reliably start one or more daemons",
                         "An ORTE daemon has unexpectedly failed after launch")


def daemon_start_failed(log_text: str, ranks_started: bool) -> bool:
    """Whether a failed mpirun never started the program: its daemons died first (safe to start again)."""
    return not ranks_started and any(marker in log_text for marker in DAEMON_START_FAILURES)


def hostfile_text(ips: Sequence[str]) -> str:
    """Open MPI's hostfile: one line per rank in rank order, one slot each (rank r on line r)."""
    return "".join(f"{ip} slots=1\n" for ip in ips)


#: Runs "$@" after naming the host: ``hostname "$0"`` in a UTS namespace of its own (see :func:`host_name`).
NAMED_EXEC = 'hostname "$0" && exec "$@"'


def host_name(ip: str) -> str:
    """The host name an emulated host's Open MPI processes see: its address with dashes (no dots, which Open MPI
    would cut at).

    Every emulated host is a network namespace of one machine and shares its
    host name; Open MPI tells nodes apart by it. With one name for all of
    them, about one start in ten failed here: an orted's route to another
    ("no-path", then a segmentation fault), TCP between "vm" and "vm", or the
    hwloc assertion of docs/fidelity.md. Each process Open MPI starts in a
    host runs in a UTS namespace of its own carrying this name
    (docs/fidelity.md, 2026-12-03 evening: 0 failures in 140 starts).
    """
    return ip.replace(".", "-")


def named(ip: str, argv: Sequence[str]) -> list[str]:
    """``argv`` in a UTS namespace of its own whose host name is :func:`host_name` of ``ip``."""
    return ["unshare", "--uts", "/bin/sh", "-c", NAMED_EXEC, host_name(ip), *argv]


@dataclass(frozen=True)
class RemoteLaunch:
    """How the launch agent reaches a host on another server of a cluster: from the head's own network
    namespace (``netns_pid``: a process in it; a host's namespace reaches only the fabric), over ``ssh`` (its
    argument list up to the destination's ``--``), under ``RLIMIT_DATA`` ``memory_limit_bytes`` there (a remote
    orted does not inherit mpirun's), with ``sudo`` for a user other than root."""

    netns_pid: int
    ssh: tuple[str, ...]
    memory_limit_bytes: int | None = None
    sudo: bool = False

    def command(self) -> str:
        """The script's line that runs ``$*`` in host ``$pid`` on that server (the words quoted for its shell)."""
        limit = f"{PRLIMIT} --data={self.memory_limit_bytes} " if self.memory_limit_bytes else ""
        sudo = "sudo -n -E " if self.sudo else ""
        return (f"exec nsenter --net=/proc/{self.netns_pid}/ns/net -- {shlex.join(self.ssh)} "
                f"\"{sudo}{limit}mnexec -a $pid unshare --uts /bin/sh -c 'hostname \\\"\\$0\\\" && exec /bin/sh -c "
                f"\\\"\\$1\\\"' $name '$quoted'\"")


#: Begins each file of a remote server's rank output, as :func:`fetch_output_command` prints them.
FETCH_MARK = "@@ef-file "


def fetch_output_command(ranks_dir: str) -> list[str]:
    """The command printing every rank output file under ``ranks_dir`` on a server, each after a line
    ``FETCH_MARK PATH`` (its path under ``ranks_dir``): what :func:`split_fetched` reads."""
    script = (f"cd {shlex.quote(ranks_dir)} && for f in */rank.*/stdout */rank.*/stderr; do "
              f"[ -f \"$f\" ] && printf '\\n{FETCH_MARK}%s\\n' \"$f\" && cat \"$f\"; done; true")
    return ["sh", "-c", script]


def split_fetched(text: str) -> dict[str, str]:
    """:func:`fetch_output_command`'s output as {path under the ranks folder: its text}; paths that would leave
    the folder are dropped."""
    files = {}
    for part in text.split("\n" + FETCH_MARK)[1:]:
        path, _, body = part.partition("\n")
        if path and not path.startswith("/") and ".." not in path.split("/"):
            files[path] = body
    return files


def require_rank0_on_head(hosts: Sequence[str], server_of: Mapping[str, str], head: str) -> None:
    """:class:`FieldError` unless rank 0's host (``hosts[0]``) runs on the cluster's ``head``: mpirun runs in
    it, and reaches the other servers from there."""
    server = server_of[hosts[0]]
    if server != head:
        raise FieldError(WHERE, "cluster", f"rank 0's host {hosts[0]} on the head {head} (mpirun runs in it): "
                         f"another rank placement, or a cluster file whose head is {server}", server)


def launch_agent_script(pids: Sequence[tuple[str, int]], log_path: str,
                        remote: Mapping[str, RemoteLaunch] | None = None) -> str:
    """The ``plm_rsh_agent`` shell script: ``SCRIPT HOST COMMAND...`` runs COMMAND in HOST's namespace.

    Open MPI calls it like ``ssh``: the host (an IP of the hostfile) first,
    then the command as words a remote shell would join and run. An unknown
    host fails with status 255, as ssh does. A host in ``remote`` (IP ->
    :class:`RemoteLaunch`) runs on another server of a cluster, reached over
    ssh.
    """
    remote = remote or {}
    cases = "".join(f"  {ip}) pid={pid} ;;\n" if ip not in remote else f"  {ip}) pid={pid} where={ip} ;;\n"
                    for ip, pid in pids)
    remote_cases = "".join(f"  {ip}) {launch.command()} ;;\n" for ip, launch in remote.items())
    tail = ("exec mnexec -a \"$pid\" unshare --uts /bin/sh -c 'hostname \"$0\" && exec /bin/sh -c \"$1\"' "
            "\"$name\" \"$*\"\n")
    if remote:
        # sed gets s/'/'\\''/g (a backslash in its replacement must be doubled): each quote becomes '\''
        tail = ("quoted=$(printf '%s' \"$*\" | sed \"s/'/'\\\\\\\\''/g\")\n"
                "case \"$where\" in\n" + remote_cases + "esac\n" + tail)
    return ("#!/bin/sh\n"
            "# written by emu mpirun: Open MPI's launch agent into the emulated hosts (see emulator/runs/mpi_plan.py)\n"
            f"echo \"$(date +%s.%N) $*\" >> {shlex.quote(log_path)}\n"
            "host=\"$1\"; shift\nwhere=\nname=$(echo \"$host\" | tr . -)  # host_name(): its own, as Open MPI needs\n"
            "case \"$host\" in\n"
            f"{cases}"
            "  *) echo \"emu mpirun launch agent: $host is not a host of this network\" >&2; exit 255 ;;\n"
            "esac\n" + tail)


def mpirun_command(np: int, hostfile: str, mca: Sequence[tuple[str, str]], argv: Sequence[str], output_dir: str,
                   nice: int = DEFAULT_NICE, export: Sequence[str] = ("PATH", "PYTHONUNBUFFERED"),
                   memory_limit_bytes: int | None = None, environment: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The ``mpirun`` command line (it runs inside rank 0's host, at niceness ``nice`` and under ``RLIMIT_DATA``
    ``memory_limit_bytes`` with ``prlimit``: every process it starts, through the launch agent too, inherits
    both); each rank's output goes to ``output_dir`` (Open MPI's ``<dir>/1/rank.R/stdout``; the MCA
    parameter alone does not do it in 4.1). The orteds stay attached to their launch agents instead of
    daemonizing: they remain in mpirun's process tree, where a replay session's subreaper (the agent
    launcher's) would otherwise adopt them. ``environment`` is set in the ranks' environment only (not
    mpirun's nor the orteds')."""
    limit = [PRLIMIT, f"--data={memory_limit_bytes}", "--"] if memory_limit_bytes is not None else []
    cmd = [*limit, "nice", "-n", str(nice), MPIRUN, "--allow-run-as-root", "-np", str(np), "--hostfile", hostfile, "--bind-to", "none",
           "--leave-session-attached", "--output-filename", output_dir]
    for key, value in mca:
        cmd += ["--mca", key, value]
    for name in export:
        cmd += ["-x", name]
    for name, value in environment:
        cmd += ["-x", f"{name}={value}"]
    return cmd + list(argv)
