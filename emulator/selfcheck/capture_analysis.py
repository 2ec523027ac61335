"""``emu analyze DIR``: packet captures -> per-flow throughput over time.

Reads every ``DIR/pcap/*.pcap`` (written by ``emu replay --pcap``; one file
per link, named ``A-B.pcap``) with scapy's streaming :class:`PcapReader`. A
*flow* is one direction of a TCP connection that carries data: the 5-tuple
``(src ip, src port, dst ip, dst port, tcp)`` of its data segments (pure ACKs
carry no payload and are left out). Payload bytes are taken from the IP
header's total length, so captures truncated to a short snap length (replay
keeps 96 bytes) still count every byte.

For each (link, flow): bytes and packets, first and last data packet, payload
bytes per bin (:data:`DEFAULT_BIN_S`, 100 ms; bins are aligned on the earliest
packet of all captures so flows of different links line up), mean Mbit/s over
its active time (first to last data packet) and peak Mbit/s over one bin.
IPs are mapped to host names with ``DIR/topology.json`` when present.

Output: ``DIR/flows.json`` (written atomically) and a printed summary.
:func:`analyze_packets` is the pure core, fed ``(time, ip_src, ip_dst,
sport, dport, payload_bytes)`` tuples.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.base.errors import UserError
from emulator.base.files import write_json_atomic

DEFAULT_BIN_S = 0.1

PacketTuple = tuple[float, str, str, int, int, int]


@dataclass
class FlowStats:
    link: str
    src: str
    sport: int
    dst: str
    dport: int
    bytes: int = 0
    packets: int = 0
    first: float = math.inf
    last: float = -math.inf
    bins: dict[int, int] = field(default_factory=dict)

    def add(self, t: float, payload: int, t0: float, bin_s: float) -> None:
        self.bytes += payload
        self.packets += 1
        self.first = min(self.first, t)
        self.last = max(self.last, t)
        # pcap times are whole micro- or nanoseconds: bin on integer nanoseconds, not float seconds.
        b = round((t - t0) * 1e9) // round(bin_s * 1e9)
        self.bins[b] = self.bins.get(b, 0) + payload

    def to_json(self, t0: float, bin_s: float, names: dict[str, str]) -> dict[str, Any]:
        active = max(self.last - self.first, 0.0)
        lo, hi = min(self.bins), max(self.bins)
        series = [self.bins.get(b, 0) for b in range(lo, hi + 1)]
        return {
            "link": self.link,
            "src": self.src, "sport": self.sport, "src_host": names.get(self.src),
            "dst": self.dst, "dport": self.dport, "dst_host": names.get(self.dst),
            "bytes": self.bytes, "packets": self.packets,
            "first_s": self.first - t0, "last_s": self.last - t0, "active_s": active,
            # Over a single packet there is no interval: fall back to one bin.
            "mean_mbps": self.bytes * 8 / (active if active > 0 else bin_s) / 1e6,
            "peak_mbps": max(series) * 8 / bin_s / 1e6,
            "bin_start": lo,
            "bytes_per_bin": series,
        }


def analyze_packets(packets_by_link: Mapping[str, Iterable[PacketTuple]], bin_s: float = DEFAULT_BIN_S,
                    names: dict[str, str] | None = None, t0: float | None = None) -> dict[str, Any]:
    """Per (link, flow) statistics from ``(time, src, dst, sport, dport, payload)`` tuples.

    ``t0`` is the time origin of the bins (default: the earliest packet; the
    iterables are then read twice, so pass lists). Returns the ``flows.json`` dict.
    """
    if not bin_s > 0:
        raise UserError(f"analyze: field 'bin': expected seconds > 0, got {bin_s!r}")
    names = names or {}
    if t0 is None:
        firsts = [min((p[0] for p in pkts), default=math.inf) for pkts in packets_by_link.values()]
        t0 = min(firsts, default=0.0)
        if t0 == math.inf:
            t0 = 0.0
    flows: dict[tuple[str, str, int, str, int], FlowStats] = {}
    counts = {}
    for link, pkts in packets_by_link.items():
        n = 0
        for t, src, dst, sport, dport, payload in pkts:
            n += 1
            if payload <= 0:
                continue
            key = (link, src, sport, dst, dport)
            fs = flows.get(key)
            if fs is None:
                fs = flows[key] = FlowStats(link, src, sport, dst, dport)
            fs.add(t, payload, t0, bin_s)
        counts[link] = n
    records = [fs.to_json(t0, bin_s, names) for fs in flows.values()]
    records.sort(key=lambda r: (r["link"], r["first_s"], r["src"], r["sport"]))
    return {"bin_s": bin_s, "t0": t0, "packets_per_link": counts, "flows": records}


def read_pcap(path: str) -> Iterator[PacketTuple]:
    """Stream the IPv4/TCP packets of a pcap file as :data:`PacketTuple` (payload from the IP header)."""
    # scapy is imported here, not at the top: it is slow to import and only reading a pcap needs it.
    from scapy.layers.inet import IP, TCP
    from scapy.utils import PcapReader

    try:
        reader = PcapReader(path)
    except Exception as exc:  # scapy raises Scapy_Exception or OSError for unreadable files
        raise UserError(f"analyze: cannot read {path}: {exc}") from None
    with reader:
        pkt: Any  # scapy's stubs type packets loosely
        for pkt in reader:
            if IP not in pkt or TCP not in pkt:
                continue
            ip, tcp = pkt[IP], pkt[TCP]
            payload = int(ip.len) - int(ip.ihl) * 4 - int(tcp.dataofs) * 4
            yield float(pkt.time), ip.src, ip.dst, int(tcp.sport), int(tcp.dport), payload


def host_names(directory: str) -> dict[str, str]:
    """IP -> host name from ``directory/topology.json`` (networkx node-link), or {} without it."""
    path = os.path.join(directory, "topology.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"analyze: {path}: expected a topology JSON file, got unreadable data ({exc})") from None
    return {n["ip"]: str(n["id"]) for n in data.get("nodes", []) if n.get("type") == "host" and "ip" in n}


def analyze_dir(directory: str, bin_s: float = DEFAULT_BIN_S, write: bool = True) -> dict[str, Any]:
    """Analyze ``directory/pcap/*.pcap``; write ``directory/flows.json``; return its content."""
    files = sorted(glob.glob(os.path.join(directory, "pcap", "*.pcap")))
    if not files:
        raise UserError(f"analyze: field 'DIR': expected a directory with pcap/*.pcap (from `emu replay --pcap`), "
                        f"got {directory!r}")
    by_link = {os.path.basename(f)[:-len(".pcap")]: list(read_pcap(f)) for f in files}
    result = analyze_packets(by_link, bin_s, host_names(directory))
    result["files"] = files
    if write:
        write_json_atomic(os.path.join(directory, "flows.json"), result)
    return result


def summary(result: dict[str, Any]) -> str:
    """One line per flow: link, hosts and ports, bytes, mean and peak Mbit/s, active time."""
    lines = [f"{'link':<10} {'flow':<36} {'bytes':>12} {'mean Mb/s':>10} {'peak Mb/s':>10} {'active s':>9}"]
    for r in result["flows"]:
        src = r["src_host"] or r["src"]
        dst = r["dst_host"] or r["dst"]
        flow = f"{src}:{r['sport']} -> {dst}:{r['dport']}"
        lines.append(f"{r['link']:<10} {flow:<36} {r['bytes']:>12} {r['mean_mbps']:>10.2f} {r['peak_mbps']:>10.2f} "
                     f"{r['active_s']:>9.2f}")
    if not result["flows"]:
        lines.append("(no TCP data in the captures)")
    lines.append(f"# {len(result['flows'])} flows, {result['bin_s'] * 1000:g} ms bins")
    return "\n".join(lines)
