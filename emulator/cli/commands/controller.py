"""``emu controller`` (the OpenFlow controller in the foreground) and ``emu pingall`` (a sanity check).

``emu controller --topology SPEC --routing POLICY [--listen HOST:PORT]
[--ecmp-seed S] [--stats-interval SECONDS] [--stats-file FILE]`` runs the
os-ken app of :mod:`controllers` until interrupted, listening on
127.0.0.1:6653 unless told otherwise. Networks attach with ``emu up SPEC
--controller 127.0.0.1:6653``.

``emu pingall SPEC --routing POLICY [--ecmp-seed S] [--json]`` starts a
controller on a free loopback port, brings the network up attached to it,
pings every ordered host pair once, tears everything down, and exits 0 only
with 0% loss (1 otherwise). ``--json`` prints ``pairs``, ``lost``, ``loss``
(a fraction) and the lost pairs.

Bad input (topology, policy, address, seed, interval) is one line on stderr
and exit status 2, before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from controllers.core import DEFAULT_LISTEN, DEFAULT_STATS_INTERVAL, Settings, parse_listen
from emulator.base.errors import FieldError
from emulator.cli.arguments import int_at_least
from emulator.model import topology
from emulator.model.topology import Topology
from emulator.runs.admission import MAX_SEED


def register(subparsers: argparse._SubParsersAction) -> None:
    ctl = subparsers.add_parser("controller", help="run the OpenFlow controller in the foreground")
    ctl.add_argument("--topology", required=True, metavar="SPEC",
                     help="topology spec or exported topology JSON file")
    ctl.add_argument("--routing", required=True, metavar="POLICY", help="bigraph, dmodk, ecmp or shortest")
    ctl.add_argument("--listen", default=f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}", metavar="HOST:PORT",
                     help="OpenFlow address to listen on (default: %(default)s)")
    ctl.add_argument("--ecmp-seed", type=int_at_least(0, MAX_SEED), default=0, metavar="S", help="ECMP hash seed (default: 0)")
    ctl.add_argument("--lanes", type=int_at_least(1), default=1, metavar="N",
                     help="agent connections per host pair that ecmp routes by their 5-tuple (default: 1)")
    ctl.add_argument("--stats-interval", type=float, default=DEFAULT_STATS_INTERVAL, metavar="SECONDS",
                     help="port statistics polling interval (default: %(default)s)")
    ctl.add_argument("--stats-file", metavar="FILE",
                     help="append per-link byte, packet and drop counters here as JSON lines")
    ctl.add_argument("--state-file", metavar="FILE",
                     help="keep the controller's status here as JSON (for scripts that wait on it)")
    ctl.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
    ctl.set_defaults(func=cmd_controller)

    ping = subparsers.add_parser("pingall", help="bring up a network with the controller, ping every host pair")
    ping.add_argument("spec", metavar="SPEC", help="topology spec or exported topology JSON file")
    ping.add_argument("--routing", required=True, metavar="POLICY", help="bigraph, dmodk, ecmp or shortest")
    ping.add_argument("--ecmp-seed", type=int_at_least(0, MAX_SEED), default=0, metavar="S", help="ECMP hash seed (default: 0)")
    ping.add_argument("--json", action="store_true", help="print one JSON object")
    ping.set_defaults(func=cmd_pingall)


def settings_from_args(args: argparse.Namespace) -> Settings:
    settings = Settings(topology=args.topology, routing=args.routing, seed=args.ecmp_seed,
                        stats_file=args.stats_file, stats_interval=args.stats_interval,
                        state_file=args.state_file, listen=parse_listen(args.listen), lanes=args.lanes)
    settings.check()
    for name, path in (("stats-file", args.stats_file), ("state-file", args.state_file)):
        if path is not None:
            check_writable("controller", name, path)
    return settings


def check_writable(where: str, name: str, path: str) -> None:
    """:class:`FieldError` unless ``path`` is a file that can be written, checked without creating it."""
    parent = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path):
        problem = "a directory" if path else "empty"
    elif os.path.exists(path):
        problem = "" if os.access(path, os.W_OK) else "not writable"
    elif not os.path.isdir(parent):
        problem = "no such directory"
    else:
        problem = "" if os.access(parent, os.W_OK | os.X_OK) else "directory not writable"
    if problem:
        raise FieldError(where, name, "a file that can be written", f"{path} ({problem})")


def check_can_listen(host: str, port: int) -> None:
    """:class:`FieldError` unless a TCP server can listen on ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise FieldError("controller", "listen", "an address free to listen on",
                             f"{host}:{port} ({exc.strerror})") from None


def cmd_controller(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_can_listen(*settings.listen)
    from controllers.launcher import run_foreground

    run_foreground(settings, args.log_level)
    return 0


# ---------------------------------------------------------------------------
# pingall
# ---------------------------------------------------------------------------

@dataclass
class PingResult:
    pairs: int
    lost: list[tuple[str, str]] = field(default_factory=list)

    @property
    def loss(self) -> float:
        return len(self.lost) / self.pairs if self.pairs else 0.0

    def to_json(self) -> dict:
        return {"pairs": self.pairs, "lost": len(self.lost), "loss": self.loss,
                "lost_pairs": [list(p) for p in self.lost]}


def ping_script(topo: Topology, src: str, timeout_s: int = 2) -> str:
    """A shell script, run inside ``src``, that pings every other host once, all at once.

    It prints ``ok IP`` or ``lost IP`` per destination.
    """
    ips = " ".join(h.ip for h in topo.hosts if h.name != src)
    return (f"for ip in {ips}; do (ping -n -q -c1 -W{int(timeout_s)} $ip >/dev/null 2>&1 && echo ok $ip "
            f"|| echo lost $ip) & done; wait")


def parse_ping_output(topo: Topology, src: str, text: str) -> dict[str, bool]:
    """Destination host -> answered, from :func:`ping_script` output; missing lines count as lost."""
    by_ip = {h.ip: h.name for h in topo.hosts}
    out = {h.name: False for h in topo.hosts if h.name != src}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[1] in by_ip and by_ip[words[1]] in out:
            out[by_ip[words[1]]] = words[0] == "ok"
    return out


def ping_all(en, topo: Topology, sources: Iterable[str] | None = None, timeout_s: int = 2) -> PingResult:
    """Ping every ordered pair (from ``sources``, default all hosts) of a live :class:`EmulatedNetwork`."""
    names = list(sources) if sources is not None else [h.name for h in topo.hosts]
    procs = {src: en.host(src).popen(["sh", "-c", ping_script(topo, src, timeout_s)], text=True)
             for src in names}
    result = PingResult(pairs=0)
    for src, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        for dst, ok in sorted(parse_ping_output(topo, src, out).items(), key=lambda kv: topology.node_sort_key(kv[0])):
            result.pairs += 1
            if not ok:
                result.lost.append((src, dst))
    return result


def cmd_pingall(args: argparse.Namespace) -> int:
    topo = topology.load(args.spec)
    from emulator.emulation.machine.system import require_root
    from emulator.emulation.network.controller_process import ControllerProcess, free_port
    from emulator.emulation.network.emulated_network import EmulatedNetwork

    settings = Settings(topology=args.spec, routing=args.routing, seed=args.ecmp_seed,
                        listen=("127.0.0.1", free_port()))
    settings.check()
    require_root()
    t0 = time.monotonic()
    with ControllerProcess(settings) as ctl:
        with EmulatedNetwork(topo, controller=settings.listen, label="pingall") as en:
            ctl.wait_installed()
            result = ping_all(en, topo)
    summary = {"topology": topo.spec, "routing": args.routing, "seed": args.ecmp_seed,
               **result.to_json(), "seconds": round(time.monotonic() - t0, 1)}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"pingall {topo.spec} {args.routing}: {result.pairs} pairs, {len(result.lost)} lost "
              f"({100 * result.loss:.1f}% loss) in {summary['seconds']} s")
        for a, b in result.lost[:20]:
            print(f"  lost {a} -> {b}")
    return 0 if not result.lost and result.pairs else 1

