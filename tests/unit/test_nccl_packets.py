"""What ``emu nccl-tests --packets`` runs (emulator.runs.nccl_packets): the cell NCCL's choice becomes, and the
timing model of that cell against the NCCL model (the packets measure within a few percent of the timing model:
docs/fidelity.md), without a network."""

from __future__ import annotations

import pytest

from emulator.cli import main as cli
from emulator.model import fabric
from emulator.model.collectives.generators import generate
from emulator.model.latency import LatencyModel
from emulator.model.nccl import cost
from emulator.model.nccl.system import GPUS, System
from emulator.model.prediction.check import check
from emulator.model.topology import tcp_goodput_factor
from emulator.runs import nccl_packets
from emulator.runs.nccl_packets import NotRun, PacketCell, packet_cell


def _system(nodes: int, gpus: int, gpu: str = "h100-sxm", nics: int | None = None) -> System:
    return System(nodes, gpus, nics or gpus, 400.0, GPUS[gpu])


def _cell(system: System, size: int, op: str = "allreduce", algo: str = "auto") -> PacketCell:
    cell = packet_cell(system, op, cost.predict(system, op, size, algo))
    assert isinstance(cell, PacketCell), cell
    return cell


def _timing_model_us(system: System, cell: PacketCell) -> float:
    """The timing model's time of the cell as the packets run it, on the real fabric's clock, with the base
    latency the output adds."""
    profile = cell.at_link_rate(nccl_packets.LINK_MBPS)
    topo = fabric.rebuild(cell.topology, profile).topology
    sched = generate(cell.generator, topo, cell.prediction.nbytes, chunks=cell.chunks(len(topo.hosts)),
                     collective=cell.collective)
    report = check(sched, topo, "shortest", latency=LatencyModel(profile), mtu=profile.emulated_mtu)
    assert report.valid
    return profile.real_seconds(report.timing.makespan_s) * 1e6 + cell.base_latency_us


@pytest.mark.parametrize(("nodes", "gpus", "size", "algo", "chosen"), [
    (2, 1, 8 << 10, "auto", "ring/ll"), (2, 1, 1 << 20, "auto", "ring/ll128"), (2, 1, 64 << 20, "auto", "ring/simple"),
    (2, 8, 8 << 10, "auto", "tree/ll"), (2, 8, 1 << 20, "auto", "tree/ll128"), (4, 8, 8 << 10, "auto", "tree/ll"),
    (4, 8, 1 << 20, "auto", "tree/ll128"), (4, 8, 64 << 20, "auto", "nvlstree/simple"),
])
def test_the_packets_timing_model_is_within_10_percent_of_the_nccl_model(nodes, gpus, size, algo, chosen):
    system = _system(nodes, gpus)
    cell = _cell(system, size, algo=algo)
    assert f"{cell.prediction.algorithm}/{cell.prediction.protocol}" == chosen
    assert _timing_model_us(system, cell) == pytest.approx(cell.prediction.time_us, rel=0.10)


def test_a_small_ring_across_servers_crosses_the_network_more_often_than_nccls_model_counts():
    """NCCL's model charges a ring 2(N-1) network steps; the chain of 2(p-1) hops a block takes around a ring that
    crosses every server boundary once per turn crosses about 2N of them. At 8 KiB over 2 x 4 GPUs (LL: 2.7 us a
    network step, 1.0 inside a server) that is about two steps more: 10-25 % above the model (2 x 8: 12 %)."""
    system = _system(2, 4)
    cell = _cell(system, 8 << 10, algo="ring")
    assert 1.10 < _timing_model_us(system, cell) / cell.prediction.time_us < 1.25


def test_two_channels_per_nic_overlap_where_nccls_model_adds_latency_and_bytes():
    """At 4 MiB over 2 x 4 GPUs (LL128, 16 channels on 4 NICs) one channel's step latency is hidden behind the
    others' bytes on their shared NIC, which NCCL's model (latency + bytes / bandwidth) does not do: the packets'
    model is faster, by less than the whole latency term (0.78 of the model; 2 x 8 at 16 MiB: 0.74)."""
    system = _system(2, 4)
    cell = _cell(system, 4 << 20, algo="ring")
    emulated = _timing_model_us(system, cell)
    choice_latency = cell.prediction.time_us - cell.prediction.nbytes / (1000.0 * cell.prediction.algbw_gbs)
    assert cell.prediction.time_us - choice_latency < emulated < cell.prediction.time_us


def test_the_network_has_a_rail_per_nic_and_the_servers_nvlink():
    cell = _cell(_system(2, 8), 1 << 20, algo="ring")
    assert cell.topology.startswith("railonly:rails=8,hosts_per_rail=2,servers=2,accels_per_server=8")
    assert cell.channels == 16
    assert cell.profile.domain_gbps > cell.profile.link_gbps
    assert _cell(_system(3, 1), 1 << 20).topology == "star:hosts=3"


def test_rates_carry_the_protocols_efficiency_and_nccls_channel_limit():
    system = _system(2, 1)
    ll = _cell(system, 8 << 10)
    simple = _cell(system, 64 << 20)
    assert (ll.prediction.protocol, simple.prediction.protocol) == ("ll", "simple")
    assert ll.profile.link_gbps == pytest.approx(simple.profile.link_gbps * 0.5)
    assert simple.profile.link_gbps / 8 == pytest.approx(system.path_gbs() / tcp_goodput_factor(4096))  # TCP framing
    servers = _system(4, 8)
    ll128 = _cell(servers, 1 << 20, algo="ring")  # NCCL's 16 LL128 channels move less than 8 NICs: the packets follow
    scale = ll128.prediction.algbw_gbs / ll128.prediction.hardware_algbw_gbs
    assert ll128.prediction.protocol == "ll128" and scale < 0.9
    assert ll128.profile.link_gbps == pytest.approx(simple.profile.link_gbps * 0.92 * scale)


def test_latencies_are_nccls_per_step_by_link_type():
    one_gpu = _cell(_system(2, 1), 8 << 10)  # LL; one GPU per node: NCCL's tree latency for the network step
    assert (one_gpu.profile.alpha_us, one_gpu.profile.switch_latency_us, one_gpu.base_latency_us) == (5.0, 0.0, 6.6)
    servers = _cell(_system(2, 8), 8 << 10, algo="ring")  # LL: 0.6 over NVLink, 2.7 between nodes, over 3 switches
    assert servers.profile.alpha_us == 1.0  # the network's posting overhead is more than NVLink's 0.6
    assert servers.profile.switch_latency_us * 3 + servers.profile.alpha_us == pytest.approx(2.7)
    tree = _cell(_system(2, 8), 8 << 10)  # NCCL's tree: LL 0.6 over NVLink, 5.0 between nodes, no overhead floor
    assert tree.prediction.algorithm == "tree" and tree.base_latency_us == 6.8
    assert (tree.profile.alpha_us, tree.profile.switch_latency_us * 3 + tree.profile.alpha_us) == \
        (0.6, pytest.approx(5.0))


def test_a_trees_nics_carry_what_nccls_tree_bandwidth_gives_the_load_the_tree_puts_on_them():
    """NCCL's tree bandwidth is half the bus: a NIC direction carrying twice a node's share, as an interior node of
    one tree and a leaf of the other does from 4 nodes on. Between two nodes each node's bytes cross once each
    way, so the packets' NICs run at half the rate that bandwidth would give them."""
    assert [nccl_packets.tree_nic_load(n) for n in (1, 2, 3, 4, 8)] == [0.0, 1.0, 1.5, 2.0, 2.5]
    two, four = _cell(_system(2, 4), 1 << 20, algo="tree"), _cell(_system(4, 4), 1 << 20, algo="tree")
    assert (two.prediction.algorithm, four.prediction.algorithm) == ("tree", "tree")

    def per_unit_scale(cell: PacketCell) -> float:
        p = cell.prediction
        return cell.profile.link_gbps / (p.algbw_gbs / p.hardware_algbw_gbs)
    assert per_unit_scale(two) == pytest.approx(per_unit_scale(four) / 2)


def test_nvls_tree_runs_with_nvswitchs_time_and_latency_on_the_interconnect():
    """The packets carry NVSwitch's reduction and multicast as messages to and from the heads, 2(G-1)/G times a
    GPU's bytes each way: the interconnect runs at that times NVSwitch's stage (twice NVLink at NVLS's efficiency,
    in algorithm bandwidth), scaled as the NICs by NCCL's channel limit; NCCL's NVSwitch latency (25 us, once per
    collective) is split over a piece's two crossings, and a network step takes NCCL's 20.9 us."""
    system = _system(2, 8)
    cell = _cell(system, 64 << 20)
    p = cell.prediction
    assert (p.algorithm, cell.generator, cell.chunks(16)) == ("nvlstree", "nccl-nvls", 16 * 16)
    scale = p.algbw_gbs / p.hardware_algbw_gbs
    nvswitch_algbw = 370.8 * 2 * 0.85 * 16 / 30
    assert cell.profile.domain_gbps == pytest.approx(8 * 1.75 * nvswitch_algbw * scale / tcp_goodput_factor(4096))
    assert cell.profile.link_gbps == pytest.approx(8 * system.path_gbs() * scale / tcp_goodput_factor(4096))
    assert cell.profile.alpha_us == 12.5 and cell.base_latency_us == 0.0
    assert cell.profile.alpha_us + 3 * cell.profile.switch_latency_us == pytest.approx(20.9)


def test_a_pipelined_trees_scratch_holds_only_what_a_rank_receives():
    """A rank's scratch holds what it receives: on 2 x 8 a head's two channels from its eight senders and the
    other channels' results, under twice the buffer; a scratch range per sender slot took ten buffers (4 x 8 at
    64 MiB needed 28 GiB)."""
    system = _system(2, 8)
    cell = _cell(system, 64 << 20)
    topo = fabric.rebuild(cell.topology, cell.at_link_rate(nccl_packets.LINK_MBPS)).topology
    sched = generate(cell.generator, topo, 64 << 20, chunks=cell.chunks(16), collective="allreduce")
    assert sched.scratch_chunks <= 2 * sched.chunks
    odd = generate("nccl-nvls", topo, 3 * 4 * 255, chunks=32, collective="allreduce")  # chunks of two sizes
    assert odd.scratch_chunks > odd.chunks


@pytest.mark.parametrize(("system", "op", "algo", "needle"), [
    (_system(2, 1), "broadcast", "auto", "broadcast has no packet schedule"),
    (_system(2, 4, gpu="a100-pcie"), "allreduce", "ring", "without NVLink"),
])
def test_what_does_not_run_as_packets_says_why(system, op, algo, needle):
    found = packet_cell(system, op, cost.predict(system, op, 64 << 20, algo))
    assert isinstance(found, NotRun) and needle in found.why


@pytest.mark.parametrize(("argv", "field"), [
    (["--link-mbps", "5000"], "link-mbps"), (["--link-mbps", "fast"], "link-mbps"), (["--repeat", "0"], "repeat"),
    (["--max-time", "1s"], "max-time"),  # admission: bring-up alone takes longer
])
def test_packets_refuse_in_one_line_before_anything_is_written(argv, field, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["nccl-tests", "all_reduce_perf", "--nodes", "2", "--gpus-per-node", "1", "-b", "1M", "-e", "1M"]
    status = cli.main([*base, "--packets", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert status == 2 and f"field '{field}'" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_packets_refuse_a_folder_that_holds_results(tmp_path, capsys):
    (tmp_path / "old.json").write_text("{}")
    status = cli.main(["nccl-tests", "all_reduce_perf", "--nodes", "2", "--gpus-per-node", "1", "--packets",
                       "--out", str(tmp_path)])
    assert status == 2 and "field 'out'" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]


def test_a_size_on_fewer_channels_gives_their_nics_what_all_carried():
    """2 x 8 at 8 KiB: NCCL's model counts 16 channels on 8 NICs; 2 run, on 2 NICs, which then carry the model's
    bytes at 4 times the rate each, up to the path's (without it, every hop's store-and-forward of a piece at the
    LL tree's small share of a NIC slows the run by a third on 4 x 8)."""
    system = _system(2, 8)
    cell = _cell(system, 8 << 10)
    p = cell.prediction
    assert (p.algorithm, p.protocol, p.channels, p.model_channels) == ("tree", "ll", 2, 16)
    per_nic = system.path_gbs() * 0.5 * p.algbw_gbs / p.hardware_algbw_gbs
    two_nodes = nccl_packets.tree_nic_load(2) / 2  # the tree's load on two nodes
    assert cell.profile.link_gbps == pytest.approx(8 * min(system.path_gbs(), 4 * per_nic * two_nodes) /
                                                   tcp_goodput_factor(4096))
