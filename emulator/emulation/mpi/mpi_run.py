"""``emu mpirun``: an Open MPI program over the emulated fabric, measured like a replay.

:func:`prepare` checks every input before anything starts (:mod:`emulator.runs.mpi_plan`
owns the checks and the command line). :func:`run` brings up the controller
and the network as a replay does (:class:`emulator.emulation.session.replay.ReplaySession`
without agents), writes the launch agent and the hostfile into the run's
folder, runs ``mpirun`` inside rank 0's host, echoes its output, and tears
everything down (every process left in the hosts' namespaces is killed with
the network). :func:`run_in_session` does the same on a session that is
already up and leaves it up (``emu run``'s MPI cells, on their network's
session). Files in the folder:

* ``results.json`` -- :class:`emulator.runs.mpi_results.MpiResults`, rewritten atomically
  when the run starts and when it ends (however it ends);
* ``mpirun.log`` -- mpirun's own output (every rank's lines, and Open MPI's
  messages); ``ranks/rank-R.stdout`` and ``ranks/rank-R.stderr`` -- each
  rank's output alone;
* ``hostfile``, ``launch-agent`` (and ``launch-agent.log``: every launch) --
  how Open MPI reached the hosts;
* ``links.jsonl`` -- the controller's port counters over the run, and tc's
  counters of every link interface and TCP retransmissions per host;
* ``bench.json`` -- the bundled benchmark's rows, when it ran;
* ``session/`` -- the controller's log and the topology (:func:`run` only).

Every process of the run (mpirun, the launch agent's ``mnexec``, every
``orted``, the ranks) inherits the memory limit mpirun starts under
(``RLIMIT_DATA`` by ``prlimit``, :mod:`emulator.emulation.machine.confinement`): the config's
``memory_limit_bytes``, or :func:`emulator.runs.admission.mpi_rank_limit_bytes`
of the program's estimate. A rank whose output says an allocation was
refused is named, with the limit, in one line (``results.error``).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from emulator.base.errors import FieldError, UserError
from emulator.base.files import append_jsonl
from emulator.emulation.cluster import remote_shell
from emulator.emulation.machine import calibration_file, confinement, system
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.session import fidelity
from emulator.emulation.session.replay import ReplaySession, on_cluster
from emulator.model import fabric, routing, topology
from emulator.model.latency import LatencyModel
from emulator.runs import admission, mpi_prediction
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs.cluster_file import ClusterRun
from emulator.runs.mpi_plan import (
    BENCH_JSON,
    HOST_SYSCTLS,
    HOST_SYSCTLS_AFTER,
    LATENCY_LIBRARY,
    PRLIMIT,
    START_ATTEMPTS,
    WHERE,
    MpiRunConfig,
    RemoteLaunch,
    check_latency_mca,
    daemon_start_failed,
    eager_bytes,
    fetch_output_command,
    has_latency,
    hostfile_text,
    latency_environment,
    latency_file_text,
    latency_holds,
    launch_agent_script,
    mca_settings,
    message_profile,
    mpirun_command,
    named,
    parse_mca,
    program_argv,
    queue_bytes,
    rank_hosts,
    require_rank0_on_head,
    resolve_program,
    split_fetched,
    yield_environment,
)
from emulator.runs.mpi_results import MpiResults, RankPlace

#: The run folder's files: Open MPI's launch agent, and the latency library's holds per pair of hosts.
LAUNCH_AGENT = "launch-agent"
LATENCY_HOLDS = "latency-holds"
#: After SIGTERM, how long mpirun gets to take its ranks down before SIGKILL.
STOP_GRACE_S = 10.0
#: How long after a rank says an allocation was refused the job is stopped: a Python rank that died of
#: MemoryError without ``-m mpi4py`` leaves the others waiting for it until --timeout.
OUT_OF_MEMORY_GRACE_S = 3.0


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` checked, before anything starts."""

    cfg: MpiRunConfig
    topo: topology.Topology
    profile: fabric.FabricProfile
    latency: LatencyModel
    hosts: list[str]  # per rank
    argv: list[str]  # what every rank runs
    mca: tuple[tuple[str, str], ...]
    calibration: Calibration | None
    library: str  # preloaded into every rank (sleeping yields; the latency when latency_on)
    latency_on: bool  # the library holds the ranks' messages for the fabric's latency
    memory_limit_bytes: int | None = None  # RLIMIT_DATA of every process of the run

    @property
    def out(self) -> str:
        return os.path.abspath(self.cfg.out)


def own_bin() -> str:
    """This emulator's scripts (the venv's bin): where the bundled programs are."""
    return os.path.dirname(sys.executable)


def latency_on(cfg: MpiRunConfig) -> bool:
    """Whether the ranks' messages get the profile's latency: the run asks for it and the profile has any."""
    return cfg.latency and has_latency(cfg.fabric)


def rank_library(prefix: str = sys.prefix) -> str:
    """The library every rank preloads, with or without latency: its waiting main thread sleeps instead of
    spinning in ``sched_yield()`` (:data:`~emulator.runs.mpi_plan.YIELD_SLEEP_US`); :class:`FieldError` when
    ``make setup`` has not built it."""
    path = os.path.join(prefix, "lib", LATENCY_LIBRARY)
    if not os.path.isfile(path):
        raise FieldError(WHERE, "latency", f"the ranks' library {path} (make setup builds it; every rank preloads "
                         "it, with or without latency)", "not built")
    return path


def prepare(cfg: MpiRunConfig) -> Prepared:
    """Every check that can fail on bad input; raises :class:`UserError` (one line) before anything starts."""
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise FieldError(WHERE, "seed", "an integer >= 0", cfg.seed)
    if isinstance(cfg.nice, bool) or not isinstance(cfg.nice, int) or not 0 <= cfg.nice <= 19:
        raise FieldError(WHERE, "nice", "an integer in 0..19", cfg.nice)
    if not cfg.timeout_s > 0:
        raise FieldError(WHERE, "timeout", "seconds > 0", cfg.timeout_s)
    mca = parse_mca(cfg.mca)
    resolved = resolve_program(cfg.program[0] if cfg.program else "", own_bin=own_bin())
    profile, topo = cfg.fabric, cfg.network.topology
    if topo.has_domain:
        raise FieldError(WHERE, "topology", "a spec without domain_bw (an MPI program's ranks of one server talk "
                         "through the server's switch; the interconnect is for replays)", topo.spec)
    routing.check_policy(topo, cfg.routing)
    hosts = rank_hosts(topo, cfg.placement, cfg.np, cfg.seed)
    if len(hosts) < 2:
        raise FieldError(WHERE, "np", "at least 2 ranks", len(hosts))
    if os.path.exists(os.path.join(cfg.out, "results.json")):
        raise FieldError(WHERE, "out", "a new or empty directory", f"{cfg.out} (it holds results.json)")
    limit = cfg.memory_limit_bytes
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise FieldError(WHERE, "memory_limit_bytes", "bytes > 0, or none to size it from the admission estimate",
                         limit)
    system.require_tools(["mpirun", "mnexec", PRLIMIT])
    calibration = calibration_file.load_calibration(profile.emulated_mtu)
    model = fidelity.latency_model(profile, calibration)
    out = os.path.abspath(cfg.out)
    if limit is None:
        limit = memory_limit_bytes(cfg.program, len(hosts))
    holds = latency_on(cfg)
    if holds:
        check_latency_mca(mca)
    return Prepared(cfg, topo, profile, model, hosts, program_argv(cfg.program, resolved, out), mca, calibration,
                    library=rank_library(), latency_on=holds, memory_limit_bytes=limit)


def memory_limit_bytes(program: Sequence[str], ranks: int,
                       memory: Callable[[], tuple[int, int]] = system.memory_available) -> int:
    """The ``RLIMIT_DATA`` of every process of a run of ``program`` on ``ranks`` ranks: the admission estimate
    (``memory()``: this machine's available and total bytes, for a program of unknown size)."""
    usable = admission.Machine(*memory()).usable_bytes
    return admission.mpi_rank_limit_bytes(admission.mpi_program_bytes(program), ranks, usable)


def run(prep: Prepared, echo: Callable[[str], None] = print, cluster: ClusterRun | None = None) -> MpiResults:
    """Bring up (over ``cluster``'s servers when given: :func:`check_cluster` first), run the program once, tear
    down; return (and write) the results.

    Raises :class:`KeyboardInterrupt` after recording an interrupted run; a
    program that fails is a result (``status`` failed, its ``exit_status``).
    """
    cfg = prep.cfg
    results, results_path = _begin(prep, cfg.to_json())
    factory = on_cluster(cluster) if cluster is not None else ReplaySession
    with factory(prep.topo, cfg.routing, seed=cfg.seed, datapath=cfg.datapath, latency=prep.latency,
                 work_dir=os.path.join(prep.out, "session"), echo=echo, agents=False) as session:
        _run_started(prep, session, results, results_path, echo)
    return results


def run_in_session(prep: Prepared, session: ReplaySession, echo: Callable[[str], None] = print,
                   config: dict | None = None) -> MpiResults:
    """Run the program once on a session that is already up (``emu run``: an MPI cell on its network's
    session, which may have agents and earlier cells' replays); return (and write) the results.

    The session must be of the same topology (host names) as ``prep``'s; it stays up. ``config`` is added
    to the results' ``config`` (``emu run`` adds the cell). The folder gets every file :func:`run` writes
    but ``session/`` (the session's own folder is elsewhere), and ``learned_connections`` counts the
    connections the controller learned during this run only. Raises :class:`KeyboardInterrupt` after
    recording an interrupted run, as :func:`run` does.
    """
    if session.cluster is not None and session.placement is not None:
        require_rank0_on_head(prep.hosts, session.placement.of, session.cluster.head)
    results, results_path = _begin(prep, {**prep.cfg.to_json(), **(config or {})})
    _run_started(prep, session, results, results_path, echo)
    return results


def _begin(prep: Prepared, config: dict) -> tuple[MpiResults, str]:
    """The folder and its first ``results.json`` (status running), before the network is up (or used)."""
    topo, out = prep.topo, prep.out
    os.makedirs(os.path.join(out, "ranks"), exist_ok=True)
    results = MpiResults(config=config, ranks=[RankPlace(r, h, topo.host(h).ip) for r, h in enumerate(prep.hosts)],
                         command=[], link_mbps=topo.host_bw, fabric=prep.profile.to_json(),
                         memory_limit_bytes=prep.memory_limit_bytes)
    results_path = os.path.join(out, "results.json")
    results.save(results_path)
    return results, results_path


def _run_started(prep: Prepared, session: ReplaySession, results: MpiResults, results_path: str,
                 echo: Callable[[str], None]) -> None:
    """Run mpirun once on the started ``session``; ``results`` hold everything when this returns or raises."""
    cfg, topo, out = prep.cfg, prep.topo, prep.out
    results.datapath, results.bringup_s = session.en.datapath, session.bringup_s
    results.config.update(session.cluster_config())
    command = _write_launch_files(prep, session)
    results.command = command
    results.save(results_path)
    remote_outputs = _remote_output_folders(prep, session)
    learned_before = session.ctl.status().get("learned_total")
    connections_at = session.ctl.connections_offset()
    offset = session.stats_offset()
    before = fidelity.snapshot(session.en, topo)
    t0 = time.monotonic()
    try:
        session.en.set_sysctls(prep.hosts, HOST_SYSCTLS)
        results.exit_status, timed_out = _start_mpirun(session, prep.hosts[0], command, out, cfg.timeout_s, echo)
        results.status = "timeout" if timed_out else ("ok" if results.exit_status == 0 else "failed")
        if timed_out:
            results.error = f"the program ran past --timeout {cfg.timeout_s:g} s and was stopped"
    except KeyboardInterrupt:
        results.status, results.error = "interrupted", "interrupted"
        raise
    except OSError as exc:
        results.status, results.error = "failed", f"mpirun could not start: {exc}"
    except UserError as exc:  # the hosts' settings could not be made
        results.status, results.error = "failed", str(exc)
    finally:
        results.wall_s = time.monotonic() - t0
        after = fidelity.snapshot(session.en, topo)
        results.fidelity = fidelity.assess(before, after, results.wall_s,
                                           fidelity.switch_egress_bytes(before, after), prep.calibration)
        for rec in fidelity.link_records(before, after, 0):
            append_jsonl(os.path.join(out, "links.jsonl"), rec)
        session.copy_port_stats(offset, os.path.join(out, "links.jsonl"))
        _fetch_remote_outputs(remote_outputs, out, echo)
        ran_out = out_of_memory_ranks(os.path.join(out, "ranks"), collect_rank_output(os.path.join(out, "ranks")))
        results.out_of_memory = sorted(ran_out)
        line = (confinement.mpi_rank_ran_out(ran_out.items(), prep.memory_limit_bytes)
                or _open_mpi_ran_out(os.path.join(out, "mpirun.log"), prep.memory_limit_bytes))
        if line is not None and results.status != "ok":
            results.error = line
            echo(f"# {line}")
        _restore_sysctls(session, prep.hosts, echo)
        results.bench = _bench_rows(out)
        predictions = _predict(prep, results.bench, session.ctl.learned_connections(connections_at))
        results.predictions = [p.to_json() for p in predictions]
        for p in predictions:
            echo("# " + mpi_prediction.describe(p))
        learned = session.ctl.status().get("learned_total")
        # the controller's count is over the network's life: an earlier run on the same session learned its own
        results.learned_connections = (learned - learned_before if isinstance(learned, int)
                                       and isinstance(learned_before, int) else learned)
        results.save(results_path)


def _restore_sysctls(session: ReplaySession, hosts: Sequence[str], echo: Callable[[str], None]) -> None:
    """The hosts' settings back to what they were before the run (a session may replay after it)."""
    try:
        session.en.set_sysctls(hosts, HOST_SYSCTLS_AFTER)
    except UserError as exc:
        echo(f"# warning: {exc}")


def _predict(prep: Prepared, rows: Sequence[dict], connections: Sequence[tuple[str, str, int, int]]
             ) -> list[mpi_prediction.MpiPrediction]:
    """The benchmark's rows beside the timing model, on the run's fabric with its connections' ports."""
    flow_of = (mpi_prediction.btl_flow_function(connections, prep.topo, prep.cfg.routing, prep.cfg.seed)
               if routing.hashes_five_tuples(prep.cfg.routing) else None)
    profile = message_profile(prep.profile, prep.latency_on)
    latency = replace(fidelity.latency_model(profile, prep.calibration), eager_bytes=eager_bytes(prep.mca))
    given = mpi_prediction.PredictionInput(prep.topo, prep.cfg.routing, prep.cfg.seed, tuple(prep.hosts), latency,
                                           prep.profile.emulated_mtu, flow_of)
    return mpi_prediction.predict_bench(prep.cfg.program, dict(prep.mca), rows, given)


def check_cluster(prep: Prepared, cluster: ClusterRun) -> None:
    """:class:`UserError` unless rank 0's host runs on the head (mpirun runs there, in it)."""
    require_rank0_on_head(prep.hosts, cluster.placement(prep.topo).of, cluster.cluster.head)


def _remote_launches(prep: Prepared, session: ReplaySession) -> dict[str, RemoteLaunch]:
    """On a cluster: how the launch agent reaches each host on another server (by the host's IP)."""
    cluster, placed = session.cluster, session.placement
    if cluster is None or placed is None:
        return {}
    out = {}
    for h in prep.topo.hosts:
        server = cluster.server(placed.of[h.name])
        if server.name != cluster.head:
            out[h.ip] = RemoteLaunch(os.getpid(), tuple(remote_shell.ssh_prefix(server, cluster.known_hosts)),
                                     prep.memory_limit_bytes, server.user != "root")
    return out


def _remote_output_folders(prep: Prepared, session: ReplaySession) -> list[tuple[str, system.Runner]]:
    """On a cluster, the run's folder on every other server with ranks, where Open MPI writes their output and
    starts them (its working directory): the head's own where the servers share it (a mark the head writes is
    there), else made now with the launch agent in it, and returned (server, runner) to be copied back and
    removed afterwards."""
    cluster, placed = session.cluster, session.placement
    if cluster is None or placed is None:
        return []
    out = prep.out
    mark = os.path.join(out, f".ef-here-{os.getpid()}")
    open(mark, "w").close()
    made = []
    try:
        for name in sorted({placed.of[h] for h in prep.hosts} - {cluster.head}):
            runner = remote_shell.remote_runner(cluster, cluster.server(name))
            q = shlex.quote
            res = runner(["sh", "-c", f"if [ -e {q(mark)} ]; then echo shared; elif [ -e {q(out)} ]; then echo "
                          f"exists; else mkdir -p {q(os.path.join(out, 'ranks'))} && echo made; fi"])
            state = res.stdout.strip()
            if state == "exists":
                raise UserError(f"mpirun: server {name} already has {out} (not this run's): choose another --out")
            if state not in ("shared", "made"):
                raise UserError(f"mpirun: server {name}: cannot make {out} there: {res.stderr.strip()[-200:]}")
            if state == "made":
                made.append((name, runner))
                _copy_file(runner, name, os.path.join(out, LAUNCH_AGENT), "the launch agent")
                if prep.latency_on:
                    _copy_file(runner, name, os.path.join(out, LATENCY_HOLDS), "the latency file")
    finally:
        os.unlink(mark)
    return made


def _copy_file(runner: system.Runner, server: str, path: str, what: str) -> None:
    """A file of the run's folder at its path on ``server`` too: every orted checks that the ``plm_rsh_agent``
    it is given exists, though only mpirun's runs it (no tree spawn); the latency library reads its file in
    every rank."""
    with open(path, encoding="ascii") as fh:
        text = fh.read()
    res = runner(["sh", "-c", 'printf %s "$1" > "$2" && chmod 700 "$2"', "sh", text, path])
    if res.returncode != 0:
        raise UserError(f"mpirun: server {server}: cannot write {what} there: {res.stderr.strip()[-200:]}")


def _fetch_remote_outputs(folders: Sequence[tuple[str, system.Runner]], out: str, echo: Callable[[str], None]) -> None:
    """Every rank's output from the other servers' copies of the run's folder, into the head's; then remove them."""
    ranks = os.path.join(out, "ranks")
    for name, runner in folders:
        res = runner(fetch_output_command(ranks))
        for path, text in split_fetched(res.stdout).items():
            local = os.path.join(ranks, path)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "w", encoding="utf-8") as fh:
                fh.write(text)
        if runner(["rm", "-rf", "--", out]).returncode != 0:
            echo(f"# warning: server {name}: could not remove its copy of {out}")


def _write_launch_files(prep: Prepared, session: ReplaySession) -> list[str]:
    """The launch agent and the hostfile in the run's folder; the mpirun command line that uses them."""
    out, topo = prep.out, prep.topo
    agent = os.path.join(out, LAUNCH_AGENT)
    pids = [(h.ip, session.en.host(h.name).pid) for h in topo.hosts]
    with open(agent, "w", encoding="ascii") as fh:
        fh.write(launch_agent_script(pids, os.path.join(out, "launch-agent.log"), _remote_launches(prep, session)))
    os.chmod(agent, 0o700)  # root runs it; nobody else needs to
    hostfile = os.path.join(out, "hostfile")
    with open(hostfile, "w", encoding="ascii") as fh:
        fh.write(hostfile_text([topo.host(h).ip for h in prep.hosts]))
    if prep.latency_on:
        holds = os.path.join(out, LATENCY_HOLDS)
        mtu = prep.profile.emulated_mtu
        pairs = latency_holds(topo, prep.hosts, prep.latency, prep.cfg.routing, prep.cfg.seed, mtu)
        with open(holds, "w", encoding="ascii") as fh:
            fh.write(latency_file_text(pairs))
        environment = latency_environment(prep.library, holds, queue_bytes(pairs, topo.host_bw, mtu))
    else:
        environment = yield_environment(prep.library)
    mca = mca_settings(prep.mca, agent)
    return mpirun_command(len(prep.hosts), hostfile, mca, prep.argv, os.path.join(out, "ranks"), prep.cfg.nice,
                          memory_limit_bytes=prep.memory_limit_bytes, environment=environment)


def _start_mpirun(session: ReplaySession, host: str, command: list[str], out: str, timeout_s: float,
                  echo: Callable[[str], None]) -> tuple[int, bool]:
    """:func:`_run_mpirun`, started again (up to :data:`START_ATTEMPTS` times) while Open MPI's daemons die
    before any rank ran; each attempt's output is in mpirun.log."""
    log_path = os.path.join(out, "mpirun.log")
    open(log_path, "w").close()
    for attempt in range(1, START_ATTEMPTS + 1):
        offset = os.path.getsize(log_path)
        status, timed_out = _run_mpirun(session, host, command, out, timeout_s, echo)
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            fh.seek(offset)
            text = fh.read()
        started = bool(glob.glob(os.path.join(out, "ranks", "*", "rank.*")))
        if status == 0 or timed_out or attempt == START_ATTEMPTS or not daemon_start_failed(text, started):
            return status, timed_out
        echo(f"# Open MPI's daemons failed to start (no rank ran): starting again, attempt {attempt + 1} of "
             f"{START_ATTEMPTS}")
        shutil.rmtree(os.path.join(out, "ranks"), ignore_errors=True)
        os.makedirs(os.path.join(out, "ranks"), exist_ok=True)
    raise AssertionError("not reached")


def _run_mpirun(session: ReplaySession, host: str, command: list[str], out: str, timeout_s: float,
                echo: Callable[[str], None]) -> tuple[int, bool]:
    """Run ``command`` inside ``host``; echo and log its output. Returns (exit status, whether it timed out)."""
    # Python ranks write through to mpirun, so their lines show as they come
    env = dict(os.environ, PATH=f"{own_bin()}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    pid, ip = session.en.host(host).pid, session.topo.host(host).ip
    timed_out = threading.Event()
    with open(os.path.join(out, "mpirun.log"), "a", encoding="utf-8") as log:
        proc = subprocess.Popen(["mnexec", "-a", str(pid), *named(ip, command)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=out, env=env, text=True,
                                errors="replace", start_new_session=True)
        session.en.state.record_process("mpirun", proc.pid)

        def stop() -> None:
            timed_out.set()
            _stop_group(proc)

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        out_of_memory: threading.Timer | None = None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                echo(line.rstrip("\n"))
                if out_of_memory is None and confinement.memory_failure_in(line):
                    out_of_memory = threading.Timer(OUT_OF_MEMORY_GRACE_S, _stop_group, args=(proc,))
                    out_of_memory.daemon = True
                    out_of_memory.start()
            status = proc.wait()
        except BaseException:
            _stop_group(proc)
            raise
        finally:
            timer.cancel()
            if out_of_memory is not None:
                out_of_memory.cancel()
    return status, timed_out.is_set()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM mpirun's process group (it takes its ranks down), SIGKILL after :data:`STOP_GRACE_S`.

    The group is signalled even when mpirun itself has exited: its daemons (orted, attached to their launch
    agents in mpirun's group) can outlive it and keep its output pipe open, and the reader would wait on that
    pipe for ever (seen in ``make soak``, 2026-12-06: a 60 s timeout that never ended the run).
    """
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            proc.poll()
            return
        if _group_ended(proc, wait_s):
            return


def _group_ended(proc: subprocess.Popen, wait_s: float) -> bool:
    """Whether every process of mpirun's group has ended within ``wait_s`` (mpirun is reaped on the way)."""
    deadline = time.monotonic() + wait_s
    while True:
        proc.poll()
        if not _live_members(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _live_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that still run: zombies left out (a daemon whose parent is gone waits for a
    reaper that may be slow, or absent where PID 1 reaps nothing; it holds no pipe any more)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def collect_rank_output(ranks_dir: str) -> list[int]:
    """Open MPI's ``<dir>/<job>/rank.R/{stdout,stderr}`` as ``<dir>/rank-R.stdout`` and ``.stderr``; the ranks."""
    found = []
    for rank_dir in sorted(glob.glob(os.path.join(ranks_dir, "*", "rank.*"))):
        rank = rank_dir.rsplit(".", 1)[1]
        if not rank.isdigit():
            continue
        for stream in ("stdout", "stderr"):
            src = os.path.join(rank_dir, stream)
            if os.path.exists(src):
                os.replace(src, os.path.join(ranks_dir, f"rank-{rank}.{stream}"))
        found.append(int(rank))
    for job_dir in glob.glob(os.path.join(ranks_dir, "*", "")):
        shutil.rmtree(job_dir, ignore_errors=True)
    return sorted(found)


def out_of_memory_ranks(ranks_dir: str, ranks: Sequence[int]) -> dict[int, str]:
    """The ranks whose ``rank-R.stderr`` says an allocation was refused, with that line."""
    found = {}
    for rank in ranks:
        try:
            with open(os.path.join(ranks_dir, f"rank-{rank}.stderr"), encoding="utf-8", errors="replace") as fh:
                line = confinement.memory_failure_in(fh.read())
        except OSError:
            continue
        if line is not None:
            found[rank] = line
    return found


def _open_mpi_ran_out(log_path: str, limit_bytes: int | None) -> str | None:
    """When no rank's output says so but mpirun's does: Open MPI itself (mpirun, an orted) ran out."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            line = confinement.memory_failure_in(fh.read())
    except OSError:
        return None
    if line is None:
        return None
    return (f"mpirun: Open MPI (mpirun or an orted) ran out of its memory limit {confinement.describe_limit(limit_bytes)}"
            f" (RLIMIT_DATA, from the admission estimate): {line!r} in mpirun.log")


def _bench_rows(out: str) -> list[dict]:
    path = os.path.join(out, BENCH_JSON)
    if not os.path.exists(path):
        return []
    try:
        return [row.to_json() for row in mpi_bench.load_rows(path)]
    except (UserError, ValueError, KeyError, TypeError):
        return []
