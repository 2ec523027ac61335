"""Routing: which path every flow takes, and the flow entries that make it so.

Pure logic, no os-ken import. Modules (each imports only those before it):

* :mod:`~emulator.model.routing.flows` -- flows, and the agents' connections, whose 5-tuples are known in advance;
* :mod:`~emulator.model.routing.policies` -- one registration per routing policy (:data:`POLICIES`): its name,
  title, the topology kinds it is made for, what it hashes and how it chooses; the one place to add a policy;
* :mod:`~emulator.model.routing.paths` -- the path of every flow under a policy and failed links (:func:`route`);
* :mod:`~emulator.model.routing.flow_table` -- the OpenFlow entries that make every packet take that path
  (:func:`flow_table`, :func:`learned_entries`), which the controller and the static installer install.

This package re-exports their public names; callers import them from
:mod:`emulator.model.routing`.
"""

from emulator.model.routing.flow_table import (
    CONTROLLER_PORT,
    ETH_TYPE_ARP,
    ETH_TYPE_IP,
    LEARNED_COOKIE,
    LEARNED_IDLE_TIMEOUT,
    PRIORITY_ARP,
    PRIORITY_DEST,
    PRIORITY_FLOW,
    PRIORITY_PAIR,
    PRIORITY_TCP_MISS,
    PRIORITY_UPLINK,
    FlowEntry,
    Learner,
    flow_table,
    learned_entries,
)
from emulator.model.routing.flows import (
    AGENT_LISTEN_PORT,
    AGENT_SOURCE_PORT_BASE,
    IPPROTO_ICMP,
    IPPROTO_TCP,
    MAX_AGENT_SOURCE_PORT,
    Flow,
    agent_flow,
    agent_lane,
    all_agent_flows,
    exact_flows,
    max_lanes,
)
from emulator.model.routing.paths import (
    NoPath,
    Router,
    cut_pairs,
    directed_links,
    hop_port,
    link_sharing,
    path_links,
    route,
    routes,
    server_sender,
    switch_links_of,
)
from emulator.model.routing.policies import (
    POLICIES,
    RoutingPolicy,
    check_policy,
    ecmp_hash,
    hashes_five_tuples,
    label,
    own_routing,
    policy,
    policy_kinds,
    register,
    seed_words,
    seeds_of,
    title,
    unregister,
)

__all__ = [
    "AGENT_LISTEN_PORT", "AGENT_SOURCE_PORT_BASE", "CONTROLLER_PORT", "ETH_TYPE_ARP", "ETH_TYPE_IP", "IPPROTO_ICMP",
    "IPPROTO_TCP", "LEARNED_COOKIE", "LEARNED_IDLE_TIMEOUT", "MAX_AGENT_SOURCE_PORT", "POLICIES", "PRIORITY_ARP",
    "PRIORITY_DEST", "PRIORITY_FLOW", "PRIORITY_PAIR", "PRIORITY_TCP_MISS", "PRIORITY_UPLINK", "Flow", "FlowEntry",
    "Learner", "NoPath", "Router", "RoutingPolicy", "agent_flow", "agent_lane", "all_agent_flows", "check_policy",
    "cut_pairs", "directed_links", "ecmp_hash", "exact_flows", "hashes_five_tuples", "own_routing", "flow_table",
    "hop_port", "label", "learned_entries", "link_sharing", "max_lanes", "path_links", "policy", "policy_kinds",
    "register", "route", "routes", "seed_words", "seeds_of", "server_sender", "switch_links_of", "title", "unregister"
]
