"""The NCCL model: nccl-tests' conventions, NCCL's tuning as its source states it, and the predicted time."""

from __future__ import annotations

import json
import math

import pytest

from emulator.base.errors import FieldError
from emulator.cli import main as cli
from emulator.model.nccl import cost, tuning
from emulator.model.nccl import nccl_tests as nt
from emulator.model.nccl.system import GPUS, HOST_READ_FRACTION, NIC_EFFICIENCY, System

H100 = GPUS["h100-sxm"]


def h100(nodes: int, gpus: int = 8) -> System:
    return System(nodes=nodes, gpus_per_node=gpus, nics_per_node=gpus, nic_gbps=400, gpu=H100, cpu="intel")


# ------------------------------------------------------------ nccl-tests
@pytest.mark.parametrize("text, value", [("8", 8), ("128K", 128 << 10), ("128M", 128 << 20), ("8G", 8 << 30),
                                         ("1g", 1 << 30)])
def test_sizes_read_as_nccl_tests_reads_them(text, value):
    assert nt.parse_size("minbytes", text) == value


@pytest.mark.parametrize("text", ["1.5M", "x", "-8", "0", "2T", "9" * 100])
def test_a_bad_size_names_its_flag(text):
    with pytest.raises(FieldError, match="field 'minbytes'"):
        nt.parse_size("minbytes", text)


def test_the_sizes_of_b_e_f():
    sizes = nt.sizes(8, 8 << 30, 2)
    assert len(sizes) == 31 and sizes[0] == 8 and sizes[-1] == 8 << 30
    assert nt.sizes(1 << 10, 1 << 20, 1000) == [1 << 10, 1024000]


def test_counts_per_rank_are_16_byte_aligned_and_the_size_follows():
    op = nt.OPS["all_gather_perf"]
    assert nt.count_and_size(op, 1000, 16) == (12, 12 * 16 * 4)  # 250 floats / 16 ranks = 15 -> 12
    assert nt.count_and_size(nt.OPS["all_reduce_perf"], 1000, 16) == (250, 1000)


@pytest.mark.parametrize("binary, ranks, factor", [("all_reduce_perf", 16, 1.875), ("all_gather_perf", 4, 0.75),
                                                   ("reduce_scatter_perf", 2, 0.5), ("alltoall_perf", 8, 0.875),
                                                   ("broadcast_perf", 8, 1.0), ("sendrecv_perf", 8, 1.0)])
def test_bus_bandwidth_factors_are_nccl_tests(binary, ranks, factor):
    row = nt.Row(size=1_000_000, count=250_000, op=nt.OPS[binary], time_us=100.0, ranks=ranks)
    assert row.algbw_gbs == pytest.approx(10.0)
    assert row.busbw_gbs == pytest.approx(10.0 * factor)


# ------------------------------------------------------------ the search
@pytest.mark.parametrize("system, channels, speed, runtime", [
    # A100 (PCIe Gen4, 24 GB/s) + HDR 200G: one channel at 24, not doubled (24 < 25), 2 run
    (System(2, 1, 1, 200, GPUS["a100-pcie"]), 1, 24, 2),
    # H100 (Gen5, 48) + NDR 400G: one channel at 48, doubled to two at 24, 4 run
    (System(2, 1, 1, 400, GPUS["h100-pcie"]), 2, 24, 4),
    # 8 H100 + 8 NDR: 7 x 48 fit NVLink (370.8), 8 x 45 carry more; not doubled (Hopper, < 50, > 4 channels)
    (h100(8), 8, 45, 16),
    # across sockets on AMD: the 16 GB/s socket link caps the path; the speed array's 15
    (System(2, 1, 1, 200, GPUS["a100-pcie"], cpu="amd", gpu_nic_path="cross-socket"), 1, 15, 2),
    # 8 B200 (NVLink 5: 18 x 40.1) + 8 NDR: Blackwell's speed array; 8 x 48 fit NVLink, one per NIC
    (System(2, 8, 8, 400, GPUS["b200-sxm"]), 8, 48, 16),
])
def test_the_search_finds_the_channels_nccl_documents(system, channels, speed, runtime):
    graph = tuning.search(system)
    assert (graph.channels, graph.speed_gbs, graph.runtime_channels) == (channels, speed, runtime)


def test_ll128_is_off_where_nccl_keeps_it_off():
    assert tuning.search(h100(2)).ll128_allowed
    assert not tuning.search(System(2, 8, 8, 400, H100, gdr=False)).ll128_allowed  # host staging: PHB
    assert not tuning.search(System(2, 8, 8, 400, GPUS["h100-pcie"])).ll128_allowed  # no NVLink inside


# ------------------------------------------------------------ the tuning
def test_latencies_are_nccls_tables():
    one_gpu = System(2, 1, 1, 400, GPUS["h100-pcie"])
    # ring LL, 2 ranks on 2 nodes: base 6.6 + 2 network steps at the tree's LL latency (one GPU per node: 5.0)
    assert tuning.choose(one_gpu, "allreduce", 8, "ring", "ll").latency_us == pytest.approx(6.6 + 2 * 5.0)
    # tree LL, 2 x 8: base 6.8 + 2 x (7 NVLink steps at 0.6 + 1 network level at 5.0)
    assert tuning.choose(h100(2), "allreduce", 8, "tree", "ll").latency_us == pytest.approx(6.8 + 2 * (7 * 0.6 + 5.0))
    # ring Simple all-gather on 8 x 8, Intel: 63 steps, 7 over the network at 14, 56 at max(3.4, 3 x 1.0)
    assert tuning.choose(h100(8), "allgather", 1 << 30, "ring", "simple").latency_us == \
        pytest.approx(8.4 + 56 * 3.4 + 7 * 14.0)


def test_nccl_switches_protocols_by_size():
    small, large = (tuning.choose(h100(4), "allreduce", n) for n in (1024, 1 << 30))
    assert (small.algorithm, small.protocol) == ("tree", "ll")
    assert (large.algorithm, large.protocol) == ("nvlstree", "simple")  # NCCL's default on multi-node HGX H100
    assert small.time_us(1024) < tuning.choose(h100(4), "allreduce", 1024, "ring", "simple").time_us(1024)
    one_gpu = System(4, 1, 1, 400, GPUS["h100-pcie"])
    assert (tuning.choose(one_gpu, "allreduce", 1 << 30).algorithm, tuning.choose(one_gpu, "allreduce", 8).protocol) \
        == ("ring", "ll")


def test_nvls_tree_is_nccls_model_of_it():
    # 2 nodes of 8: 8 heads at 45 GB/s; per channel min(NVLS 45 x 0.85 x 7/8 x 2, network 2 x 45, Hopper cap 57.7)
    choice = tuning.choose(h100(2), "allreduce", 1 << 30, "nvlstree", "simple")
    assert choice.bandwidth_gbs == pytest.approx(8 * 57.7 * 16 / 30)
    assert choice.latency_us == pytest.approx(25.0 + 2 * 1 * 20.9)
    # 4 nodes: the network no longer counts twice, 45 per channel
    assert tuning.choose(h100(4), "allreduce", 1 << 30, "nvlstree").bandwidth_gbs == pytest.approx(8 * 45 * 32 / 62)
    with pytest.raises(FieldError, match="field 'algo'"):
        tuning.choose(System(2, 1, 1, 400, GPUS["h100-pcie"]), "allreduce", 1 << 20, "nvlstree")
    with pytest.raises(FieldError, match="field 'algo'"):
        tuning.choose(System(1, 8, 8, 400, H100), "allreduce", 1 << 20, "nvlstree")  # one node: not NVLS tree


def test_nvls_trees_time_takes_nvswitch_from_the_hardware_not_nccls_nic_speed():
    # Hopper: NCCL's per-channel cap binds before its NVSwitch term; the time is NCCL's bandwidth
    assert tuning.nvls_tree_channel_bandwidth(h100(2), "allreduce") == pytest.approx(8 * 57.7 * 16 / 30)
    # Blackwell: NCCL's NVSwitch term (48 x 0.74 x 7/8 x 2 = 62.2 a channel) binds NCCL's choice, not the time:
    # per channel min(network 2 x 48, cap 96), within the hardware's NVSwitch (18 x 40.1 x 2 x 0.74) and NICs
    b200 = System(2, 8, 8, 400, GPUS["b200-sxm"])
    assert tuning.choose(b200, "allreduce", 8 << 30).bandwidth_gbs == pytest.approx(8 * 62.16 * 16 / 30, rel=1e-3)
    p = cost.predict(b200, "allreduce", 8 << 30)
    assert p.algorithm == "nvlstree" and p.algbw_gbs == pytest.approx(8 * 96 * 16 / 30)


def test_forcing_what_nccl_cannot_run_names_the_field():
    with pytest.raises(FieldError, match="field 'algo'"):
        tuning.choose(h100(2), "allgather", 1 << 20, "tree")
    with pytest.raises(FieldError, match="field 'protocol'"):
        tuning.choose(h100(2), "allreduce", 1 << 20, "ring", "ll64")
    with pytest.raises(FieldError, match="field 'channels'"):
        tuning.choose(h100(2), "allreduce", 1 << 20, channels=65)


def test_more_channels_give_more_of_nccls_bandwidth():
    base = tuning.choose(h100(8), "allreduce", 1 << 30, "ring", "simple")
    more = tuning.choose(h100(8), "allreduce", 1 << 30, "ring", "simple", channels=24)
    assert more.bandwidth_gbs == pytest.approx(base.bandwidth_gbs * 24 / 16)


# ------------------------------------------------------------ the cost
def test_a_host_staged_plateau_is_the_host_read_rate():
    staged = System(2, 1, 1, 400, GPUS["a100-pcie"], gdr=False, gpu_nic_path="same-socket")
    p = cost.predict(staged, "allreduce", 1 << 30)
    busbw = (1 << 30) / (p.time_us * 1e3)  # 2 ranks: busbw = algbw
    assert busbw == pytest.approx(HOST_READ_FRACTION * 24.0, rel=0.01)
    assert p.bottleneck == "host staging"


def test_with_gpudirect_the_nic_or_nccls_channels_limit():
    direct = System(2, 1, 1, 200, GPUS["a100-pcie"])
    p = cost.predict(direct, "allreduce", 1 << 30)
    assert (1 << 30) / (p.time_us * 1e3) == pytest.approx(min(24.0, NIC_EFFICIENCY * 25.0), rel=0.01)
    eight = cost.predict(h100(8), "allreduce", 8 << 30)
    busbw = (8 << 30) / (eight.time_us * 1e3) * 2 * 63 / 64
    # 8 x 45 GB/s of NCCL's channels (below 8 NICs' 384 and NVLink's 370.8), less the ~0.8 ms of ring latency
    assert busbw == pytest.approx(8 * 45, rel=0.025) and eight.bottleneck == "nccl channels"


def test_the_model_never_beats_nccls_own_bandwidth_or_the_hardware():
    for system in (h100(2), h100(8), System(4, 1, 1, 100, GPUS["a100-pcie"], gdr=False)):
        for size in (8, 1 << 16, 1 << 20, 1 << 26, 1 << 32):
            p = cost.predict(system, "allreduce", size)
            assert p.time_us >= p.nccl_time_us - 1e-9
            assert math.isfinite(p.time_us) and p.time_us > 0


def test_alltoall_is_paced_by_each_gpus_own_nic():
    p = cost.predict(h100(4), "alltoall", 1 << 30)
    over_net = (1 << 30) * 24 / 32 / (NIC_EFFICIENCY * 50.0)
    assert p.time_us == pytest.approx(8.4 + 14.0 + over_net / 1000, rel=1e-6) and p.bottleneck == "nic"


# ------------------------------------------------------------ the command
def test_emu_nccl_tests_prints_nccl_tests_table(capsys):
    assert cli.main(["nccl-tests", "all_reduce_perf", "--nodes", "2", "--gpus-per-node", "8", "-b", "8", "-e", "1G",
                     "-f", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[1:9] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw"]
    rows = [line.split() for line in out if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == nt.sizes(8, 1 << 30, 4)
    assert rows[0][2:5] == ["float", "sum", "-1"] and rows[0][8] == "tree/ll" and rows[-1][8] == "nvlstree/simple"


def test_emu_nccl_tests_json_rows(capsys):
    assert cli.main(["nccl-tests", "all_gather_perf", "--nodes", "4", "--gpus-per-node", "8", "-b", "1M", "-e", "1G",
                     "-f", "32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in data["rows"]] == [1 << 20, 1 << 25, 1 << 30]
    row = data["rows"][-1]
    assert {"size", "time_us", "algbw_GBps", "busbw_GBps"} <= set(row)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 31 / 32, rel=1e-3)


@pytest.mark.parametrize("argv, field", [
    (["-b", "1.5M"], "minbytes"), (["-b", "8", "-e", "4"], "maxbytes"), (["--algo", "tree", "-b", "8", "-e", "8"],
                                                                      "algo"),
    (["--fabric", "link_gbps=-1"], "link_gbps"), (["--channels", "0"], "channels"),
])
def test_emu_nccl_tests_refuses_in_one_line(argv, field, capsys):
    status = cli.main(["nccl-tests", "all_gather_perf", "--nodes", "2", "--gpus-per-node", "1", *argv])
    err = capsys.readouterr().err
    assert status == 2 and f"field '{field}'" in err and err.count("\n") == 1, err


def test_the_hardware_stage_of_each_algorithm():
    # 8 x 400G NICs (384) below NVLink, which carries a channel through 7 of a node's 8 GPUs (370.8 x 8/7)
    assert cost.hardware_bus_gbs(h100(8)) == (pytest.approx(8 * NIC_EFFICIENCY * 50), "nic")
    assert cost.hardware_bus_gbs(System(1, 8, 8, 400, H100)) == (pytest.approx(18 * 20.6), "nvlink")
    # NVLS tree between two nodes: the network counts twice (each node's reduced data crosses once, half a ring's
    # bytes), NVSwitch's reduction twice NVLink at NVLS's efficiency: NVLink (630) below the NICs (768)
    assert cost.hardware_bus_gbs(h100(2), "nvlstree") == (pytest.approx(2 * 0.85 * 18 * 20.6), "nvlink")
    assert cost.hardware_bus_gbs(System(2, 8, 2, 400, H100), "nvlstree") == \
        (pytest.approx(2 * 2 * NIC_EFFICIENCY * 50), "nic")


def test_gpus_without_nvlink_meet_as_nccl_allows_and_share_their_one_link():
    # on CPU root ports (a GPU-NIC path through the host bridge) NCCL's default keeps P2P off: host memory (SHM)
    on_cpu = System(2, 4, 4, 400, GPUS["a100-pcie"], gdr=False, gpu_nic_path="same-socket")
    assert on_cpu.peer_path() == "shm" and on_cpu.intra_gbs() == pytest.approx(HOST_READ_FRACTION * 24.0)
    # the GPU's one PCIe link carries its peer and its NIC traffic alike: no NVLink-like G/(G-1) share
    assert cost.hardware_bus_gbs(on_cpu) == (pytest.approx(HOST_READ_FRACTION * 24.0), "host memory")
    switched = System(2, 4, 4, 400, GPUS["a100-pcie"])
    assert switched.peer_path() == "p2p" and cost.hardware_bus_gbs(switched) == (pytest.approx(24.0), "pcie")
    # AMD hosts keep P2P at any distance for two GPUs (NCCL's paths.cc), not for four
    assert System(2, 2, 2, 400, GPUS["a100-pcie"], cpu="amd", gpu_nic_path="cross-socket").peer_path() == "p2p"
    assert System(2, 4, 4, 400, GPUS["a100-pcie"], cpu="amd", gpu_nic_path="cross-socket").peer_path() == "shm"
    assert h100(2).peer_path() == "nvlink"
    # host-staged, 1 GPU or 4 per node: each GPU's host-staged link sets the same plateau
    one = cost.predict(System(2, 1, 1, 400, GPUS["a100-pcie"], gdr=False, gpu_nic_path="same-socket"),
                       "allreduce", 1 << 30)
    four = cost.predict(on_cpu, "allreduce", 1 << 30)
    assert four.algbw_gbs * 2 * 7 / 8 == pytest.approx(one.algbw_gbs, rel=0.01)


def test_small_sizes_run_on_fewer_channels_as_nccl_gives_them():
    """topoGetAlgoInfo takes channels away while bytes < channels x threads x threshold (LL 8 B a thread, 512
    threads; a ring's LL threshold times the ranks; LL128 640 threads): the time NCCL predicted stays."""
    system = h100(2)  # 2 x 8: 16 channels
    small = tuning.choose(system, "allreduce", 8 << 10)
    assert (small.algorithm, small.protocol, small.model_channels) == ("tree", "ll", 16)
    assert small.channels == 2  # 8192 < 16 x 512 x 8 until 2 x 512 x 8 = 8192
    ring = tuning.choose(system, "allreduce", 8 << 10, "ring")
    assert ring.channels == 1  # LL's threshold times 16 ranks
    big = tuning.choose(system, "allreduce", 1 << 20)
    assert big.channels == big.model_channels == 16
    prediction = cost.predict(system, "allreduce", 8 << 10)
    assert (prediction.channels, prediction.model_channels) == (2, 16)
    assert prediction.time_us == pytest.approx(small.time_us(8 << 10))
