"""Agents on a cluster's servers: one launcher per server, reached over ssh, with the same control protocol.

:class:`ClusterSpawner` is a :class:`~emulator.emulation.agents.fleet.Spawner` for a
network spread over servers. A rank whose host runs on the head is spawned by
the head's own :class:`~emulator.emulation.agents.agent_launcher.AgentLauncher`; a
rank on another server by that server's launcher (:class:`RemoteLauncher`:
``python -m emulator.emulation.agents.agent_launcher --adopt`` over ssh, the
project's interpreter at the same path on every server).

The head's files are not on the other servers: before a remote agent starts,
the files its command line names (its schedule, the topology, the latency
plan) are written into the launcher's folder on its server and the command
line is pointed there; its log and its output go there too, and
:meth:`ClusterSpawner.collect` copies them back beside the head's results.

Clocks: an agent dates its operations on its server's monotonic clock.
:meth:`ClusterSpawner.clock_offsets` measures how far each server's clock
is ahead of the head's (the launcher's answer against the midpoint of the
round trip; the error is at most half of it), so that the ``go`` message,
the barrier every repetition starts on, carries each rank's start time on
its own clock, and its report comes back on the head's
(the ``clock_offsets`` of :class:`emulator.emulation.agents.fleet.Fleet`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.waiting import wait_until
from emulator.emulation.agents.agent_launcher import AgentLauncher, LauncherError
from emulator.emulation.agents.fleet import Process
from emulator.emulation.cluster import remote_shell
from emulator.emulation.machine.system import end_by_closing_input
from emulator.runs.cluster_check import ClockSample, offset_from
from emulator.runs.cluster_file import Cluster, Server

#: Flags of the agent's command line that name a file the head wrote (copied to the agent's server).
INPUT_FLAGS = ("--schedule", "--topology", "--latency")
#: The flag naming the agent's log (written on its server, copied back).
LOG_FLAG = "--log"
#: Round trips per clock measurement (the shortest one counts).
CLOCK_SAMPLES = 5


@dataclass(frozen=True)
class ServerClock:
    """How far a server's monotonic clock is ahead of the head's, and the measurement's bound (seconds)."""

    server: str
    offset_s: float
    error_s: float

    def to_json(self) -> dict[str, Any]:
        return {"server": self.server, "offset_s": self.offset_s, "error_s": self.error_s}


class RemoteLauncher:
    """One server's agent launcher, over ssh (``--adopt``: it reaps and records its own agents)."""

    def __init__(self, cluster: Cluster, server: Server, stderr_path: str):
        self.cluster = cluster
        self.server = server
        self.stderr_path = stderr_path
        self.proc: subprocess.Popen[str] | None = None
        self.workdir = ""
        self._lock = threading.Lock()
        self._copied: dict[tuple[str, int, int], str] = {}

    def start(self) -> RemoteLauncher:
        with open(self.stderr_path, "ab") as err:
            self.proc = remote_shell.popen(self.cluster, self.server,
                                           [sys.executable, "-m", "emulator.emulation.agents.agent_launcher",
                                            "--adopt"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                           start_new_session=True)
        first = self._answer()
        if "workdir" not in first:
            raise LauncherError(f"server {self.server.name}: its agent launcher did not start: {first}")
        self.workdir = first["workdir"]
        return self

    def _answer(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise LauncherError(f"server {self.server.name}: its agent launcher is gone (status "
                                f"{self.proc.poll()}); see {self.stderr_path}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, **fields: Any) -> dict[str, Any]:
        """One request and its answer; :class:`LauncherError` when the launcher (or its server) is gone."""
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise LauncherError(f"server {self.server.name}: its agent launcher is not running")
        with self._lock:
            try:
                proc.stdin.write(json.dumps(fields) + "\n")
                proc.stdin.flush()
            except OSError as exc:
                raise LauncherError(f"server {self.server.name}: lost ({exc}); see {self.stderr_path}") from None
            answer = self._answer()
        if "error" in answer:
            raise LauncherError(f"server {self.server.name}: {answer['error']}")
        return answer

    def copy(self, local: str, name: str) -> str:
        """``local`` written as ``name`` in the launcher's folder (once per version of the file); its path there."""
        st = os.stat(local)
        key = (local, st.st_mtime_ns, st.st_size)
        if key not in self._copied:
            with open(local, encoding="utf-8") as fh:
                remote = os.path.join(self.workdir, name)
                self.request(op="write", path=remote, text=fh.read())
            self._copied[key] = remote
        return self._copied[key]

    def clock_offset(self) -> ServerClock:
        """The server's monotonic clock against this process's (:data:`CLOCK_SAMPLES` round trips, the shortest
        counting: :func:`emulator.runs.cluster_check.offset_from`)."""
        samples = []
        for _ in range(CLOCK_SAMPLES):
            sent = time.monotonic()
            remote = float(self.request(op="clock")["monotonic"])
            samples.append(ClockSample(sent, remote, time.monotonic()))
        found = offset_from(samples)
        assert found.offset_s is not None and found.uncertainty_s is not None
        return ServerClock(self.server.name, found.offset_s, found.uncertainty_s)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            end_by_closing_input(proc, 10)


class RemoteAgentProcess:
    """An agent on another server: the parts of :class:`subprocess.Popen` the fleet uses, through its launcher."""

    def __init__(self, launcher: RemoteLauncher, pid: int):
        self.launcher = launcher
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                status = self.launcher.request(op="poll", pid=self.pid)["status"]
            except LauncherError:
                status = -1  # its server or launcher is lost: so is the agent
            self.returncode = None if status is None else int(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not wait_until(lambda: self.poll() is not None, timeout, 0.05):
            raise subprocess.TimeoutExpired(f"agent {self.pid} on {self.launcher.server.name}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                self.launcher.request(op="kill", pid=self.pid)
            except LauncherError:
                pass


class ClusterSpawner:
    """Spawns each rank's agent on its host's server (``rank_server``: rank -> server name, set per run)."""

    def __init__(self, cluster: Cluster, local: AgentLauncher, work_dir: str):
        self.cluster = cluster
        self.local = local
        self.remote = {s.name: RemoteLauncher(cluster, s, os.path.join(work_dir, f"launcher-{s.name}.stderr"))
                       for s in cluster.others}
        self.rank_server: dict[int, str] = {}
        self._logs: dict[str, tuple[RemoteLauncher, str]] = {}  # local path -> (launcher, remote path)

    def start(self) -> ClusterSpawner:
        for launcher in self.remote.values():
            launcher.start()
        return self

    def pids(self) -> list[int]:
        """The local processes of the remote launchers (their ssh clients)."""
        return [launcher.proc.pid for launcher in self.remote.values() if launcher.proc is not None]

    def spawn(self, netns_pid: int, argv: Sequence[str], output: str, memory_limit: int | None = None) -> Process:
        rank = int(argv[list(argv).index("--rank") + 1])
        server = self.rank_server.get(rank, self.cluster.head)
        if server == self.cluster.head:
            return self.local.spawn(netns_pid, argv, output, memory_limit)
        launcher = self.remote[server]
        remote_argv = self._localize(launcher, rank, list(argv))
        remote_output = os.path.join(launcher.workdir, "logs", os.path.basename(output))
        self._logs[output] = (launcher, remote_output)
        answer = launcher.request(netns_pid=netns_pid, argv=remote_argv, output=remote_output,
                                  cwd=os.path.abspath(self.local.cwd), memory_limit=memory_limit)
        return RemoteAgentProcess(launcher, int(answer["pid"]))

    def _localize(self, launcher: RemoteLauncher, rank: int, argv: list[str]) -> list[str]:
        """``argv`` with the head's files replaced by copies in ``launcher``'s folder, its log there too."""
        for flag in INPUT_FLAGS:
            if flag in argv:
                i = argv.index(flag) + 1
                argv[i] = launcher.copy(argv[i], f"rank-{rank}-{os.path.basename(argv[i])}"
                                        if flag == "--schedule" else os.path.basename(argv[i]))
        if LOG_FLAG in argv:
            i = argv.index(LOG_FLAG) + 1
            remote = os.path.join(launcher.workdir, "logs", os.path.basename(argv[i]))
            self._logs[argv[i]] = (launcher, remote)
            argv[i] = remote
        return argv

    def collect(self) -> list[str]:
        """Copy every remote agent's log and output back to where the head expects them; lines for what failed."""
        problems = []
        for local, (launcher, remote) in self._logs.items():
            try:
                text = launcher.request(op="read", path=remote)["text"]
            except LauncherError as exc:
                problems.append(f"{local}: not copied back ({exc})")
                continue
            with open(local, "w", encoding="utf-8") as fh:
                fh.write(text)
        self._logs.clear()
        return problems

    def clock_offsets(self) -> list[ServerClock]:
        """Every other server's clock against the head's."""
        return [launcher.clock_offset() for launcher in self.remote.values()]

    def stop(self) -> None:
        for launcher in self.remote.values():
            launcher.stop()
        self.local.stop()
