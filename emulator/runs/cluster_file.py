"""The cluster file: the servers one emulation spreads over (Mininet Cluster Edition), parsed and checked.

Pure: :func:`from_dict` validates a parsed file and :func:`load` reads one;
every bad field is one :class:`~emulator.base.errors.FieldError` line naming
it. The edges (``emu cluster check``, the remote bring-up) take the
:class:`Cluster` this returns and nothing else. The format::

    name: lab                  # optional: the file's name without .yaml; letters, digits, - and _ (it names files)
    head: a                    # the server that runs the controller and collects the results
    underlay_mtu: 9100         # the underlay's MTU: a VXLAN tunnel needs the fabric's MTU + 50
    private_underlay: true     # the underlay is a network of these servers alone (see below)
    known_hosts: lab.known_hosts  # optional: the servers' host keys, as ssh records them on first contact
                               # (default: NAME.known_hosts beside the cluster file; relative to it); an
                               # OpenSSH known_hosts file, or none yet in an existing folder
    servers:
      - name: a                # letters, digits and -, starting with a letter, at most 15
        ssh: 192.0.2.10        # where its sshd listens: an IPv4 address or a host name
        port: 22               # optional, default 22
        user: root             # optional, default root
        key: /root/.ssh/ef_lab # the private key to log in with: an absolute path, never a default key
        underlay: 10.77.0.1    # its address on the underlay, where tunnels end (IPv4, unique)
      - name: b
        ...

``private_underlay`` states that the underlay carries nothing but these
servers' traffic: the OpenFlow channel (head's controller to every
server's switches) and the agents' control connections cross it in clear
(this version has no TLS on them), so runs are refused without it
(:meth:`Cluster.require_private_underlay`).

Every server needs a ``key`` of its own naming: the project never writes
to, or relies on, a user's default keys.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.documents import read_document
from emulator.base.errors import MISSING, FieldError, int_field, printable
from emulator.base.naming import USER_NAME_RE, USER_NAME_WORDS
from emulator.model import cluster_placement
from emulator.model.cluster_placement import Overrides, Placement
from emulator.model.topology import Topology

TOP_KEYS = ("name", "head", "underlay_mtu", "private_underlay", "known_hosts", "servers")
SERVER_KEYS = ("name", "ssh", "port", "user", "key", "underlay")
#: What a VXLAN tunnel adds to a frame (outer Ethernet 14, IPv4 20, UDP 8, VXLAN 8).
VXLAN_OVERHEAD = 50
#: Underlay MTUs accepted: a tunnel of the smallest emulated MTU (1280 + 50) up to jumbo frames.
MIN_UNDERLAY_MTU = 1330
MAX_UNDERLAY_MTU = 9216
#: A server's name becomes part of interface and bridge names, which Linux limits to 15 characters.
SERVER_NAME = re.compile(r"[a-z][a-z0-9-]{0,14}")
HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
#: known_hosts: an optional marker, host patterns (``!``, ``*``, ``?``, ``[host]:port``) or hashed names
#: (``|1|salt|hash``), key types such as ssh-ed25519, ecdsa-sha2-nistp256 or sk-ssh-ed25519@openssh.com.
KNOWN_HOSTS_MARKERS = ("@cert-authority", "@revoked")
KNOWN_HOSTS_HOST = re.compile(r"\|1\|[A-Za-z0-9+/=]+\|[A-Za-z0-9+/=]+|!?[A-Za-z0-9.:*?_%\[\]-]+")
KEY_TYPE = re.compile(r"[a-z][a-z0-9-]*(@[a-z0-9.-]+)?")
#: A known_hosts larger than this is not one ssh wrote for a cluster.
MAX_KNOWN_HOSTS_BYTES = 16 << 20
#: Linux's key file names that ssh tries by itself: a cluster file must name a key of its own.
DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_dsa")


@dataclass(frozen=True)
class Server:
    """One machine of the cluster: how to reach it over ssh, and its address on the underlay."""

    name: str
    ssh: str
    user: str
    key: str
    underlay: str
    port: int = 22

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ssh": self.ssh, "port": self.port, "user": self.user, "key": self.key,
                "underlay": self.underlay}


@dataclass(frozen=True)
class Cluster:
    """The servers, which of them is the head, and the underlay's MTU."""

    name: str
    head: str
    underlay_mtu: int
    servers: tuple[Server, ...]
    #: ssh's record of the servers' host keys (never the user's own ``~/.ssh/known_hosts``); "" until loaded
    known_hosts: str = ""
    #: the file states that the underlay carries these servers' traffic alone (the control channels are clear)
    private_underlay: bool = False

    def server(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.servers]

    def check_mtu(self, fabric_mtu: int, where: str = "cluster") -> None:
        """:class:`FieldError` unless a tunnel across the underlay carries frames of ``fabric_mtu`` whole."""
        need = fabric_mtu + VXLAN_OVERHEAD
        if self.underlay_mtu < need:
            raise FieldError(where, "underlay_mtu", f"at least {need} (the fabric's MTU {fabric_mtu} + "
                             f"{VXLAN_OVERHEAD} for VXLAN), or a fabric with a smaller mtu", self.underlay_mtu)

    def require_private_underlay(self, where: str = "cluster") -> None:
        """:class:`FieldError` unless the file states a private underlay: runs send the OpenFlow channel and the
        agents' control connections across it in clear."""
        if not self.private_underlay:
            raise FieldError(where, "private_underlay", "true: a run sends the OpenFlow channel and the agents' "
                             "control connections across the underlay unencrypted (no TLS in this version), so "
                             "it must be a network of these servers alone", self.private_underlay)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "head": self.head, "underlay_mtu": self.underlay_mtu,
                "private_underlay": self.private_underlay,
                "known_hosts": self.known_hosts, "servers": [s.to_json() for s in self.servers]}

    @property
    def others(self) -> list[Server]:
        """Every server but the head."""
        return [s for s in self.servers if s.name != self.head]


def load(path: str) -> Cluster:
    """Read and validate a cluster file and the ``known_hosts`` it names; :class:`UserError` (one line) for
    anything wrong."""
    data = read_document(path, f"cluster file {printable(path)}", "yaml")
    cluster = from_dict(data, where=printable(path), default_name=os.path.splitext(os.path.basename(path))[0],
                        folder=os.path.dirname(os.path.abspath(path)))
    check_known_hosts(cluster.known_hosts, printable(path))
    return cluster


def from_dict(data: object, where: str = "cluster", default_name: str = "cluster", folder: str = "") -> Cluster:
    """Validate a parsed cluster file (the module docstring's format), fields in file order; a relative
    ``known_hosts`` is taken in ``folder`` (the cluster file's)."""
    if not isinstance(data, Mapping):
        raise FieldError(where, "cluster", "a mapping with head, underlay_mtu and servers", data)
    _no_unknown(where, "", data, TOP_KEYS)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not USER_NAME_RE.fullmatch(name):
        unset = "" if "name" in data else " (the file's name, as it sets none)"
        raise FieldError(where, "name", f"{USER_NAME_WORDS}: it names files{unset}", name)
    head = data.get("head", MISSING)
    mtu = int_field(where, "underlay_mtu", data.get("underlay_mtu", MISSING), MIN_UNDERLAY_MTU, MAX_UNDERLAY_MTU)
    known_hosts = data.get("known_hosts", f"{name}.known_hosts")
    if not isinstance(known_hosts, str) or not known_hosts.strip() or "\0" in known_hosts:
        raise FieldError(where, "known_hosts", "a file name (where ssh records the servers' host keys)",
                         known_hosts)
    private = data.get("private_underlay", False)
    if not isinstance(private, bool):
        raise FieldError(where, "private_underlay", "true or false", private)
    raw = data.get("servers", MISSING)
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise FieldError(where, "servers", "a non-empty list of servers", raw)
    servers = tuple(_server(where, i, entry) for i, entry in enumerate(raw))
    _unique(where, servers)
    names = [s.name for s in servers]
    if head not in names:
        raise FieldError(where, "head", f"the name of one of the servers ({', '.join(names)})", head)
    return Cluster(name, str(head), mtu, servers, os.path.join(folder, known_hosts) if folder else known_hosts,
                   private)


def check_known_hosts(path: str, where: str) -> None:
    """:class:`FieldError` unless ``path`` is where ssh may keep the servers' host keys: an OpenSSH known_hosts
    file, or no file yet in an existing folder (ssh writes it). ssh appends to it, so a file of anything else
    (a typo naming another file) is refused naming its first wrong line."""
    expected = ("an OpenSSH known_hosts file (lines of: [@cert-authority|@revoked] hosts key-type base64-key "
                "[comment]) or a new file in an existing folder")
    if not os.path.lexists(path):
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise FieldError(where, "known_hosts", expected, f"{path} (no such folder)")
        return
    if not os.path.isfile(path):
        raise FieldError(where, "known_hosts", expected, f"{path} (not a regular file)")
    if os.path.getsize(path) > MAX_KNOWN_HOSTS_BYTES:
        raise FieldError(where, "known_hosts", expected, f"{path} (over {MAX_KNOWN_HOSTS_BYTES >> 20} MiB)")
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    for number, line in enumerate(lines, 1):
        if not known_hosts_line(line):
            raise FieldError(where, "known_hosts", expected, f"{path}, whose line {number} is not one")


def known_hosts_line(line: bytes) -> bool:
    """Whether ``line`` may stand in a known_hosts file (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"): blank, a
    comment, or [marker] host patterns (or ``|1|salt|hash``), a key type, and the base64 key of that type."""
    try:
        text = line.decode("ascii").strip()
    except UnicodeDecodeError:
        return False
    if not text or text.startswith("#"):
        return True
    words = text.split()
    if words[0] in KNOWN_HOSTS_MARKERS:
        words = words[1:]
    if len(words) < 3 or not all(KNOWN_HOSTS_HOST.fullmatch(h) for h in words[0].split(",")):
        return False
    return KEY_TYPE.fullmatch(words[1]) is not None and _key_of_type(words[2], words[1])


def _key_of_type(text: str, key_type: str) -> bool:
    """Whether ``text`` is base64 of an ssh public key blob, which opens with its key type (RFC 4253, 6.6)."""
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    size = int.from_bytes(blob[:4], "big")
    return len(blob) > 4 + size and blob[4:4 + size] == key_type.encode()


def _server(where: str, i: int, entry: object) -> Server:
    prefix = f"servers[{i}]."
    if not isinstance(entry, Mapping):
        raise FieldError(where, f"servers[{i}]", "a mapping of name, ssh, key and underlay", entry)
    _no_unknown(where, prefix, entry, SERVER_KEYS)
    name = entry.get("name", MISSING)
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise FieldError(where, f"{prefix}name", "a name of letters, digits and -, starting with a letter, "
                         "at most 15 characters", name)
    ssh = entry.get("ssh", MISSING)
    if not isinstance(ssh, str) or not (_is_ipv4(ssh) or HOST_NAME.fullmatch(ssh)):
        raise FieldError(where, f"{prefix}ssh", "the address its sshd listens on (IPv4 or a host name)", ssh)
    port = int_field(where, f"{prefix}port", entry.get("port", 22), 1, 65535)
    user = entry.get("user", "root")
    if not isinstance(user, str) or not USER_NAME.fullmatch(user):
        raise FieldError(where, f"{prefix}user", "a user name", user)
    key = entry.get("key", MISSING)
    if not isinstance(key, str) or not os.path.isabs(key) or os.path.basename(key) in DEFAULT_KEYS:
        raise FieldError(where, f"{prefix}key", "the absolute path of a private key of its own (not one of ssh's "
                         "default key files)", key)
    underlay = entry.get("underlay", MISSING)
    if not isinstance(underlay, str) or not _is_ipv4(underlay) or ipaddress.IPv4Address(underlay).is_loopback:
        raise FieldError(where, f"{prefix}underlay", "its IPv4 address on the underlay (not loopback)", underlay)
    return Server(name, ssh, user, key, underlay, port)


def _unique(where: str, servers: Sequence[Server]) -> None:
    for attr, what in (("name", "a name"), ("underlay", "an underlay address")):
        seen: set[str] = set()
        for i, s in enumerate(servers):
            value = getattr(s, attr)
            if value in seen:
                raise FieldError(where, f"servers[{i}].{attr}", f"{what} no other server has", value)
            seen.add(value)
    endpoints: set[tuple[str, int]] = set()
    for i, s in enumerate(servers):
        if (s.ssh, s.port) in endpoints:
            raise FieldError(where, f"servers[{i}].ssh", "an ssh address and port no other server has",
                             f"{s.ssh}:{s.port}")
        endpoints.add((s.ssh, s.port))


def _no_unknown(where: str, prefix: str, data: Mapping[Any, Any], keys: Sequence[str]) -> None:
    for key in data:
        if key not in keys:
            raise FieldError(where, f"{prefix}{key}", f"one of {', '.join(keys)}", f"unknown key {key}")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ClusterRun:
    """A run spread over ``cluster``: where each topology's nodes go (:func:`emulator.model.cluster_placement.place`,
    with a placement file's choices on top when one was given: ``overrides``, as parsed)."""

    cluster: Cluster
    overrides: Overrides | None = None
    where: str = "placement file"

    def placement(self, topo: Topology) -> Placement:
        placed = cluster_placement.place(topo, self.cluster.names)
        if self.overrides is not None:
            placed = cluster_placement.overridden(placed, topo, self.overrides, where=self.where)
        return placed
