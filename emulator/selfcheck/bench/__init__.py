"""``emu bench`` (``make bench``): the emulator's fidelity and performance ratios, measured in one run.

A benchmark, not a test: it prints every ratio next to its target with PASS or
MISS, writes ``results/bench-<timestamp>.json`` (atomically, after every
section, so a failure keeps what was measured) and returns 0 even on a miss.
Everything runs on one fabric profile (``--fabric``, default
:data:`emulator.model.fabric.DEFAULT_PRESET`): its emulated link rate, MTU and
latencies, with this machine's calibration at that MTU, made first (about a
minute) when there is none.

Sections, in order:

1. **agents / iperf3** on one link: :func:`emulator.selfcheck.live.calibration.measure_agents_vs_iperf`
   (target >= :data:`~cases.TARGET_AGENT`); then with every flow at once
   (:func:`~emulator.selfcheck.live.calibration.measure_agents_aggregate`: a 16-host ring on one switch, each
   link at the calibrated datapath capacity shared out, against iperf3 on the ring's hops; target >=
   :data:`~cases.TARGET_AGENT_AGGREGATE`): how much of what the machine carries the agents carry.
2. **replays**: every algorithm of :data:`~cases.DEFAULT_CASES` on its fabric, one
   :class:`~emulator.emulation.session.replay.ReplaySession` per (topology, routing, seed), at
   every size of :data:`~cases.DEFAULT_SIZES` (latency-bound to bandwidth-bound):
   measured / predicted time of each row (target: at least
   :data:`~cases.TARGET_WITHIN_SHARE` of the rows within +-:data:`~cases.TARGET_PREDICTION`,
   none beyond +-:data:`~cases.TARGET_WORST`). Each row carries replay's fidelity
   flags. From the same rows: busbw / link rate of ``hdrm`` on BiGraph 4/4/2
   at the largest size (target >= :data:`~cases.TARGET_HDRM`), and the
   **crossovers** of :data:`~cases.CROSSOVERS` (the size below which an algorithm
   beats ring), measured and predicted (target: within a factor
   :data:`~cases.TARGET_CROSSOVER_FACTOR`; the predicted one from the model alone
   over sizes 16 KiB-256 MiB, :func:`~crossovers.crossover`).
3. **Open MPI beside the agents** (:func:`~mpi_pairs.run_mpi_pairs`): on each
   network of :data:`~cases.MPI_FABRICS` (16 ranks on BiGraph with hdrm, 8 on a
   leaf-spine with ECMP), at :data:`~cases.MPI_SIZE`, each pair of :data:`~cases.MPI_PAIRS` -- Open MPI's allreduce
   algorithm run by ``emu mpirun`` with the bundled ``emu-allreduce-bench``,
   and our agents' replay of the matching schedule -- on the same link rate,
   both without the profile's latencies (Open MPI's messages cannot get
   them): MPI busbw / agents' busbw (target >= :data:`~cases.TARGET_MPI`), with both
   runs' fidelity.
4. **NCCL's all-reduce as packets** (:func:`~emulator.selfcheck.live.bench_nccl_packets.run_nccl_packets`,
   left out with ``--no-nccl``): on 2 x 1, 2 x 8 and 4 x 8 H100 servers with one 400G NIC per GPU
   (:data:`~cases.NCCL_PACKET_CLUSTERS`), at 8 KiB, 1 MiB and 64 MiB, NCCL's own choice replayed as
   ``emu nccl-tests --packets`` replays it, its rate auto per size: packets / NCCL's model (target: every row
   run within +-:data:`~cases.TARGET_NCCL_PACKETS` and trusted; a size NCCL runs as NVLS tree does not run as
   packets and is unchecked). Admitted at the start of the section under the command's ``--max-time`` and
   ``--allow-untrusted``.
5. **bring-up** of 32 hosts (:data:`~cases.BRINGUP_TOPOLOGY`): :class:`EmulatedNetwork`
   start and stop against plain Mininet (:func:`~plain_mininet.plain_mininet_bringup`: the
   same hosts, switches and ``TCLink`` links, ``OVSSwitch`` on the same
   datapath, no controller, none of our host set-up), alternated; then once each at 64 and
   256 hosts (:data:`~cases.SCALE_BRINGUP_TOPOLOGIES`), with the seconds per host.

``--bw`` sets the emulated link rate instead of the profile's (the dilation
follows). Emulated figures are reported with what they stand for on the real
fabric.

Modules (each imports only those before it):

* :mod:`~emulator.selfcheck.bench.cases` -- what is measured and the targets;
* :mod:`~emulator.selfcheck.bench.rows` -- the typed rows and their JSON;
* :mod:`~emulator.selfcheck.bench.crossovers` -- crossovers, measured and from the model;
* :mod:`~emulator.selfcheck.bench.results` -- the whole run's results and its JSON document;
* :mod:`~emulator.selfcheck.bench.report` -- the printed table;
* :mod:`~emulator.selfcheck.bench.request` -- the profile and the admission request, before the run;
* live, in :mod:`emulator.selfcheck.live`: :mod:`~emulator.selfcheck.live.bench_replays`,
  :mod:`~emulator.selfcheck.live.bench_mpi_pairs`,
  :mod:`~emulator.selfcheck.live.plain_mininet` (the only one that imports Mininet),
  :mod:`~emulator.selfcheck.live.bench_nccl_packets`, :mod:`~emulator.selfcheck.live.bench_bringup`, and
  :mod:`~emulator.selfcheck.live.bench_run`, which runs the sections.
"""

from emulator.selfcheck.bench.cases import DEFAULT_SIZES, Size
from emulator.selfcheck.bench.report import format_report
from emulator.selfcheck.bench.request import admission_request, bench_profile

__all__ = ["DEFAULT_SIZES", "Size", "admission_request", "bench_profile", "format_report"]
