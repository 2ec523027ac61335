"""The one import shim between os-ken (maintained, Python >= 3.10) and Ryu 4.34.

os-ken is Ryu's fork with the same API under the module ``os_ken`` and the
base class ``OSKenApp``; everything the app uses is re-exported here under
neutral names, so the app imports nothing else from either framework.
"""

from __future__ import annotations

try:
    from os_ken.base.app_manager import OSKenApp as BaseApp
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.lib.packet import arp, ethernet, ipv4, packet, tcp
    from os_ken.ofproto import ether, ofproto_v1_3

    FRAMEWORK = "os-ken"
except ImportError:  # pragma: no cover - only where Ryu runs (Python < 3.10)
    from ryu.base.app_manager import RyuApp as BaseApp  # type: ignore[no-redef]
    from ryu.controller import ofp_event  # type: ignore[no-redef]
    from ryu.controller.handler import (  # type: ignore[no-redef]
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from ryu.lib import hub  # type: ignore[no-redef]
    from ryu.lib.packet import arp, ethernet, ipv4, packet, tcp  # type: ignore[no-redef]
    from ryu.ofproto import ether, ofproto_v1_3  # type: ignore[no-redef]

    FRAMEWORK = "ryu"

__all__ = ["BaseApp", "CONFIG_DISPATCHER", "DEAD_DISPATCHER", "FRAMEWORK", "MAIN_DISPATCHER", "arp", "ether",
           "ethernet", "hub", "ipv4", "ofp_event", "ofproto_v1_3", "packet", "set_ev_cls", "tcp"]
