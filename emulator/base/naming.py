"""The names this project gives to what it creates outside Python.

Every Open vSwitch bridge, root-namespace interface, pid file and temporary
file carries :data:`NAME_PREFIX`, so that ``emu clean`` finds exactly what is
ours and nothing else. This module owns that prefix, how model names (``s3``,
``h12``) become bridge and interface names, and the patterns that recognise
them again, and what a name a user gives must look like where it becomes
part of a path (:data:`USER_NAME_RE`). It imports nothing of the project.
"""

from __future__ import annotations

import re

NAME_PREFIX = "ef"

#: Every host's address is in this subnet (:func:`emulator.model.topology.host_ip`), one connected route.
HOST_SUBNET = "10.0.0.0/8"

#: Our OVS bridges: one per model switch.
BRIDGE_RE = re.compile(rf"^{NAME_PREFIX}s\d+$")
#: Our link ends in the root namespace (switch ports) and in hosts.
INTERFACE_RE = re.compile(rf"^{NAME_PREFIX}[hs]\d+-eth\d+$")
#: A switch port (root namespace): what it sends, a switch forwarded.
SWITCH_INTERFACE_RE = re.compile(rf"^{NAME_PREFIX}s\d+-eth\d+$")
#: A host's one interface (how a host shell's namespace is recognised as ours).
HOST_INTERFACE_RE = re.compile(rf"^{NAME_PREFIX}h\d+-eth0$")
#: ``emu cluster check``'s MTU probe: a network namespace per server, a VXLAN device per tunnel end.
CHECK_NAMESPACE_PREFIX = f"{NAME_PREFIX}chk-"
CHECK_DEVICE_RE = re.compile(rf"^{NAME_PREFIX}vx[0-9a-f]+$")


#: A name a user gives that ends up in paths and file names (an experiment's, a cluster's): no separator, dot
#: or blank can turn it into another folder.
USER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
USER_NAME_WORDS = "a name of letters, digits, '-' and '_' (at most 64)"


def bridge_name(switch: str) -> str:
    """The OVS bridge (Mininet switch) name of model switch ``switch``."""
    return f"{NAME_PREFIX}{switch}"


def host_intf(host: str) -> str:
    """The interface of model host ``host`` (inside its namespace)."""
    return f"{NAME_PREFIX}{host}-eth0"


def switch_intf(switch: str, port: int) -> str:
    """Port ``port`` of model switch ``switch`` (in the root namespace)."""
    return f"{bridge_name(switch)}-eth{port}"


def switch_of_intf(intf: str) -> str:
    """The model switch whose port ``intf`` is (the inverse of :func:`switch_intf`)."""
    return intf[len(NAME_PREFIX):].rsplit("-eth", 1)[0]
