"""Topology models: BiGraph, k-ary fat-tree, leaf-spine, the rail fabrics and star, as pure data.

This package owns the network *model*: which hosts and switches exist, which
ports every link uses, each switch's datapath id, each host's IP and MAC, and
each link's rate. It imports neither Mininet nor os-ken and needs no root; the
Mininet network is built from a :class:`Topology` at the edge
(:mod:`emulator.emulation.network.emulated_network`), and the controller and the schedule checker read the
same model from its JSON export (networkx node-link format).

Modules (each imports only those listed before it, so there is no cycle)
    * :mod:`~emulator.model.topology.kinds` -- one registration per kind
      (:class:`TopologyKind` in :data:`KINDS`): its spec keys, counts,
      builder, bisection in closed form, its stages where it is a
      multi-stage Clos fabric, and whether it is the non-blocking ideal. Adding a kind is adding one
      registration there.
    * :mod:`~emulator.model.topology.spec` -- spec strings and mappings: the kinds
      and their keys, the limits on rates and sizes, parsing, the canonical
      form, and the HDRM placement's existence and slot order.
    * :mod:`~emulator.model.topology.bisection` -- bisection bandwidth from a
      spec's parameters: the kind's closed form, capped by servers.
    * :mod:`~emulator.model.topology.model` -- :class:`Host`, :class:`Switch`,
      :class:`Link` and :class:`Topology` with its lookups, servers, graph,
      hops and JSON export; the link model (MTU, TCP goodput).
    * :mod:`~emulator.model.topology.builders` -- hosts, switches and ports from
      parsed parameters (:func:`build`), and reading back JSON exports and
      spec strings alike (:func:`from_json`, :func:`load`).

    This package re-exports the public names of all five; callers import
    them from :mod:`emulator.model.topology`.

Spec strings
    ``KIND:key=value,...`` (or a mapping ``{"kind": KIND, key: value}`` from
    YAML). Kinds and their keys:

    * ``bigraph:upper=U,lower=L,hosts_per_switch=M``
    * ``fattree:k=K`` (K even)
    * ``leafspine:leaves=A,spines=B,hosts_per_leaf=C``
    * ``rail:rails=R,hosts_per_rail=H,spines=P`` -- a leaf-spine whose leaves
      are rails (slots reserved rail by rail)
    * ``dualplane:rails=R,hosts_per_rail=H,spines=P`` -- two such planes; every
      host slot is on a NIC switch (role ``nic``) with one half-rate port on
      its rail's leaf in each plane; routing never crosses a NIC switch that
      is not the path's end
    * ``railonly:rails=R,hosts_per_rail=H`` -- the rails without spines;
      servers required, one NIC per rail, and traffic to another server
      leaves by the NIC on the receiver's rail
      (:meth:`Topology.egress_nic`)
    * ``star:hosts=N``

    Every kind also takes ``bw`` (Mbit/s of every link, default 10),
    ``host_bw`` and ``switch_bw`` (host-to-switch and switch-to-switch rates,
    default ``bw``). Rates must lie in (0, 1000]: Mininet's HTB shaping ignores
    anything above 1000 Mbit/s.

Servers (every kind, all keys optional)
    ``servers=S,accels_per_server=A,nics_per_server=N[,pcie_bw=R][,nic_placement=P][,domain_bw=R]``.
    A topology has servers iff ``servers`` is given; ``accels_per_server`` and
    ``nics_per_server`` are then required (integers >= 1, ``N <= A``), and
    any server key without ``servers`` is an error. The fabric's own keys
    define its host *slots* (the hosts it would have without servers, in host
    order); the ``S·N`` NICs take ``S·N`` of them and the others stay empty.
    ``pcie_bw`` (default ``host_bw``) is the rate of the accelerator links
    inside a server; NIC links run at ``host_bw``. ``domain_bw`` gives every
    server an accelerator interconnect (NVLink/NVSwitch-like): each
    accelerator's port into it runs at ``domain_bw`` per direction, up to
    :data:`~emulator.model.topology.spec.MAX_DOMAIN_MBPS`; a fabric profile
    with ``domain_gbps`` sets it where the spec does not. Transfers between
    two accelerators of one server then cross the interconnect as timed
    transfers (:mod:`emulator.emulation.agents.interconnect`), not the PCIe switch; and
    ``pcie_bw`` defaults to the interconnect's rate (up to 1000), since an
    accelerator's packets to another's NIC (rail-only's forwarding across
    rails) cross the interconnect first.
    ``nic_placement``:

    * ``packed`` (the default but on fabrics with rails) -- NIC ``k`` of server ``s`` takes slot ``s·N + k``:
      a server's NICs fill consecutive slots, on one switch as far as possible.
    * ``spread`` -- NIC number ``g = s·N + k`` goes to host-bearing switch
      ``g mod W`` (``W`` of them), on that switch's lowest free slot: a
      server's NICs round-robin over the switches.
    * ``hdrm`` -- BiGraph only, and only where the HDRM placement exists
      (:func:`hdrm_problem`): NIC ``g`` takes the slot HDRM gives rank ``g``
      (:func:`hdrm_slot_order`). Ranks ``2i`` and ``2i+1`` always sit in
      opposite groups, so a server with an even ``N`` has half its NICs in
      the upper and half in the lower group: this is how a server's NICs
      attach to both groups.
    * ``rail`` (the default on fabrics with rails, the only one on
      ``railonly``) -- NIC ``k`` of server ``s`` takes slot ``s`` of rail ``k``;
      needs ``N`` = the rails and ``S`` <= ``hosts_per_rail``.

    Model: an accelerator is a host; accelerators are ``h1..h(S·A)``, server
    by server. Fabric switches keep exactly the names, roles and ports they
    have without servers; server ``s`` adds switch ``s(F+1+s)`` (``F`` fabric
    switches) with role ``pcie``, whose ports are its ``A`` accelerators
    (``host`` links at ``pcie_bw``) then its ``N`` NICs (``nic`` links to the
    fabric switch port of the NIC's slot). Accelerator ``j`` (0-based in its
    server) is pinned to NIC ``j·N // A`` (:meth:`Topology.pinned_nic`) and
    uses no other (but on ``railonly``, whose traffic to another server leaves
    by the NIC on the receiver's rail); a PCIe switch is never transit for
    other servers' traffic.
    ``N = 1`` is the traditional shared-NIC server, ``N = A`` the EFLOPS
    server with one NIC per accelerator.

Naming and numbering
    Hosts are ``h1``..``hN`` and switches ``s1``..``sS``, both 1-based.
    Host-bearing switches come first (BiGraph: upper then lower; fat-tree:
    edge switches pod by pod; leaf-spine: leaves), then the others (fat-tree
    aggregation then core; spines), then the PCIe switches of servers. Hosts
    are numbered switch by switch, so the hosts of ``s1`` are ``h1``..``hM``. A
    switch's ports are numbered from 1: first its hosts (in host order) or
    host slots, then its switch links in the order the builder adds them. A host has one interface, ``eth0``. Switch ``sI`` has
    datapath id ``I``. Host ``hI`` has IP ``10.a.b.c`` with ``I = a*65536 +
    b*256 + c`` (prefix /8) and MAC ``02:00:00:xx:xx:xx`` (locally
    administered) holding ``I``.
"""

# The error types, reachable here as they were from the single module (tests/unit/test_servers.py uses
# topology.UserError); they belong to emulator.base.errors.
from emulator.base.errors import FieldError as FieldError
from emulator.base.errors import UserError as UserError
from emulator.model.topology.builders import (
    build,
    from_json,
    host_ip,
    host_mac,
    load,
)
from emulator.model.topology.kinds import (
    KINDS,
    NIC_ROLE,
    ClosStages,
    FabricBuilder,
    TopologyKind,
    equal_radix,
    is_ideal,
)
from emulator.model.topology.model import (
    DEFAULT_MTU,
    JSON_FORMAT_VERSION,
    PCIE,
    Host,
    Link,
    Switch,
    Topology,
    all_host_pairs,
    last_segment_bytes,
    node_sort_key,
    switch_ports,
    tcp_goodput_factor,
    tcp_payload_bytes,
)
from emulator.model.topology.spec import (
    DEFAULT_LINK_MBPS,
    MAX_HOSTS,
    MAX_LINK_MBPS,
    MAX_SWITCHES,
    NIC_PLACEMENTS,
    at_link_rate,
    fabric_keys,
    format_spec,
    grown_spec,
    hdrm_problem,
    hdrm_slot_order,
    parse_spec,
    sets_link_rate,
    split_spec,
)

__all__ = [
    "DEFAULT_LINK_MBPS",
    "DEFAULT_MTU",
    "FabricBuilder",
    "Host",
    "JSON_FORMAT_VERSION",
    "KINDS",
    "NIC_ROLE",
    "Link",
    "MAX_HOSTS",
    "MAX_LINK_MBPS",
    "MAX_SWITCHES",
    "NIC_PLACEMENTS",
    "PCIE",
    "Switch",
    "Topology",
    "TopologyKind",
    "ClosStages",
    "all_host_pairs",
    "at_link_rate",
    "build",
    "fabric_keys",
    "equal_radix",
    "format_spec",
    "grown_spec",
    "from_json",
    "hdrm_problem",
    "hdrm_slot_order",
    "host_ip",
    "host_mac",
    "is_ideal",
    "last_segment_bytes",
    "load",
    "node_sort_key",
    "parse_spec",
    "sets_link_rate",
    "split_spec",
    "switch_ports",
    "tcp_goodput_factor",
    "tcp_payload_bytes",
]
