"""The agents of one replay: one per rank inside its host, reached over one control socket.

:meth:`Fleet.start` opens the control socket (:class:`emulator.emulation.agents.agent_protocol.ControlServer`)
and spawns one :mod:`emulator.emulation.agents.agent` per rank of the schedule through the
session's launcher (anything with :meth:`Spawner.spawn`, normally
:class:`emulator.emulation.agents.agent_launcher.AgentLauncher`), with the arguments of
:class:`AgentFiles`. The fleet then runs the barrier of the protocol
(:mod:`emulator.emulation.agents.agent_protocol`):

* :meth:`Fleet.wait_for` waits for one message kind from every rank, and
  raises :class:`ReplayFailed` naming the rank when an agent reports an
  error, exits, closes its connection or does not answer in time;
  :meth:`Fleet.wait_done` reads the ``done`` messages into
  :class:`RankReport` objects;
* :meth:`Fleet.go` starts a repetition on every rank, :meth:`Fleet.quit`
  ends the agents, :meth:`Fleet.kill` kills one (a fault);
* :meth:`Fleet.close` reaps every agent (killing those that do not exit
  within a grace period), closes the socket and removes its file.

Every agent runs under its memory limit (``memory_limits``, rank -> bytes of
``RLIMIT_DATA``, passed to the spawner); an agent that runs out of it
(:mod:`emulator.emulation.machine.confinement`: its ``error`` says ``out_of_memory``, or it
exits with :data:`~emulator.emulation.machine.confinement.OUT_OF_MEMORY_STATUS`) fails the
run with a message naming the rank and the limit.

The fleet knows nothing of networks: what it needs from them (a host's
namespace pid, recording a spawned process) comes in as parameters, so it is
tested with fake agents that speak the protocol over a real Unix socket.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from emulator.emulation.agents.agent_protocol import ControlError, ControlServer, Msg
from emulator.emulation.machine import confinement
from emulator.model.schedule import format as sformat
from emulator.model.schedule.format import Schedule

#: How long agents have to connect to their peers and say ``ready``.
READY_TIMEOUT_S = 60.0
#: How long :meth:`Fleet.quit` gives the agents to exit by themselves.
QUIT_GRACE_S = 5.0
#: How long :meth:`Fleet.close` gives the agents before it kills them.
CLOSE_GRACE_S = 0.5
POLL_S = 0.2
#: How often :meth:`Fleet.wait_for` asks its ``health`` check (a cluster's servers still there).
HEALTH_INTERVAL_S = 2.0
#: How long an agent whose connection closed gets to end its process, so that its exit status (its memory
#: limit's, say) names the cause; a loaded machine took longer than one poll (a flaky unit test, seen once).
EXIT_GRACE_S = 2.0


class ReplayFailed(Exception):
    """The run failed (an agent died, hung or computed wrong data); the message names the rank."""

    exit_status = 1


class Process(Protocol):
    """A spawned agent: the parts of :class:`subprocess.Popen` the fleet uses."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Spawner(Protocol):
    """Starts one agent in a host's namespaces under ``RLIMIT_DATA`` ``memory_limit`` bytes (None: none)."""

    def spawn(self, netns_pid: int, argv: Sequence[str], output: str,
              memory_limit: int | None = None) -> Process: ...


class Control(Protocol):
    """The orchestrator's end of the control socket
    (:class:`emulator.emulation.agents.agent_protocol.ControlServer`)."""

    path: str
    address: str  # where agents connect: the Unix socket's path, or tcp:IP:PORT

    def poll(self, timeout: float) -> list[dict[str, Any]]: ...

    def send_all(self, kind: Msg, per_rank: Mapping[int, Mapping[str, Any]] | None = None,
                 **fields: Any) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class AgentFiles:
    """What every agent of a run reads and where it writes (absolute paths: agents run elsewhere)."""

    schedule: str
    topology: str
    latency: str  # the latency plan (emulator.emulation.agents.agent.latency_plan)
    logs: str  # the folder of rank-R.log and rank-R.stderr
    #: the folder of the servers' interconnect sockets (emulator.emulation.agents.interconnect)
    domain: str | None = None

    def argv(self, rank: int, control: str) -> list[str]:
        """The agent's command line (:func:`emulator.emulation.agents.agent.main`)."""
        return ["--schedule", self.schedule_of(rank), "--topology", self.topology, "--rank", str(rank),
                "--control", control, "--log", os.path.join(self.logs, f"rank-{rank}.log"), "--latency",
                self.latency, *(["--domain", self.domain] if self.domain is not None else [])]

    def write_schedule(self, schedule: Schedule) -> None:
        """The whole schedule (for the record) and every rank's view of it (what its agent reads)."""
        sformat.save(schedule, self.schedule)
        for prog in schedule.ranks:
            sformat.save(sformat.rank_view(schedule, prog.rank), self.schedule_of(prog.rank))

    def schedule_of(self, rank: int) -> str:
        """Rank ``rank``'s view of the schedule (its own operations only: :func:`emulator.model.schedule.format.rank_view`),
        which its agent reads instead of the whole schedule."""
        return os.path.join(self.logs, f"rank-{rank}.schedule.json")

    def stderr(self, rank: int) -> str:
        return os.path.join(self.logs, f"rank-{rank}.stderr")


@dataclass(frozen=True)
class RankReport:
    """One rank's ``done`` message: when its operations ran, its sends' details, and whether its data is right."""

    rank: int
    ops: dict[int, tuple[float, float]]  # op id -> (start, end)
    sends: dict[int, list[float]]  # send op id -> [posted, cts_at, sent, late_s]
    correct: bool
    wrong: str | None = None  # what was wrong, when not correct
    arrivals: dict[int, float] = field(default_factory=dict)  # receive op id -> its last byte reached the host
    cpu_s: float | None = None  # the agent process's CPU seconds in the repetition

    def shifted(self, offset: float) -> RankReport:
        """The same report with every time moved by ``-offset`` (from the agent's clock to the head's, when the
        agent's clock is ``offset`` seconds ahead)."""
        if offset == 0:
            return self
        return RankReport(rank=self.rank, ops={i: (s - offset, e - offset) for i, (s, e) in self.ops.items()},
                          sends={i: [*(t - offset for t in v[:3]), *v[3:]] for i, v in self.sends.items()},
                          correct=self.correct, wrong=self.wrong,
                          arrivals={i: t - offset for i, t in self.arrivals.items()}, cpu_s=self.cpu_s)

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> RankReport:
        return cls(rank=int(msg["rank"]), ops={int(i): (float(s), float(e)) for i, s, e in msg["ops"]},
                   sends={int(i): list(v) for i, v in (msg.get("sends") or {}).items()},
                   correct=bool(msg["correct"]), wrong=msg.get("wrong"),
                   arrivals={int(i): float(t) for i, t in (msg.get("arrivals") or {}).items()},
                   cpu_s=float(msg["cpu_s"]) if msg.get("cpu_s") is not None else None)


class Fleet:
    """The agents of one run (``agents``: rank -> process) and the control socket they are connected to."""

    def __init__(self, control: Control, agents: Mapping[int, Process] | None = None,
                 clock: Callable[[], float] = time.monotonic, memory_limits: Mapping[int, int] | None = None):
        self.control = control
        self.agents: dict[int, Process] = dict(agents or {})
        self.clock = clock
        self.memory_limits: dict[int, int] = dict(memory_limits or {})  # rank -> RLIMIT_DATA bytes
        #: rank -> how far its agent's monotonic clock is ahead of this process's (another server's clock)
        self.clock_offsets: dict[int, float] = {}
        #: called every HEALTH_INTERVAL_S while waiting: a line saying what was lost (a server), or None
        self.health: Callable[[], str | None] | None = None

    @classmethod
    def start(cls, socket_path: str, hosts: Mapping[int, int], spawner: Spawner, files: AgentFiles,
              on_spawn: Callable[[int, Process], None] = lambda rank, proc: None,
              memory_limits: Mapping[int, int] | None = None, control_host: str | None = None) -> Fleet:
        """Listen on ``socket_path`` (with ``control_host``: on a TCP port of that address, where agents on
        other servers reach it) and spawn one agent per rank of ``hosts`` (rank -> its host's namespace pid),
        each under its ``memory_limits`` entry (bytes of ``RLIMIT_DATA``; a rank without one: no limit).

        ``on_spawn(rank, process)`` runs after each spawn (to record the
        process). When a spawn fails, the agents spawned so far are reaped
        and the socket closed before the error propagates.
        """
        fleet = cls(ControlServer(socket_path, len(hosts), tcp_host=control_host), memory_limits=memory_limits)
        try:
            for rank, netns_pid in hosts.items():
                proc = spawner.spawn(netns_pid, files.argv(rank, fleet.control.address), files.stderr(rank),
                                     fleet.memory_limits.get(rank))
                fleet.agents[rank] = proc
                on_spawn(rank, proc)
        except BaseException:
            fleet.close()
            raise
        return fleet

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- barrier
    def wait_for(self, kind: Msg, timeout: float, ranks: Iterable[int] | None = None,
                 on_step: Callable[[int], None] | None = None) -> dict[int, dict[str, Any]]:
        """Wait for message ``kind`` from every rank (default: every agent); return them by rank.

        ``step`` messages (an agent released its first operation of a watched
        step) go to ``on_step`` meanwhile. Raises :class:`ReplayFailed`
        naming the rank when an agent reports an error, exits or loses its
        connection before sending ``kind``, or when ``timeout`` seconds pass.
        """
        want = set(self.agents) if ranks is None else set(ranks)
        got: dict[int, dict[str, Any]] = {}
        deadline = self.clock() + timeout
        next_health = self.clock() + HEALTH_INTERVAL_S
        while set(got) != want:
            for msg in self.control.poll(POLL_S):
                self._take(msg, kind, got, on_step)
            for rank, proc in self.agents.items():
                if rank in want and rank not in got and proc.poll() is not None:
                    raise ReplayFailed(self._exited(rank, proc.returncode, kind))
            if self.health is not None and self.clock() > next_health:
                lost = self.health()
                if lost is not None:
                    raise ReplayFailed(lost)
                next_health = self.clock() + HEALTH_INTERVAL_S
            if self.clock() > deadline:
                missing = sorted(want - set(got))
                raise ReplayFailed(f"rank {missing[0]} (of {len(missing)} missing: {missing[:8]}) did not report "
                                   f"'{kind}' within {timeout:.0f} s: agent hung")
        return got

    def _take(self, msg: dict[str, Any], kind: Msg, got: dict[int, dict[str, Any]],
              on_step: Callable[[int], None] | None) -> None:
        rank = int(msg.get("rank", -1))
        if msg["type"] == Msg.ERROR:
            if msg.get("out_of_memory"):
                raise ReplayFailed(confinement.agent_ran_out(rank, self.memory_limits.get(rank), kind))
            raise ReplayFailed(f"rank {rank} failed: {msg.get('message')}")
        if msg["type"] == Msg.CLOSED and rank not in got:
            proc = self.agents.get(rank)
            status = proc.poll() if proc else None
            if status is None and proc is not None:  # the connection closes a moment before the process ends
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = proc.wait(EXIT_GRACE_S)
            raise ReplayFailed(self._exited(rank, status, kind, "agent exited (status {status})"))
        if msg["type"] == kind:
            got[rank] = msg
        elif msg["type"] == Msg.STEP and on_step is not None:
            on_step(int(msg["step"]))

    def _exited(self, rank: int, status: int | None, kind: Msg,
                template: str = "agent exited with status {status}") -> str:
        """Why ``rank`` is gone before ``kind``: its memory limit (by its exit status), or its exit status."""
        if status == confinement.OUT_OF_MEMORY_STATUS:
            return confinement.agent_ran_out(rank, self.memory_limits.get(rank), kind)
        return f"rank {rank}: {template.format(status=status)} before '{kind}'"

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Every agent has its peer connections up."""
        self.wait_for(Msg.READY, timeout)

    def wait_done(self, timeout: float, on_step: Callable[[int], None] | None = None) -> dict[int, RankReport]:
        """Every rank's report of the repetition under way (see :meth:`wait_for`)."""
        return {rank: RankReport.from_message(msg).shifted(self.clock_offsets.get(rank, 0.0))
                for rank, msg in self.wait_for(Msg.DONE, timeout, on_step=on_step).items()}

    # ------------------------------------------------------------- commands
    def _send_all(self, kind: Msg, per_rank: Mapping[int, Mapping[str, Any]] | None = None, **fields: Any) -> None:
        try:
            self.control.send_all(kind, per_rank, **fields)
        except ControlError as exc:
            raise ReplayFailed(str(exc)) from None

    def go(self, rep: int, start_at: float, watch_steps: Sequence[int] = ()) -> None:
        """Start repetition ``rep`` on every rank at ``start_at`` (shared monotonic clock); agents report
        ``step`` for each of ``watch_steps``. An agent on another server gets ``start_at`` on its own clock
        (:attr:`clock_offsets`); the ``go`` message is the barrier every rank waits for."""
        per_rank = {rank: {"start_at": start_at + offset} for rank, offset in self.clock_offsets.items()}
        self._send_all(Msg.GO, per_rank, rep=rep, start_at=start_at, watch_steps=list(watch_steps))

    def quit(self, grace_s: float = QUIT_GRACE_S) -> None:
        """Tell every agent to exit, and reap them (killing those still there after ``grace_s``)."""
        self._send_all(Msg.QUIT)
        self.reap(grace_s)

    def kill(self, rank: int) -> None:
        """SIGKILL to ``rank``'s agent (a fault: the run then fails naming the rank)."""
        self.agents[rank].kill()

    def reap(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for every agent to exit, then kill those left."""
        deadline = self.clock() + grace_s
        for proc in self.agents.values():
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(deadline - self.clock(), 0.01))
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(2)

    def close(self) -> None:
        """Reap the agents (:data:`CLOSE_GRACE_S`), close the control socket and remove its file. Safe twice."""
        self.reap(CLOSE_GRACE_S)
        self.control.close()
        if self.control.address == self.control.path:
            try:
                os.unlink(self.control.path)
            except OSError:
                pass
