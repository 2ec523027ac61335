"""Admission: whether a run fits this machine, decided before anything starts.

Slurm and Kubernetes admit a job only if its request fits; this module is
that decision for ``emu replay``, ``emu run``, ``emu mpirun`` and ``emu
bench``. A command describes its run as a :class:`Request` -- the memory it
needs (:class:`MemoryEstimate`), its predicted wall time, and the busiest
load the model offers the switch datapath against the capacity calibrated at
its MTU (:class:`Load`) -- and :func:`admit` compares it with the
:class:`Machine` (available memory, cores) and the user's :class:`Policy`
(``--max-time``, ``--allow-untrusted``). A refusal is one line naming both
numbers and what would fit (:class:`emulator.base.errors.UserError`, exit status
2), raised before anything starts or is written. Agents whose
work (messages and bytes at the calibrated CPU costs) takes more than
:data:`emulator.runs.dilation.CPU_FRACTION` of the cores in a step, like a
load beyond the capacity, are refused unless untrusted runs are allowed; so
are more MPI ranks than :data:`MAX_MPI_RANKS_PER_CORE` per core.

The same estimates size the confinement: :func:`agent_limit_bytes` is the
memory limit (``RLIMIT_DATA``) every agent runs under, so a runaway fails its
own run instead of waking the kernel's out-of-memory killer.

How memory is counted (an upper bound, measured on this machine,
docs/fidelity.md): an agent is :func:`emulator.model.schedule.buffers.rank_bytes` of
buffers plus :data:`AGENT_BASE_BYTES` (the Python process forked from the
launcher); a Mininet host :data:`HOST_BYTES`; a switch :data:`SWITCH_BYTES`;
the session (this process, the controller, the launcher)
:data:`SESSION_BYTES`. :data:`RESERVE_FRACTION` of the machine's memory (at
least :data:`RESERVE_MIN_BYTES`) is left to everything else.

Pure: the machine's figures are read at the edges (:func:`emulator.emulation.machine.system.memory_available`,
the calibration file) and passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from emulator.base.errors import FieldError, UserError
from emulator.model.fabric import FabricProfile
from emulator.model.prediction.check import CheckReport
from emulator.model.schedule.buffers import rank_bytes
from emulator.model.schedule.format import Schedule
from emulator.model.topology import Topology, switch_ports
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs.dilation import CPU_FRACTION, AgentsShare, Envelope, agents_share

MiB = 1 << 20
GiB = 1 << 30
#: An agent before its buffers: what the agent forked from the launcher's pre-imported Python and numpy holds of
#: its own (the pages it shares with the launcher count once). Measured as proportional set size (PSS) during
#: experiments/scale.yaml (docs/fidelity.md, 2026-12-03): 14.3 MiB per agent with 128 agents of 1 MiB, 25 MiB with
#: 256 (bigger schedules, more connections and threads); 64 MiB before, counted from each agent's whole RSS.
AGENT_BASE_BYTES = 32 * MiB
#: Virtual memory of one thread's stack (glibc's default, ``ulimit -s``); ``RLIMIT_DATA`` counts it.
THREAD_STACK_BYTES = 8 * MiB
#: One emulated host: its Mininet shell and mnexec.
HOST_BYTES = 8 * MiB
#: One switch in ovs-vswitchd (bridge, ports, flow tables; userspace datapath buffers).
SWITCH_BYTES = 8 * MiB
#: This process, the controller, the agent launcher, tcpdump.
SESSION_BYTES = 512 * MiB
#: An Open MPI rank before its program's data (Python, mpi4py, Open MPI's buffers) and its host's orted; with
#: the TCP transport's list of 8 eager fragments of 1 MiB (emu mpirun's eager limit,
#: emulator.runs.mpi_plan.TCP_EAGER_BYTES) and what it allocates more of under load.
MPI_RANK_BASE_BYTES = 192 * MiB
#: Threads an Open MPI rank may run (its own, Open MPI's progress and event threads), each a stack.
MPI_RANK_THREADS = 8
#: What an agent's memory limit allows beyond its estimate: allocator slack (glibc keeps freed temporaries in its
#: heap), the schedule's own objects. Measured with RLIMIT_DATA bisected, 8 ranks on a star, 16 MiB: the agent's
#: buffers peak at 0.92-1.14 x rank_bytes (allreduce ring and hd, broadcast dbtree, reduce_scatter, alltoall) and
#: 1.48 x for allgather (rank_bytes 58 MiB, peak 86 MiB). Before emulator.model.schedule.buffers filled them in
#: bounded batches
#: they peaked at up to 3.8 x (whole-segment int64 index arrays) and a 64 MiB ring's agents ran out of 747 MiB.
AGENT_LIMIT_SLACK = 1.5
AGENT_LIMIT_EXTRA_BYTES = 256 * MiB
#: Left to the rest of the machine: this share of its memory, at least RESERVE_MIN_BYTES.
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 1 * GiB
DEFAULT_MAX_TIME_S = 30 * 60.0
#: The longest a user may let a run take (``--max-time``, an experiment's ``max_time``, a repetition's timeout):
#: a week. No run of this emulator is planned longer (the largest experiment takes hours), so a longer bound is a
#: typo, and ``1e30`` would be no bound at all.
MAX_DURATION_S = 7 * 86400.0
#: Measured repetitions of one replay or cell (``--repeat``, ``repeat``): the statistics need a few, a thousand is
#: far past what any figure used, and every one costs the model's time again.
MAX_REPEAT = 1000
#: Unmeasured repetitions before them (``--warmup``, ``warmup``): one is the default; more than a hundred only waits.
MAX_WARMUP = 100
#: ECMP seeds (``--ecmp-seed``, ``ecmp_seeds``, a run's ``seeds``): 32 bits, as NumPy's and NCCL's; a seed names
#: cells and result folders (``ecmp-s<seed>``), so a hundred-digit one makes names no one can read.
MAX_SEED = (1 << 32) - 1
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
#: How the limits' messages write :data:`MAX_DURATION_S`.
MAX_DURATION_TEXT = f"at most {MAX_DURATION_S / 86400:g} days ({MAX_DURATION_S:g} s)"


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``30min`` or ``1.5h``; :class:`ValueError` unless > 0 and at most
    :data:`MAX_DURATION_S` (NaN, infinity and ``1e30`` included)."""
    body = text.strip().lower()
    factor = 1.0
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if body.endswith(unit):
            body, factor = body[: -len(unit)], _DURATION_UNITS[unit]
            break
    value = float(body) * factor
    if not 0 < value <= MAX_DURATION_S:
        raise ValueError(text)
    return value


#: Open MPI ranks per core (no model predicts an MPI program's load, so no calibrated rule applies to them):
#: what 64 agents on 2 cores ran trusted before the agents' costs were calibrated (docs/fidelity.md).
MAX_MPI_RANKS_PER_CORE = 32
#: Bring-up of a network: fixed cost plus per switch port, an upper bound of what was measured with static entries
#: (docs/fidelity.md, 2026-12-02 evening): 16 hosts, 64 ports: 1.6 s; 32 hosts, 96 ports: 2.7 s; 64 hosts, 256
#: ports: 6.2 s; fat-tree k=8, 768 ports: 22.7 s (61 s before bring-up was batched); 256 hosts, 1024 ports: 31.2 s.
BRINGUP_FIXED_S = 1.5
BRINGUP_PER_PORT_S = 0.03
#: Starting a session's agents and the probe of ``emu run`` (per network).
AGENT_START_S = 1.5
PROBE_S = 6.0


def format_bytes(n: float) -> str:
    """``1.5 GiB``, ``320 MiB``: memory as this module's messages write it."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def format_seconds(s: float) -> str:
    """``95 s``, ``12 min``, ``3.6 h``."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


# ------------------------------------------------------------------ estimates
def bringup_estimate_s(topo: Topology) -> float:
    """Wall seconds a network of ``topo`` takes to come up: a fixed cost plus one per switch port."""
    return BRINGUP_FIXED_S + BRINGUP_PER_PORT_S * 2 * len(topo.links)


def agent_threads(schedule: Schedule, rank: int) -> int:
    """Threads of ``rank``'s agent: its main thread, a sender and a receiver per connection, a compute worker."""
    ops = schedule.ranks[rank].ops
    sends = {(op.partner, op.lane) for op in ops if op.kind == "send"}
    receives = {(op.partner, op.lane) for op in ops if op.is_comm and op.kind != "send"}
    return 2 + len(sends) + len(receives) + any(op.kind == "compute" for op in ops)


def agent_bytes(schedule: Schedule, rank: int) -> int:
    """The resident memory ``rank``'s agent needs: its buffers and the process itself."""
    return rank_bytes(schedule, rank) + AGENT_BASE_BYTES


def agent_limit_bytes(schedule: Schedule, rank: int) -> int:
    """The ``RLIMIT_DATA`` ``rank``'s agent runs under: its estimate with slack, plus its threads' stacks."""
    return (math.ceil(agent_bytes(schedule, rank) * AGENT_LIMIT_SLACK) + AGENT_LIMIT_EXTRA_BYTES
            + agent_threads(schedule, rank) * THREAD_STACK_BYTES)


def mpi_program_bytes(program: Sequence[str]) -> int:
    """The data an MPI program holds per rank, where it is known: ``emu-allreduce-bench``'s three buffers of its
    largest size; 0 for any other program (or arguments the benchmark will refuse itself)."""
    opts = mpi_bench.program_options(program)
    return 3 * max(opts.sizes) if opts is not None else 0


def mpi_rank_limit_bytes(program_bytes: int, ranks: int, usable_bytes: int) -> int:
    """The ``RLIMIT_DATA`` of every process of an MPI run (mpirun, orted, the ranks): a known program's estimate
    with slack; for a program of unknown size, an equal share of the memory this machine can give."""
    if program_bytes:
        return (math.ceil((MPI_RANK_BASE_BYTES + program_bytes) * AGENT_LIMIT_SLACK) + AGENT_LIMIT_EXTRA_BYTES
                + MPI_RANK_THREADS * THREAD_STACK_BYTES)
    return max(MPI_RANK_BASE_BYTES + AGENT_LIMIT_EXTRA_BYTES, usable_bytes // max(ranks, 1))


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run holds in memory at its peak: its processes per rank, and the network and session around them."""

    ranks: int
    rank_bytes: int  # the largest rank's
    programs_bytes: int  # every rank's, summed
    network_bytes: int
    session_bytes: int = SESSION_BYTES
    what: str = "agents"  # what a rank's process is: "agents", "MPI ranks"

    @property
    def total_bytes(self) -> int:
        return self.programs_bytes + self.network_bytes + self.session_bytes

    def describe(self) -> str:
        if not self.ranks:
            return "the network and the session"
        return (f"{self.ranks} {self.what} up to {format_bytes(self.rank_bytes)} each, the network and the "
                "session")


def network_bytes(topo: Topology) -> int:
    return nodes_bytes(len(topo.hosts), len(topo.switches))


def nodes_bytes(hosts: int, switches: int) -> int:
    """What ``hosts`` hosts and ``switches`` switches of a network hold (their share on one server)."""
    return hosts * HOST_BYTES + switches * SWITCH_BYTES


def replay_memory(schedule: Schedule, topo: Topology) -> MemoryEstimate:
    """A replay of ``schedule`` on ``topo``: one agent per rank."""
    per_rank = [agent_bytes(schedule, r) for r in range(schedule.p)]
    return MemoryEstimate(ranks=schedule.p, rank_bytes=max(per_rank, default=0), programs_bytes=sum(per_rank),
                          network_bytes=network_bytes(topo))


def replay_memory_per_server(schedule: Schedule, topo: Topology, server_of: Mapping[str, str],
                             head: str) -> dict[str, MemoryEstimate]:
    """A replay spread over a cluster (``server_of``: every host and switch's server, e.g.
    :attr:`emulator.model.cluster_placement.Placement.of`): what each server holds. A rank's agent runs on its host's
    server, a node's share of the network on its own; the session (controller, results) on the ``head``."""
    servers = sorted({*server_of.values(), head})
    out = {}
    for server in servers:
        ranks = [r for r in range(schedule.p) if server_of[schedule.ranks[r].host] == server]
        per_rank = [agent_bytes(schedule, r) for r in ranks]
        hosts = sum(1 for h in topo.hosts if server_of[h.name] == server)
        switches = sum(1 for sw in topo.switches if server_of[sw.name] == server)
        out[server] = MemoryEstimate(ranks=len(ranks), rank_bytes=max(per_rank, default=0),
                                     programs_bytes=sum(per_rank),
                                     network_bytes=nodes_bytes(hosts, switches),
                                     session_bytes=SESSION_BYTES if server == head else 0)
    return out


def mpi_memory(ranks: int, program_bytes: int, topo: Topology) -> MemoryEstimate:
    """An MPI program of ``ranks`` ranks holding ``program_bytes`` of data each (0: unknown) on ``topo``."""
    per_rank = MPI_RANK_BASE_BYTES + program_bytes
    return MemoryEstimate(ranks=ranks, rank_bytes=per_rank, programs_bytes=ranks * per_rank,
                          network_bytes=network_bytes(topo), what="MPI ranks")


def mpi_memory_per_server(hosts: Sequence[str], program_bytes: int, topo: Topology, server_of: Mapping[str, str],
                          head: str) -> dict[str, MemoryEstimate]:
    """An MPI program whose rank R runs on ``hosts[R]``, spread over a cluster: what each server holds (its ranks,
    its nodes' share of the network; the session and mpirun on the ``head``)."""
    per_rank = MPI_RANK_BASE_BYTES + program_bytes
    out = {}
    for server in sorted({*server_of.values(), head}):
        ranks = sum(1 for h in hosts if server_of[h] == server)
        nodes = [n for n, s in server_of.items() if s == server]
        here = sum(1 for h in topo.hosts if h.name in nodes)
        out[server] = MemoryEstimate(ranks=ranks, rank_bytes=per_rank if ranks else 0, programs_bytes=ranks * per_rank,
                                     network_bytes=nodes_bytes(here, len(nodes) - here),
                                     session_bytes=SESSION_BYTES if server == head else 0, what="MPI ranks")
    return out


def buffers_over(schedule: Schedule, topo: Topology, machine: Machine) -> float | None:
    """How many times too large a replay of ``schedule``'s buffers are for ``machine`` (the factor its sizes must
    be divided by, what ``--scale`` divides), or None when the replay fits; infinity when not even empty buffers
    would."""
    est = replay_memory(schedule, topo)
    if est.total_bytes <= machine.usable_bytes:
        return None
    buffers = est.programs_bytes - est.ranks * AGENT_BASE_BYTES
    room = machine.usable_bytes - (est.total_bytes - buffers)
    return buffers / room if room > 0 else math.inf


def largest(estimates: Sequence[MemoryEstimate]) -> MemoryEstimate:
    """The peak of runs made one after another (one network at a time): the largest of them."""
    return max(estimates, key=lambda e: e.total_bytes)


def replay_time_s(report: CheckReport, repetitions: int) -> float:
    """The wall seconds of one replay on a network already up: its repetitions at the model's time, and its
    agents' start."""
    return repetitions * report.predicted_time_s + AGENT_START_S


# --------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Machine:
    """This machine's memory: available now, and all of it."""

    available_bytes: int
    total_bytes: int
    cores: int | None = None  # None: not checked

    @property
    def usable_bytes(self) -> int:
        """Available memory less what is left to the rest of the machine."""
        reserve = max(RESERVE_MIN_BYTES, int(self.total_bytes * RESERVE_FRACTION))
        return max(0, self.available_bytes - reserve)


@dataclass(frozen=True)
class Policy:
    """The user's limits: ``--max-time`` (seconds) and ``--allow-untrusted``."""

    max_time_s: float = DEFAULT_MAX_TIME_S
    allow_untrusted: bool = False


@dataclass(frozen=True)
class Load:
    """The model's busiest step against the datapath's calibrated capacity (at the run's MTU), the agents'
    busiest share of the CPU against what their calibrated costs allow, and the rates it was computed at (to
    say what would fit)."""

    peak_mbps: float  # switch-hop Mbit/s
    capacity_mbps: float | None  # at the network's switch ports; None: never calibrated at the run's MTU
    where: str  # which run or cell offers it
    link_mbps: float  # the emulated host link rate of that run
    profile: FabricProfile | None = None
    agents: AgentsShare | None = None  # None: not checked
    cpu_fraction: float = CPU_FRACTION

    @property
    def over(self) -> bool:
        return self.capacity_mbps is not None and self.peak_mbps > self.capacity_mbps

    @property
    def agents_over(self) -> bool:
        return self.agents is not None and self.agents.share > self.cpu_fraction


def load_of(report: CheckReport, env: Envelope, where: str, topo: Topology,
            profile: FabricProfile | None) -> Load:
    """A prediction's :class:`Load` on ``topo`` (its switch ports, its host links' rate) on a machine of envelope
    ``env``."""
    return Load(report.peak_load_mbps(), env.capacity_for(switch_ports(topo)), where, topo.host_bw, profile,
                agents_share([report], env.costs, env.cores), env.cpu_fraction)


@dataclass(frozen=True)
class Request:
    """One command's run, as admission sees it. ``time_s`` is None when nothing predicts it."""

    command: str  # "replay", "run", "mpirun", "bench"
    memory: MemoryEstimate
    time_s: float | None
    time_what: str  # how the time was predicted, e.g. "model 12.0 s x 4 repetitions + bring-up 8 s"
    loads: tuple[Load, ...] = ()
    time_hint: str = "raise --max-time, or use smaller sizes or fewer repetitions"
    memory_hint: str = "use smaller sizes or fewer ranks"


@dataclass(frozen=True)
class Verdict:
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]
    fits: str = ""  # what an admitted run takes (:func:`fits_line`)

    @property
    def lines(self) -> tuple[str, ...]:
        """What an admitted run prints: what it takes, then the warnings."""
        return ((self.fits,) if self.fits else ()) + self.warnings

    @property
    def admitted(self) -> bool:
        return not self.refusals


def fitting_rate(load: Load, ratio: float | None = None) -> str:
    """What would bring ``load`` within its capacity (or, given ``ratio``, scale its rate by that): the link
    rate, and the same fabric profile dilated to it.

    The busiest step's load is its bytes over its span; when every time of the
    span dilates with the rate, the load scales with the rate it was predicted
    at (``load.link_mbps``), so the rate that fits is that rate times the
    capacity over the refused peak, rounded down. The profile that gives it
    keeps every key of the run's own (its preset included: ``dilation=N``
    alone would name the default preset's fabric) and takes the dilation
    rounded up, so its links are no faster and its latencies dilate with
    them. A spec's ``bw`` keeps the latencies as they were: close, not exact.
    """
    if ratio is None:
        assert load.capacity_mbps is not None
        ratio = load.capacity_mbps / load.peak_mbps
    rate = load.link_mbps * ratio
    rate = math.floor(rate * 100) / 100  # rounded down: the rate printed must fit
    text = f"link rates of at most {rate:g} Mbit/s"
    if load.profile is not None and rate > 0:
        try:
            slower = load.profile.changed(dilation=math.ceil(load.profile.dilation_for(rate)))
        except FieldError:  # a rate no profile emulates (below fabric.MIN_LINK_MBPS)
            return text
        text += f" (--fabric {slower.short_spec()}, or bw={rate:g} in the topology spec)"
    return text


def memory_refusal(req: Request, machine: Machine) -> str | None:
    need = req.memory.total_bytes
    if need <= machine.usable_bytes:
        return None
    return (f"{req.command}: field 'memory': expected a run that fits the {format_bytes(machine.usable_bytes)} "
            f"this machine can give ({format_bytes(machine.available_bytes)} available, less a reserve), got "
            f"{format_bytes(need)} ({req.memory.describe()}): {req.memory_hint}")


def time_refusal(req: Request, policy: Policy) -> str | None:
    if req.time_s is None or req.time_s <= policy.max_time_s:
        return None
    return (f"{req.command}: field 'max-time': expected a run predicted within --max-time "
            f"{format_seconds(policy.max_time_s)}, got {format_seconds(req.time_s)} ({req.time_what}): "
            f"{req.time_hint}")


def capacity_lines(req: Request, policy: Policy) -> tuple[list[str], list[str]]:
    """Refusals and warnings for loads beyond the datapath's capacity (uncalibrated: a warning, not a refusal)."""
    warnings = []
    if any(ld.capacity_mbps is None for ld in req.loads):
        warnings.append(f"{req.command}: this machine has no datapath calibration at this MTU, so the load is not "
                        "checked before the run (`emu calibrate` measures it)")
    over = [ld for ld in req.loads if ld.over]
    if not over:
        return [], warnings
    worst = max(over, key=lambda ld: ld.peak_mbps)
    text = (f"the busiest step offers the switch datapath {worst.peak_mbps:.0f} switch-hop Mbit/s ({worst.where}"
            f"{f' and {len(over) - 1} more' if len(over) > 1 else ''}), above the datapath's capacity at its switch "
            f"ports {worst.capacity_mbps:.0f} (from this machine's calibrated capacity); it would fit at "
            f"{fitting_rate(worst)}")
    if policy.allow_untrusted:
        return [], warnings + [f"{req.command}: {text}; running anyway (--allow-untrusted): such repetitions are "
                               "flagged over_capacity and not trusted"]
    return [f"{req.command}: field 'load': expected a load within the datapath's capacity, got more: {text}; "
            "or pass --allow-untrusted"], warnings


def cpu_lines(req: Request, machine: Machine, policy: Policy) -> tuple[list[str], list[str]]:
    """A refusal (a warning with ``--allow-untrusted``) for agents whose work does not fit the CPU share their
    calibrated costs allow, or for more MPI ranks than :data:`MAX_MPI_RANKS_PER_CORE` per core."""
    text = None
    over = [ld for ld in req.loads if ld.agents_over]
    if over:
        worst = max(over, key=lambda ld: ld.agents.share if ld.agents else 0.0)
        assert worst.agents is not None
        text = (f"the agents' busiest step takes {worst.agents.share:.0%} of {machine.cores or '?'} cores "
                f"({worst.where}: {worst.agents.where}), above the {worst.cpu_fraction:.0%} their calibrated costs "
                f"are allowed; it would fit at {fitting_rate(worst, worst.cpu_fraction / worst.agents.share)}")
        field = "agents"
    elif (req.memory.what == "MPI ranks" and machine.cores is not None
          and req.memory.ranks > machine.cores * MAX_MPI_RANKS_PER_CORE):
        most = machine.cores * MAX_MPI_RANKS_PER_CORE
        text = (f"{req.memory.ranks} MPI ranks on {machine.cores} cores, where at most {most} ran trusted "
                f"({MAX_MPI_RANKS_PER_CORE} per core, docs/fidelity.md): their rounds would be paced by the CPU, "
                "not the fabric; use fewer hosts")
        field = "ranks"
    if text is None:
        return [], []
    if policy.allow_untrusted:
        return [], [f"{req.command}: {text}; running anyway (--allow-untrusted): expect cpu_saturated or "
                    "emulator_lag"]
    return [f"{req.command}: field '{field}': expected work this machine's CPU keeps up with, got more: {text}; "
            "or pass --allow-untrusted"], []


def verdict(req: Request, machine: Machine, policy: Policy) -> Verdict:
    refusals = [r for r in (memory_refusal(req, machine), time_refusal(req, policy)) if r is not None]
    over, warnings = capacity_lines(req, policy)
    busy, cpu_warnings = cpu_lines(req, machine, policy)
    return Verdict(tuple(refusals + over + busy), tuple(warnings + cpu_warnings))


def fits_line(req: Request, machine: Machine, policy: Policy) -> str:
    """What an admitted run takes of the machine, in one line."""
    parts = [f"memory {format_bytes(req.memory.total_bytes)} of {format_bytes(machine.usable_bytes)} usable"]
    if req.time_s is not None:
        parts.append(f"predicted {format_seconds(req.time_s)} of --max-time {format_seconds(policy.max_time_s)}")
    measured = [ld for ld in req.loads if ld.capacity_mbps]
    if measured:
        busiest = max(measured, key=lambda ld: ld.peak_mbps / (ld.capacity_mbps or 1.0))
        parts.append(f"busiest step {busiest.peak_mbps:.0f} of {busiest.capacity_mbps:.0f} switch-hop Mbit/s")
    return "admitted: " + "; ".join(parts)


def admit(req: Request, machine: Machine, policy: Policy, echo=print) -> Verdict:
    """Raise :class:`UserError` (one line: every refusal) when ``req`` does not fit; else echo what it takes and
    the warnings."""
    v = verdict(req, machine, policy)
    if v.refusals:
        raise UserError("; ".join(v.refusals))
    v = Verdict(v.refusals, v.warnings, fits_line(req, machine, policy))
    for line in v.lines:
        echo(f"# {line}")
    return v


# ------------------------------------------------------------------ requests
def replay_request(command: str, schedule: Schedule, topo: Topology, report: CheckReport, repetitions: int,
                   profile: FabricProfile | None, env: Envelope) -> Request:
    """One replay on its own network (``emu replay``): bring-up, then ``repetitions`` at the model's time."""
    bringup = bringup_estimate_s(topo)
    run_s = replay_time_s(report, repetitions)
    hint = ("generate it again with a larger --scale (emu schedule gen says which fits)" if "scale" in schedule.meta
            else "use smaller sizes or fewer ranks")
    return Request(command, replay_memory(schedule, topo), bringup + run_s,
                   f"the model's {report.predicted_time_s:.1f} s x {repetitions} repetitions, bring-up "
                   f"{bringup:.0f} s", (load_of(report, env, command, topo, profile),), memory_hint=hint)


def mpirun_request(ranks: int, program: Sequence[str], topo: Topology, timeout_s: float) -> Request:
    """``emu mpirun``: no model predicts the program, so its time is bounded by ``--timeout``; no load model."""
    bringup = bringup_estimate_s(topo)
    return Request("mpirun", mpi_memory(ranks, mpi_program_bytes(program), topo), bringup + timeout_s,
                   f"bring-up {bringup:.0f} s and --timeout {timeout_s:g} s: no model predicts an MPI program",
                   time_hint="lower --timeout or raise --max-time")


# ------------------------------------------------------------------- cluster
def largest_per_server(estimates: Sequence[Mapping[str, MemoryEstimate]]) -> dict[str, MemoryEstimate]:
    """Runs made one after another on a cluster (each a ``{server: estimate}``): each server's peak."""
    out: dict[str, MemoryEstimate] = {}
    for run in estimates:
        for server, est in run.items():
            if server not in out or est.total_bytes > out[server].total_bytes:
                out[server] = est
    return out


def cluster_memory_refusals(command: str, estimates: Mapping[str, MemoryEstimate],
                            machines: Mapping[str, Machine]) -> list[str]:
    """One refusal per server whose share of a run (``estimates``) does not fit its usable memory."""
    return [f"{command}: field 'memory': expected server {server}'s share to fit the "
            f"{format_bytes(machines[server].usable_bytes)} it can give ({format_bytes(machines[server].available_bytes)}"
            f" available, less a reserve), got {format_bytes(est.total_bytes)} ({est.describe()}): use more "
            "servers, or smaller sizes or fewer ranks"
            for server, est in estimates.items() if est.total_bytes > machines[server].usable_bytes]


def cluster_memory_line(estimates: Mapping[str, MemoryEstimate], machines: Mapping[str, Machine]) -> str:
    """What each server's share takes of its memory, in one line."""
    return "memory per server: " + ", ".join(
        f"{server} {format_bytes(est.total_bytes)} of {format_bytes(machines[server].usable_bytes)}"
        for server, est in sorted(estimates.items()))
