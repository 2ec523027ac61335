"""One data-parallel training iteration as a schedule: a model's compute, and its gradients' allreduces as PyTorch DDP runs them.

Pure. This module owns three things:

The model tables (:data:`MODELS`)
    Per layer (a module with parameters: convolution, batch norm, fully
    connected), its parameter tensors in ``model.parameters()`` order (name and
    element count) and its forward FLOPs per sample. The tables are derived
    from a compact description of the architecture, not typed in:
    :func:`resnet` builds torchvision's ResNet v1.5 (the stride of a
    downsampling bottleneck is in its 3x3 convolution) from its stages
    (``[3, 4, 6, 3]`` bottlenecks of widths ``64..512``, expansion 4, input
    224x224, 1000 classes). FLOPs: a convolution ``2·k·k·Cin·Cout·Hout·Wout /
    groups``, a fully connected layer ``2·in·out``, a batch norm ``2`` per
    output element (scale and shift; its statistics are not counted); ReLU,
    max pooling, the residual additions and the average pooling are ignored
    (together well under 1% of the total). ResNet-50 comes to 25,557,032
    parameters and 8.2 GFLOPs (4.1 GMACs) per 224x224 image, the commonly
    cited figures.

The gradient buckets (:func:`ddp_buckets`)
    PyTorch DDP's rule (``torch.distributed`` ``_compute_bucket_assignment_by_size``
    with DDP's ``bucket_cap_mb=25`` and ``dist._DEFAULT_FIRST_BUCKET_BYTES`` =
    1 MiB): the parameters are taken in *reverse* ``model.parameters()``
    order (the order their gradients become ready in the backward pass) and
    appended to the open bucket; a bucket is closed as soon as its size
    *reaches* its cap (the tensor that crosses the cap stays in it); the
    first bucket's cap is 1 MiB, every later one's 25 MiB; what is left at the
    end is the last bucket. For ResNet-50 with fp32 gradients this gives
    buckets of 8,196,000, 31,502,336, 26,255,360, 26,550,272 and 9,724,160
    bytes, exactly the allreduce sizes of the ResNet-50 DDP trace in
    mlcommons/chakra (our copy: ``tests/data/chakra/feeder_tests_trace.tar.gz``, Apache-2.0): an
    independent check of the table and of the rule.

The iteration (:func:`iteration`)
    Per rank: one ``compute`` op for the forward pass, then one per layer for
    its backward pass in reverse order (backward = 2 x forward FLOPs), each
    ``batch · FLOPs / flops_per_s`` seconds of the real accelerator
    (:class:`Accelerator`). Right after the backward of the layer that
    completes bucket ``b`` (the one holding the bucket's last-added
    parameter), bucket ``b``'s allreduce starts
    (:func:`emulator.model.collectives.generators.generate` spliced in with
    :meth:`emulator.model.schedule.compose.Composer.collective`); it overlaps the
    remaining backward compute. The allreduces of one rank run one after
    another, as on DDP's one NCCL stream: bucket ``b+1``'s waits for bucket
    ``b``'s as well as for its gradients. The optimizer step, data loading and
    the backward pass's skipped input gradient of the first convolution are
    not modelled.

Chunks and padding: a composed schedule has one chunk size. Each bucket is
padded up to a multiple of ``q·chunk_bytes``, ``q`` a multiple of every
generator's natural chunk count at ``p`` ranks (:func:`chunk_multiple`), with
``chunk_bytes`` the largest multiple of 4 bytes that keeps the padding of all
buckets together within ``max_padding`` (default 1%) of the gradients and the
schedule within :data:`~emulator.model.schedule.format.MAX_CHUNKS` chunks. The
padding (bytes per bucket and in all) is in ``meta``; the allreduces carry
the padded sizes.

``scale`` (>= 1) divides every gradient size and every compute time by the same
factor, to keep emulated runs short (a real ResNet-50 iteration of 213 ms on
a fabric dilated 5000 times takes 18 emulated minutes). On its own that keeps
the ratio of bandwidth time to compute time but not the latencies: the
per-message ``alpha`` and the switch latency would weigh ``scale`` times more
than in the real iteration (measured with the model at 32 hosts, scale 100:
ring's scaling efficiency 0.53 instead of 0.99). So a scaled iteration is
replayed on its fabric with the latencies divided by ``scale`` as well
(:func:`emulator.model.fabric.for_workload_scale`; ``emu run``, ``emu replay``
and ``emu schedule check`` do it from :func:`workload_scale`), and then every
term of its time is ``1/scale`` of the real iteration's except two: the
emulator's own latencies (flagged ``latency_floor`` where they exceed the
target) and frame serialisation (frames do not shrink; at MTU 9000 and
``scale`` 10 a frame's store-and-forward weighs 10 times more). ``meta``
keeps the unscaled sizes and compute time.

:func:`emulator.model.prediction.timing.compute_only_s` gives any schedule's
time with communication free (the compute-only iteration); ``meta`` records
it for the schedule built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator.base.errors import FieldError
from emulator.model.collectives.generators import generate
from emulator.model.collectives.registry import DBTREE_DEFAULT_CHUNKS
from emulator.model.prediction import timing
from emulator.model.schedule.compose import Composer, Node
from emulator.model.schedule.format import DTYPE_BYTES, MAX_CHUNKS, Schedule
from emulator.model.topology import Topology

WHERE = "schedule gen"

#: DDP's defaults: ``bucket_cap_mb=25`` and ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``.
BUCKET_CAP_BYTES = 25 * 1024 * 1024
FIRST_BUCKET_BYTES = 1024 * 1024
#: Gradients are fp32 (under automatic mixed precision too: the parameters stay fp32).
GRADIENT_DTYPE = "float32"


# ---------------------------------------------------------------------------
# Model tables
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One parameter tensor: its ``model.named_parameters()`` name and element count."""

    name: str
    numel: int


@dataclass(frozen=True)
class Layer:
    """A module with parameters (``conv``, ``bn`` or ``fc``): its tensors and forward FLOPs per sample."""

    name: str
    kind: str
    params: tuple[Param, ...]
    forward_flops: float

    @property
    def backward_flops(self) -> float:
        """Backward = 2 x forward (the input gradient and the weight gradient, each about a forward's work)."""
        return 2.0 * self.forward_flops


@dataclass(frozen=True)
class Model:
    """A model's layers in ``model.parameters()`` order (module registration order), and where the table comes from."""

    name: str
    layers: tuple[Layer, ...]
    source: str
    input: str = ""

    @property
    def params(self) -> tuple[Param, ...]:
        """Every parameter tensor, in ``model.parameters()`` order."""
        return tuple(t for layer in self.layers for t in layer.params)

    @property
    def param_count(self) -> int:
        return sum(t.numel for t in self.params)

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs per sample."""
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def training_flops(self) -> float:
        """Forward and backward FLOPs per sample (3 x forward)."""
        return 3.0 * self.forward_flops

    def layer_of(self) -> list[int]:
        """Per parameter tensor (``model.parameters()`` order), the index of its layer."""
        return [i for i, layer in enumerate(self.layers) for _ in layer.params]


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class _Builder:
    """Appends layers while following the activation's shape (channels, height, width)."""

    def __init__(self, channels: int, size: int):
        self.channels, self.size = channels, size
        self.layers: list[Layer] = []

    def conv(self, name: str, out: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        h = _conv_out(self.size, kernel, stride, kernel // 2)
        flops = 2.0 * kernel * kernel * self.channels * out * h * h / groups
        numel = kernel * kernel * self.channels * out // groups
        self.layers.append(Layer(name, "conv", (Param(f"{name}.weight", numel),), flops))
        self.channels, self.size = out, h

    def bn(self, name: str) -> None:
        c = self.channels
        self.layers.append(Layer(name, "bn", (Param(f"{name}.weight", c), Param(f"{name}.bias", c)),
                                 2.0 * c * self.size * self.size))

    def fc(self, name: str, out: int) -> None:
        c = self.channels
        self.layers.append(Layer(name, "fc", (Param(f"{name}.weight", c * out), Param(f"{name}.bias", out)),
                                 2.0 * c * out))
        self.channels, self.size = out, 1


def resnet(name: str, blocks: Sequence[int], widths: Sequence[int] = (64, 128, 256, 512), expansion: int = 4,
           image: int = 224, classes: int = 1000) -> Model:
    """torchvision's bottleneck ResNet (v1.5) from its stages: ``blocks[i]`` bottlenecks of width ``widths[i]``.

    Stem: 7x7 convolution of stride 2 to 64 channels, batch norm, ReLU, 3x3
    max pooling of stride 2. A bottleneck: 1x1 to ``width``, 3x3 (stride 2 in
    the first block of every stage but the first), 1x1 to
    ``width·expansion``, each followed by batch norm; the first block of a
    stage has a ``downsample`` (1x1 convolution with the stage's stride, batch
    norm), registered after ``bn3`` as torchvision does. Then average pooling
    and the fully connected classifier. Layers come in module registration
    order, which is ``model.parameters()`` order.
    """
    b = _Builder(3, image)
    b.conv("conv1", 64, 7, stride=2)
    b.bn("bn1")
    b.size = _conv_out(b.size, 3, 2, 1)  # max pooling
    for stage, (count, width) in enumerate(zip(blocks, widths, strict=True)):
        for j in range(count):
            prefix = f"layer{stage + 1}.{j}"
            stride = 2 if stage > 0 and j == 0 else 1
            channels, size = b.channels, b.size
            b.conv(f"{prefix}.conv1", width, 1)
            b.bn(f"{prefix}.bn1")
            b.conv(f"{prefix}.conv2", width, 3, stride=stride)
            b.bn(f"{prefix}.bn2")
            b.conv(f"{prefix}.conv3", width * expansion, 1)
            b.bn(f"{prefix}.bn3")
            if j == 0:
                out, out_size = b.channels, b.size
                b.channels, b.size = channels, size
                b.conv(f"{prefix}.downsample.0", out, 1, stride=stride)
                b.bn(f"{prefix}.downsample.1")
                assert (b.channels, b.size) == (out, out_size)
    b.fc("fc", classes)
    return Model(name, tuple(b.layers), input=f"3x{image}x{image}",
                 source=f"derived from torchvision's {name} (v1.5) architecture: bottleneck stages {list(blocks)}, "
                        f"widths {list(widths)}, expansion {expansion}, input {image}x{image}, {classes} classes")


#: Model tables by name (``emu schedule gen --model``).
MODELS: dict[str, Model] = {
    "resnet50": resnet("resnet50", (3, 4, 6, 3)),
}


def model(name: str, where: str = WHERE) -> Model:
    """The table of model ``name``; :class:`FieldError` naming ``model`` for an unknown one."""
    if name not in MODELS:
        raise FieldError(where, "model", f"one of {', '.join(MODELS)}", name)
    return MODELS[name]


# ---------------------------------------------------------------------------
# Accelerator and configuration
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Accelerator:
    """An accelerator by its sustained training throughput (FLOP/s over a whole forward and backward pass)."""

    name: str
    flops_per_s: float
    source: str = ""

    @classmethod
    def from_images_per_s(cls, name: str, images_per_s: float, reference: Model, source: str = "") -> Accelerator:
        """The throughput a measured training rate of ``reference`` implies: images/s x its training FLOPs per image."""
        return cls(name, images_per_s * reference.training_flops, source)


#: NVIDIA's published ResNet-50 v1.5 training throughput on one V100 16GB with mixed precision: 1200 img/s
#: (batch 256, pytorch-21.03 NGC container), NVIDIA DeepLearningExamples,
#: https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md
#: ("Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)", 1 GPU). Times the table's 3 x 8.2 GFLOPs per image,
#: about 29.5 TFLOP/s sustained. The same table gives 367 img/s in FP32 on a V100 and 938 (TF32) and 2470
#: (mixed precision) img/s on one A100 80GB.
V100_AMP = Accelerator.from_images_per_s(
    "V100-16GB mixed precision", 1200.0, MODELS["resnet50"],
    "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, training performance on DGX-1 16GB, 1 GPU, mixed "
    "precision: 1200 img/s at batch 256; https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/"
    "Classification/ConvNets/resnet50v1.5/README.md")
#: Batch per accelerator of that measurement (DeepLearningExamples ``configs.yml``: resnet50, DGX1V, AMP).
DEFAULT_BATCH = 256


@dataclass(frozen=True)
class TrainingConfig:
    """What one iteration trains: the model, the batch per rank, the accelerator and DDP's bucket caps."""

    model: str = "resnet50"
    batch: int = DEFAULT_BATCH
    accelerator: Accelerator = V100_AMP
    bucket_cap_bytes: int = BUCKET_CAP_BYTES
    first_bucket_bytes: int = FIRST_BUCKET_BYTES

    def check(self, where: str = WHERE) -> None:
        """Raise :class:`FieldError` naming the field for an unknown model or a non-positive number."""
        model(self.model, where)
        for name in ("batch", "bucket_cap_bytes", "first_bucket_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FieldError(where, name, "a positive integer", value)
        rate = self.accelerator.flops_per_s
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise FieldError(where, "accelerator.flops_per_s", "a positive number of FLOP/s", rate)


# ---------------------------------------------------------------------------
# DDP buckets
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: its parameter tensors (indices in ``model.parameters()``, in the order added), its bytes,
    and the layer whose backward completes it (the layer of the last tensor added)."""

    index: int
    params: tuple[int, ...]
    bytes: int
    ready_after: int


def ddp_buckets(m: Model, cap_bytes: int = BUCKET_CAP_BYTES, first_bucket_bytes: int = FIRST_BUCKET_BYTES,
                element_bytes: int = DTYPE_BYTES[GRADIENT_DTYPE]) -> list[Bucket]:
    """DDP's gradient buckets of ``m`` (see the module docstring for the rule), in the order they are reduced."""
    layer_of = m.layer_of()
    params = m.params
    out: list[Bucket] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel * element_bytes
        if size >= (first_bucket_bytes if not out else cap_bytes):
            out.append(Bucket(len(out), tuple(current), size, layer_of[i]))
            current, size = [], 0
    if current:
        out.append(Bucket(len(out), tuple(current), size, layer_of[current[-1]]))
    return out


# ---------------------------------------------------------------------------
# The iteration
# ---------------------------------------------------------------------------

def chunk_multiple(p: int) -> int:
    """A chunk count every generator's natural count at ``p`` ranks divides: ``p`` (ring, hier, hdrm), the largest
    power of two <= ``p`` (hd) and :data:`~emulator.model.collectives.registry.DBTREE_DEFAULT_CHUNKS` (dbtree)."""
    return math.lcm(p, 1 << (p.bit_length() - 1), DBTREE_DEFAULT_CHUNKS)


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def pad_sizes(sizes: Sequence[int], multiple: int, max_padding: float = 0.01,
              element_bytes: int = DTYPE_BYTES[GRADIENT_DTYPE]) -> tuple[int, list[int]]:
    """``(chunk_bytes, padded sizes)``: every size rounded up to a multiple of ``multiple·chunk_bytes``.

    ``chunk_bytes`` is the largest multiple of ``element_bytes`` with which the
    padding of all sizes together can exceed no ``max_padding`` of their sum
    (at least one element), then doubled until the sum is at most
    :data:`~emulator.model.schedule.format.MAX_CHUNKS` chunks.
    """
    total = sum(sizes)
    c = element_bytes * max(1, int(max_padding * total / (len(sizes) * multiple * element_bytes)))
    while True:
        padded = [_round_up(n, multiple * c) for n in sizes]
        if sum(padded) // c <= MAX_CHUNKS:
            return c, padded
        c *= 2


#: The largest ``scale`` (``--scale``, a run's ``scale``): it divides every size and compute time; past a million
#: the smallest model's gradients (ResNet-50's 100 MB) are a few elements and its compute times microseconds, so
#: nothing of the workload is left to emulate.
MAX_SCALE = 1e6
#: What a scale must be, as every check of one words it.
SCALE_EXPECTED = f"a number from 1 to {MAX_SCALE:,.0f} (sizes and compute times are divided by it)"


def check_scale(scale: object, where: str, field_name: str = "scale") -> float:
    """``scale`` as a float in 1..:data:`MAX_SCALE`, or :class:`FieldError` naming ``field_name``."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 1 <= scale <= MAX_SCALE:
        raise FieldError(where, field_name, SCALE_EXPECTED, scale)
    return float(scale)


def scaled_bytes(n: int, scale: float, element_bytes: int) -> int:
    """``n`` bytes divided by ``scale``, rounded up to whole elements, at least one: the ``scale`` rule for every
    size (this iteration's buckets, a language model's collectives, a scaled Chakra trace's)."""
    return element_bytes * max(1, math.ceil(n / element_bytes / scale))


def compute_seconds(m: Model, config: TrainingConfig, scale: float = 1.0) -> tuple[float, list[float]]:
    """``(forward, backward per layer)`` seconds of one iteration on one rank, divided by ``scale``."""
    per = config.batch / config.accelerator.flops_per_s / scale
    return m.forward_flops * per, [layer.backward_flops * per for layer in m.layers]


def iteration(topo: Topology, algo: str, config: TrainingConfig | None = None, placement: str | None = None,
              seed: int = 0, scale: float = 1.0, *, max_padding: float = 0.01) -> Schedule:
    """One data-parallel training iteration of ``config.model`` over every host of ``topo`` (see the module docstring).

    ``algo``, ``placement`` and ``seed`` are :func:`~emulator.model.collectives.generators.generate`'s, for every
    bucket's allreduce; ``scale`` (>= 1) divides gradient sizes and compute times. Segment ``b`` of the result is
    bucket ``b``'s allreduce (named ``bucket b``). ``meta`` holds the model, batch, accelerator, scale, the
    buckets (real, scaled and padded bytes, their tensors' range and the layer after which each starts), the
    chunk size and padding, the forward and backward seconds, ``compute_only_s`` (this schedule's, before any
    dilation: :func:`~emulator.model.prediction.timing.compute_only_s`) and the table's source. Raises
    :class:`FieldError` for a bad configuration, scale or algorithm.
    """
    config = config or TrainingConfig()
    config.check()
    check_scale(scale, WHERE)
    if not 0 < max_padding < 1:
        raise FieldError(WHERE, "max_padding", "a fraction between 0 and 1", max_padding)
    m = model(config.model)
    elem = DTYPE_BYTES[GRADIENT_DTYPE]
    buckets = ddp_buckets(m, config.bucket_cap_bytes, config.first_bucket_bytes, elem)
    scaled = [scaled_bytes(b.bytes, scale, elem) for b in buckets]
    p = len(topo.hosts)
    if p < 2:
        raise FieldError(WHERE, "topology", "a topology with at least 2 hosts", topo.spec)
    chunk_bytes, padded = pad_sizes(scaled, chunk_multiple(p), max_padding, elem)
    parts = [generate(algo, topo, n, placement=placement, seed=seed) for n in padded]
    hosts = parts[0].hosts
    forward_s, backward_s = compute_seconds(m, config, scale)

    comp = Composer(hosts, chunk_bytes)
    starts = {b.ready_after: b for b in buckets}
    last: list[Node] = [comp.compute(r, forward_s) for r in range(p)]
    reduced: list[list[Node]] = [[] for _ in range(p)]
    for li in reversed(range(len(m.layers))):
        last = [comp.compute(r, backward_s[li], [last[r]]) for r in range(p)]
        bucket = starts.get(li)
        if bucket is not None:
            after = {r: [last[r], *reduced[r]] for r in range(p)}
            nodes = comp.collective(parts[bucket.index], f"bucket {bucket.index}", after)
            reduced = [[node] for node in nodes]

    params = m.params
    layer_names = [layer.name for layer in m.layers]
    meta: dict[str, Any] = {
        "generator": "training", "model": m.name, "model_source": m.source, "input": m.input,
        "parameters": m.param_count, "forward_flops_per_sample": m.forward_flops,
        "batch": config.batch, "accelerator": config.accelerator.name,
        "accelerator_flops_per_s": config.accelerator.flops_per_s, "accelerator_source": config.accelerator.source,
        "scale": scale, "allreduce": algo,
        "bucket_rule": f"DDP: reverse parameter order, first bucket closed at >= {config.first_bucket_bytes} B, "
                       f"then at >= {config.bucket_cap_bytes} B",
        "buckets": [{"bucket": b.index, "bytes": b.bytes, "scaled_bytes": s, "padded_bytes": n,
                     "tensors": len(b.params), "first_tensor": params[b.params[0]].name,
                     "last_tensor": params[b.params[-1]].name, "after_layer": layer_names[b.ready_after]}
                    for b, s, n in zip(buckets, scaled, padded, strict=True)],
        "chunk_bytes": chunk_bytes, "padding_bytes": sum(padded) - sum(scaled),
        "padding_fraction": (sum(padded) - sum(scaled)) / sum(scaled),
        "forward_s": forward_s, "backward_s": sum(backward_s),
        "optimizer": "not modelled (nor data loading)",
    }
    sched = comp.build(algo, meta=meta, topology=topo.spec, placement=parts[0].placement)
    meta["compute_only_s"] = timing.compute_only_s(sched)
    meta["real_compute_only_s"] = meta["compute_only_s"] * scale
    return replace(sched, meta=meta)


def workload_scale(schedule: Schedule) -> float:
    """The ``scale`` a training iteration (this module's or :mod:`emulator.model.workloads.llm`'s) was built with,
    or an imported Chakra trace was scaled by (1 for any other schedule)."""
    meta = schedule.meta
    if meta.get("generator") not in ("training", "llm") and meta.get("imported_from") != "chakra":
        return 1.0
    scale = meta.get("scale", 1.0)
    return float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale >= 1 else 1.0


def gen(model_name: str, algo: str, topo: Topology, *, batch: int | None = None, scale: float = 1.0,
        placement: str | None = None, seed: int = 0) -> Schedule:
    """``emu schedule gen --model NAME --algo ALGO --topology T [--batch N] [--scale S]``: :func:`iteration` with the
    model's default configuration and ``batch`` per rank (default :data:`DEFAULT_BATCH`)."""
    config = TrainingConfig(model=model_name, batch=DEFAULT_BATCH if batch is None else batch)
    return iteration(topo, algo, config, placement=placement, seed=seed, scale=scale)
