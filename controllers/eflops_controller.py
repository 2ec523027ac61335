"""The OpenFlow 1.3 controller app: a thin shim over :class:`controllers.core.ControllerCore`.

Proactive and loop-safe: when a switch connects (or reconnects) the app wipes
its table and installs every entry :func:`emulator.model.routing.flow_table` gives
it (``reactive=True``), for all host pairs, then confirms with a barrier. ARP
never floods: the entries forward ARP by target address, and an ARP request
that reaches the controller is answered from the topology model. Table misses
drop (OpenFlow 1.3 default), so no broadcast circulates in BiGraph or
fat-tree loops.

Reactive for TCP under ``ecmp`` only: at every ECMP choice point an entry
sends TCP packets of connections not yet learned here. The app asks the core
(:meth:`~controllers.core.ControllerCore.tcp_packet_in`), sends the learned
5-tuple entries of both directions to every switch concerned (downstream
ones first; idle timeout and cookie :data:`emulator.model.routing.LEARNED_COOKIE`)
and sends the packet on with a packet-out through the computed port, so
every TCP connection takes its :func:`emulator.model.routing.route`. A packet that
misses at a downstream switch before its flow-mod arrived is handled the
same way. ARP requests and these TCP packets are all that come here.

On a port-status change the core recomputes routes around the failed links
and the app sends only the difference, after deleting every learned entry
(by cookie; connections re-learn along the new paths); pairs left without a
path are logged.
Port statistics are polled every ``stats_interval`` seconds and appended as
JSON lines (one per link direction) to ``stats_file``. With ``ecmp`` the app
logs which agent flows share a link.

Run it with ``emu controller --topology SPEC --routing POLICY`` (os-ken), or
where Ryu still runs with ``EF_TOPOLOGY=SPEC EF_ROUTING=POLICY ryu-manager
--ofp-listen-host 127.0.0.1 controllers/eflops_controller.py`` (settings from
the environment, see :mod:`controllers.core`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

try:
    from controllers import compat
except ImportError:  # loaded by file path (ryu-manager controllers/eflops_controller.py)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from controllers import compat

from controllers.core import ControllerCore, Settings, Update, connections_log
from emulator.base.files import append_jsonl, write_json_atomic
from emulator.model.routing import CONTROLLER_PORT, ETH_TYPE_ARP, LEARNED_COOKIE, FlowEntry, hashes_five_tuples

LOG = logging.getLogger("eflops.controller")

#: Set by the ``emu controller`` launcher before the app is instantiated;
#: otherwise the settings come from the environment.
_SETTINGS: Settings | None = None

#: Above every routing entry: ARP requests go to the controller, which answers them.
PRIORITY_ARP_TO_CONTROLLER = 400


def configure(settings: Settings) -> None:
    global _SETTINGS
    _SETTINGS = settings


class EflopsController(compat.BaseApp):
    OFP_VERSIONS = [compat.ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = _SETTINGS or Settings.from_env()
        topo = self.settings.check()
        self.core = ControllerCore(topo, self.settings.routing, self.settings.seed, self.settings.lanes)
        self.topo = topo
        self.datapaths: dict[str, Any] = {}
        self.barriers: dict[str, int] = {}
        self.started = time.time()
        self._all_installed_logged = False
        LOG.info("%s controller (%s): %s, policy %s, seed %d, %d switches", compat.FRAMEWORK,
                 os.getpid(), topo.spec, self.settings.routing, self.settings.seed, len(topo.switches))
        if hashes_five_tuples(self.settings.routing):
            lines = self.core.sharing_report()
            LOG.info("%s seed %d: %d directed switch links carry more than one agent flow",
                     self.settings.routing, self.settings.seed, len(lines))
            for line in lines:
                LOG.info("%s seed %d: %s", self.settings.routing, self.settings.seed, line)
        self._write_state()
        if self.settings.stats_file:
            self.stats_thread = compat.hub.spawn(self._poll_stats)

    # ------------------------------------------------------------ helpers
    def _write_state(self) -> None:
        if self.settings.state_file:
            write_json_atomic(self.settings.state_file,
                              self.core.status(pid=os.getpid(), started=self.started, updated=time.time()))

    def _flow_mod(self, dp, entry: FlowEntry, command: int):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        match = parser.OFPMatch(**entry.match_dict())
        if command == ofp.OFPFC_DELETE_STRICT:
            return parser.OFPFlowMod(dp, command=command, priority=entry.priority, match=match,
                                     out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
        if entry.out_port == CONTROLLER_PORT:
            actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        else:
            actions = [parser.OFPActionOutput(entry.out_port)]
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        return parser.OFPFlowMod(dp, command=ofp.OFPFC_ADD, priority=entry.priority, match=match,
                                 instructions=inst, idle_timeout=entry.idle_timeout, cookie=entry.cookie)

    @staticmethod
    def _delete_learned(dp):
        """Delete every learned entry of ``dp`` (by their cookie)."""
        ofp, parser = dp.ofproto, dp.ofproto_parser
        return parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL, cookie=LEARNED_COOKIE,
                                 cookie_mask=0xFFFF_FFFF_FFFF_FFFF, out_port=ofp.OFPP_ANY,
                                 out_group=ofp.OFPG_ANY, match=parser.OFPMatch())

    def _barrier(self, switch: str, dp) -> None:
        msg = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(msg)
        self.barriers[switch] = msg.xid
        dp.send_msg(msg)

    # ------------------------------------------------------------- events
    @compat.set_ev_cls(compat.ofp_event.EventOFPSwitchFeatures, compat.CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        switch = self.core.switch_name(dp.id)
        if switch is None:
            LOG.warning("datapath %016x is not in %s: ignored", dp.id, self.topo.spec)
            return
        t0 = time.monotonic()
        self.datapaths[switch] = dp
        dp.send_msg(parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        entries = self.core.connect(switch)
        for entry in entries:
            dp.send_msg(self._flow_mod(dp, entry, ofp.OFPFC_ADD))
        to_ctl = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        dp.send_msg(parser.OFPFlowMod(dp, priority=PRIORITY_ARP_TO_CONTROLLER,
                                      match=parser.OFPMatch(eth_type=ETH_TYPE_ARP, arp_op=1),
                                      instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                                                 to_ctl)]))
        self._barrier(switch, dp)
        dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0))
        LOG.info("%s (dpid %d) connected: sent %d entries in %.0f ms", switch, dp.id, len(entries),
                 (time.monotonic() - t0) * 1000)
        self._write_state()

    @compat.set_ev_cls(compat.ofp_event.EventOFPBarrierReply, compat.MAIN_DISPATCHER)
    def barrier_reply(self, ev):
        switch = self.core.switch_name(ev.msg.datapath.id)
        if switch is not None and self.barriers.get(switch) == ev.msg.xid:
            before = len(self.core.confirmed)
            self.core.confirm(switch)
            if before < len(self.core.confirmed) == len(self.topo.switches):
                LOG.log(logging.DEBUG if self._all_installed_logged else logging.INFO,
                        "all %d switches have their entries", len(self.topo.switches))
                self._all_installed_logged = True
            self._write_state()

    @compat.set_ev_cls(compat.ofp_event.EventOFPStateChange, compat.DEAD_DISPATCHER)
    def state_change(self, ev):
        dp = ev.datapath
        switch = self.core.switch_name(dp.id) if dp.id is not None else None
        if switch is not None and self.datapaths.get(switch) is dp:
            del self.datapaths[switch]
            self.core.disconnect(switch)
            LOG.info("%s disconnected", switch)
            self._write_state()

    @compat.set_ev_cls(compat.ofp_event.EventOFPPortDescStatsReply, compat.MAIN_DISPATCHER)
    def port_desc(self, ev):
        dp = ev.msg.datapath
        switch = self.core.switch_name(dp.id)
        if switch is None:
            return
        states = {p.port_no: self._port_up(dp, p) for p in ev.msg.body if p.port_no < dp.ofproto.OFPP_MAX}
        self._apply(self.core.port_states(switch, states), f"{switch} port states")

    @compat.set_ev_cls(compat.ofp_event.EventOFPPortStatus, compat.MAIN_DISPATCHER)
    def port_status(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp = dp.ofproto
        switch = self.core.switch_name(dp.id)
        if switch is None or msg.desc.port_no >= ofp.OFPP_MAX:
            return
        up = msg.reason != ofp.OFPPR_DELETE and self._port_up(dp, msg.desc)
        t0 = time.monotonic()
        self._apply(self.core.port_state(switch, msg.desc.port_no, up),
                    f"{switch} port {msg.desc.port_no} {'up' if up else 'down'}", t0)

    @staticmethod
    def _port_up(dp, desc) -> bool:
        ofp = dp.ofproto
        return not (desc.state & ofp.OFPPS_LINK_DOWN) and not (desc.config & ofp.OFPPC_PORT_DOWN)

    def _apply(self, update: Update | None, why: str, t0: float | None = None) -> None:
        if update is None:
            return
        t0 = time.monotonic() if t0 is None else t0
        for switch in set(update.adds) | set(update.deletes) | set(update.clear_learned):
            dp = self.datapaths.get(switch)
            if dp is None:
                continue
            if switch in update.clear_learned:
                dp.send_msg(self._delete_learned(dp))
            for entry in update.adds.get(switch, []):
                dp.send_msg(self._flow_mod(dp, entry, dp.ofproto.OFPFC_ADD))
            for entry in update.deletes.get(switch, []):
                dp.send_msg(self._flow_mod(dp, entry, dp.ofproto.OFPFC_DELETE_STRICT))
            self.core.unconfirm(switch)
            self._barrier(switch, dp)
        failed = " ".join(f"{a}-{b}" for a, b in update.failed_links) or "none"
        LOG.info("%s: rerouted in %.0f ms (%d entries changed); failed links: %s", why,
                 (time.monotonic() - t0) * 1000, update.size(), failed)
        if update.newly_cut:
            LOG.warning("no path left for %d host pairs: %s", len(update.newly_cut),
                        " ".join(f"{a}->{b}" for a, b in update.newly_cut))
        if update.restored:
            LOG.info("paths restored for %d host pairs", len(update.restored))
        self._write_state()

    @compat.set_ev_cls(compat.ofp_event.EventOFPPacketIn, compat.MAIN_DISPATCHER)
    def packet_in(self, ev):
        """An ARP request (answered from the topology model) or a TCP packet of a connection to learn."""
        msg = ev.msg
        pkt = compat.packet.Packet(msg.data)
        req = pkt.get_protocol(compat.arp.arp)
        if req is not None:
            self._answer_arp(msg, req)
            return
        ip = pkt.get_protocol(compat.ipv4.ipv4)
        seg = pkt.get_protocol(compat.tcp.tcp)
        if ip is not None and seg is not None:
            self._learn_tcp(msg, ip, seg)

    def _answer_arp(self, msg, req) -> None:
        dp = msg.datapath
        if req.opcode != compat.arp.ARP_REQUEST:
            return
        target = next((h for h in self.topo.hosts if h.ip == req.dst_ip), None)
        if target is None:
            return
        reply = compat.packet.Packet()
        reply.add_protocol(compat.ethernet.ethernet(ethertype=compat.ether.ETH_TYPE_ARP, dst=req.src_mac,
                                                    src=target.mac))
        reply.add_protocol(compat.arp.arp(opcode=compat.arp.ARP_REPLY, src_mac=target.mac, src_ip=target.ip,
                                          dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(in_port)], data=reply.data))

    def _learn_tcp(self, msg, ip, seg) -> None:
        """Install the connection's learned entries (downstream first), then send the packet on."""
        dp = msg.datapath
        switch = self.core.switch_name(dp.id)
        if switch is None:
            return
        learned = self.core.tcp_packet_in(switch, ip.src, ip.dst, seg.src_port, seg.dst_port)
        if learned is None:
            LOG.debug("%s: TCP %s:%d -> %s:%d dropped (no path)", switch, ip.src, seg.src_port, ip.dst,
                      seg.dst_port)
            return
        for sw, entries in learned.entries.items():
            target = self.datapaths.get(sw)
            if target is None:
                continue
            for entry in entries:
                target.send_msg(self._flow_mod(target, entry, target.ofproto.OFPFC_ADD))
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=msg.match["in_port"],
                                        actions=[parser.OFPActionOutput(learned.out_port)], data=msg.data))
        if learned.new:
            if self.settings.state_file and learned.connection is not None:
                append_jsonl(connections_log(self.settings.state_file), list(learned.connection))
            LOG.debug("%s: learned TCP %s:%d -> %s:%d (%d entries on %d switches)", switch, ip.src, seg.src_port,
                      ip.dst, seg.dst_port, sum(map(len, learned.entries.values())), len(learned.entries))
            self._write_state()

    # -------------------------------------------------------------- stats
    def _poll_stats(self) -> None:
        while True:
            for dp in list(self.datapaths.values()):
                ofp, parser = dp.ofproto, dp.ofproto_parser
                dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
            compat.hub.sleep(self.settings.stats_interval)

    @compat.set_ev_cls(compat.ofp_event.EventOFPPortStatsReply, compat.MAIN_DISPATCHER)
    def port_stats(self, ev):
        switch = self.core.switch_name(ev.msg.datapath.id)
        if switch is None or not self.settings.stats_file:
            return
        counters = [{"port_no": s.port_no, "rx_packets": s.rx_packets, "tx_packets": s.tx_packets,
                     "rx_bytes": s.rx_bytes, "tx_bytes": s.tx_bytes, "rx_dropped": s.rx_dropped,
                     "tx_dropped": s.tx_dropped, "rx_errors": s.rx_errors, "tx_errors": s.tx_errors}
                    for s in ev.msg.body]
        records = self.core.stats_records(switch, counters, time.time())
        if records:
            with open(self.settings.stats_file, "a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
