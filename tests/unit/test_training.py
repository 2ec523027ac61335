"""A data-parallel training iteration: the ResNet-50 table, DDP's buckets, the composed schedule and its timing."""

from __future__ import annotations

import pytest

from emulator.base.errors import FieldError
from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.prediction import check, timing
from emulator.model.schedule import executor
from emulator.model.schedule.format import COMPUTE, from_dict
from emulator.model.workloads import training

BIGRAPH8 = "bigraph:upper=2,lower=2,hosts_per_switch=2"
BIGRAPH16 = "bigraph:upper=4,lower=4,hosts_per_switch=2"
STAR16 = "star:hosts=16"
RESNET50 = training.MODELS["resnet50"]
#: The allreduce sizes of the ResNet-50 DDP trace in mlcommons/chakra (tests/data/chakra/feeder_tests_trace.tar.gz).
CHAKRA_BUCKETS = [8_196_000, 31_502_336, 26_255_360, 26_550_272, 9_724_160]


def test_resnet50_has_torchvisions_parameters_in_order():
    params = RESNET50.params
    assert RESNET50.param_count == 25_557_032
    assert len(params) == 161 and len(RESNET50.layers) == 107
    assert params[0] == training.Param("conv1.weight", 64 * 3 * 7 * 7)
    assert [t.name for t in params[-2:]] == ["fc.weight", "fc.bias"]
    names = [t.name for t in params]
    # torchvision registers a block's downsample after its bn3
    i = names.index("layer2.0.bn3.bias")
    assert names[i + 1:i + 4] == ["layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
                                  "layer2.0.downsample.1.bias"]
    assert names.index("layer2.0.conv2.weight") < i
    assert len(set(names)) == len(names)


def test_resnet50_forward_is_about_8_2_gflops():
    flops = RESNET50.forward_flops
    assert flops == pytest.approx(8.2e9, rel=0.03)
    macs = sum(layer.forward_flops for layer in RESNET50.layers if layer.kind != "bn") / 2
    assert macs == pytest.approx(4.09e9, rel=0.01)  # torchvision's 4.09 GMACs
    bn = sum(layer.forward_flops for layer in RESNET50.layers if layer.kind == "bn")
    assert bn < 0.01 * flops
    # v1.5: layer2.0's stride is in its 3x3 convolution (56x56 in, 28x28 out)
    conv2 = next(layer for layer in RESNET50.layers if layer.name == "layer2.0.conv2")
    assert conv2.forward_flops == 2 * 9 * 128 * 128 * 28 * 28
    conv1 = next(layer for layer in RESNET50.layers if layer.name == "layer2.0.conv1")
    assert conv1.forward_flops == 2 * 256 * 128 * 56 * 56


def test_ddp_buckets_are_the_chakra_traces_allreduces():
    buckets = training.ddp_buckets(RESNET50)
    assert [b.bytes for b in buckets] == CHAKRA_BUCKETS
    assert sum(CHAKRA_BUCKETS) == 4 * RESNET50.param_count
    covered = [i for b in buckets for i in b.params]
    assert covered == list(reversed(range(len(RESNET50.params))))  # reverse parameters() order, each once
    names = [RESNET50.layers[b.ready_after].name for b in buckets]
    assert names == ["fc", "layer4.1.conv2", "layer4.0.conv2", "layer3.0.downsample.0", "conv1"]


def test_a_bucket_closes_when_it_reaches_its_cap():
    layers = tuple(training.Layer(f"l{i}", "fc", (training.Param(f"l{i}.weight", n),), 1.0)
                   for i, n in enumerate([3, 2, 2, 4, 1, 1]))
    toy = training.Model("toy", layers, "test")
    # reverse order: 1, 1, 4, 2, 2, 3 elements of 1 byte; first cap 2, then 4
    buckets = training.ddp_buckets(toy, cap_bytes=4, first_bucket_bytes=2, element_bytes=1)
    assert [b.bytes for b in buckets] == [2, 4, 4, 3]
    assert [b.params for b in buckets] == [(5, 4), (3,), (2, 1), (0,)]
    assert [b.ready_after for b in buckets] == [4, 3, 1, 0]


def test_padding_stays_within_its_budget():
    sizes = [8_196_000, 31_502_336, 9_724_160]
    c, padded = training.pad_sizes(sizes, 16, 0.01)
    assert c % 4 == 0 and all(n % (16 * c) == 0 and 0 <= n - s < 16 * c for n, s in zip(padded, sizes, strict=True))
    assert sum(padded) - sum(sizes) <= 0.01 * sum(sizes)
    assert training.chunk_multiple(8) == 8 and training.chunk_multiple(12) == 24 and training.chunk_multiple(32) == 32


def _segment_of(sched, op):
    for k, seg in enumerate(sched.segments):
        if op.kind != COMPUTE and op.buffer == "data" and seg.chunk <= op.chunk < seg.chunk + seg.chunks:
            return k
    return None


@pytest.mark.parametrize(("spec", "algo", "max_padding"), [
    (BIGRAPH8, "ring", 0.01), (BIGRAPH8, "hdrm", 0.01), (STAR16, "ring", 0.05), (BIGRAPH16, "hdrm", 0.05)])
def test_the_iteration_is_proved_and_its_allreduces_follow_their_gradients(spec, algo, max_padding):
    topo = topology.build(spec)
    sched = training.iteration(topo, algo, scale=100, max_padding=max_padding)
    result = executor.execute(sched)
    assert result.valid, result.errors
    assert [seg.name for seg in sched.segments] == [f"bucket {b}" for b in range(5)]
    meta = sched.meta
    assert [b["bytes"] for b in meta["buckets"]] == CHAKRA_BUCKETS
    assert [seg.chunks * sched.chunk_bytes for seg in sched.segments] == [b["padded_bytes"] for b in meta["buckets"]]
    assert meta["padding_fraction"] <= max_padding
    assert all(abs(b["scaled_bytes"] - b["bytes"] / 100) < 4 for b in meta["buckets"])
    buckets = training.ddp_buckets(RESNET50)
    layers = len(RESNET50.layers)
    for prog in sched.ranks:
        ops = list(prog.ops)
        computes = [op.id for op in ops if op.kind == COMPUTE]
        assert len(computes) == 1 + layers
        # compute op k (k >= 1) is the backward of layer layers - k
        backward_of = {layers - k: op_id for k, op_id in enumerate(computes) if k}
        for b in buckets:
            entry = [op for op in ops if _segment_of(sched, op) == b.index
                     and not any(_segment_of(sched, ops[d]) == b.index for d in op.deps)]
            assert entry
            for op in entry:
                compute_deps = [d for d in op.deps if ops[d].kind == COMPUTE]
                assert compute_deps == [backward_of[b.ready_after]]
                earlier = {_segment_of(sched, ops[d]) for d in op.deps if ops[d].kind != COMPUTE}
                assert earlier == (set() if b.index == 0 else {b.index - 1})
    assert from_dict(sched.to_dict()) == sched


def test_compute_only_is_forward_plus_backward():
    topo = topology.build(BIGRAPH8)
    config = training.TrainingConfig(batch=64)
    sched = training.iteration(topo, "ring", config, scale=10)
    forward, backward = training.compute_seconds(RESNET50, config, 10)
    assert forward == pytest.approx(64 * RESNET50.forward_flops / training.V100_AMP.flops_per_s / 10)
    assert sum(backward) == pytest.approx(2 * forward)
    assert timing.compute_only_s(sched) == pytest.approx(forward + sum(backward), rel=1e-9)
    assert sched.meta["compute_only_s"] == pytest.approx(forward + sum(backward), rel=1e-9)
    # the accelerator is defined by its images/s: one iteration is batch / images_per_s
    assert sched.meta["real_compute_only_s"] == pytest.approx(64 / 1200)
    assert timing.compute_only_s(sched, 5000.0) == pytest.approx(5000 * (forward + sum(backward)), rel=1e-9)


def _efficiency(bw: float) -> tuple[check.CheckReport, float]:
    """A star of 8 hosts at ``bw`` Mbit/s with a slow accelerator: the iteration, and its allreduces' time alone."""
    topo = topology.build(f"star:hosts=8,bw={bw:g}")
    config = training.TrainingConfig(accelerator=training.Accelerator("slow", 4e10))
    sched = training.iteration(topo, "ring", config, scale=1000)
    report = check.check(sched, topo, "shortest")
    alone = sum(check.check(generate("ring", topo, b["padded_bytes"]), topo, "shortest").predicted_time_s
                for b in sched.meta["buckets"])
    return report, alone


def test_a_fast_network_hides_behind_compute_and_a_slow_one_shows_its_tail():
    fast, _ = _efficiency(1000)
    assert fast.compute_dilation == 1.0 and fast.compute_only_s == pytest.approx(fast.schedule.meta["compute_only_s"])
    assert fast.scaling_efficiency is not None and fast.scaling_efficiency > 0.99
    slow, alone = _efficiency(10)
    assert slow.scaling_efficiency is not None and slow.scaling_efficiency < 0.9
    assert slow.compute_only_s is not None
    assert slow.iteration_time_s > max(slow.compute_only_s, alone)
    assert slow.iteration_time_s < slow.compute_only_s + alone  # the allreduces overlap the backward pass
    data = slow.to_json()
    assert data["scaling_efficiency"] == pytest.approx(slow.compute_only_s / slow.predicted_time_s)
    assert data["iteration_time_s"] == slow.predicted_time_s and data["compute_ops"] == 8 * 108


def test_bad_configurations_name_their_field():
    topo = topology.build(BIGRAPH8)
    with pytest.raises(FieldError, match="scale"):
        training.iteration(topo, "ring", scale=0.5)
    with pytest.raises(FieldError, match="model"):
        training.gen("vgg16", "ring", topo)
    with pytest.raises(FieldError, match="batch"):
        training.gen("resnet50", "ring", topo, batch=0)
    with pytest.raises(FieldError, match="algo"):
        training.gen("resnet50", "nope", topo)


def test_gen_is_the_cli_entry():
    topo = topology.build(BIGRAPH8)
    sched = training.gen("resnet50", "hdrm", topo, batch=32, scale=100)
    assert sched.meta["batch"] == 32 and sched.meta["scale"] == 100 and sched.placement == "hdrm"
    assert sched.collective == "allreduce" and sched.algorithm == "hdrm" and sched.topology == topo.spec
