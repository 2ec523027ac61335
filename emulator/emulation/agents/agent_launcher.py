"""Host agents started by forking one pre-imported Python process, not by a fresh interpreter each.

``python -m emulator.emulation.agents.agent`` costs about 0.5 CPU-seconds before it does
anything (the interpreter, numpy, networkx, PyYAML): 16 agents are 4 s of this
2-core machine per cell, 64 agents 14 s, more than half of ``make
experiment``'s wall time (measured, docs/fidelity.md). A session therefore
starts one *launcher* (``python -m emulator.emulation.agents.agent_launcher``) that imports
:mod:`emulator.emulation.agents.agent` once. Per agent, the launcher forks; the child joins the
Mininet host's network and mount namespaces with ``setns(2)`` (what ``mnexec
-a PID`` does), sends its output to the agent's stderr file and runs
:func:`emulator.emulation.agents.agent.main`.

Ownership: :meth:`AgentLauncher.start` makes the session's own process a
child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) and the launcher forks
twice, so every agent is re-parented to the session's process, which waits
for it as for any child: :class:`AgentProcess` has the ``pid``, ``poll``,
``wait``, ``kill`` and ``returncode`` of a :class:`subprocess.Popen`.

Confinement: a request's ``memory_limit`` (bytes, or null for none) is the
agent's ``RLIMIT_DATA``, set in the forked agent before
:func:`emulator.emulation.agents.agent.main` runs (:mod:`emulator.emulation.machine.confinement`); an agent that
runs out exits with :data:`emulator.emulation.machine.confinement.OUT_OF_MEMORY_STATUS`.

Protocol: one JSON line per request on the launcher's stdin
(``{"netns_pid", "argv", "output", "cwd", "memory_limit"}``), one JSON line
per answer on its stdout (``{"pid": N}`` or ``{"error": "..."}``); end of
input ends it.

On a cluster's other servers (:mod:`emulator.emulation.cluster.cluster_agents`) the
head reaches a launcher over ssh, and the launcher runs with ``--adopt``: it
is itself the agents' subreaper, records them in a run state of its server
(so that ``emu clean`` there ends them if the head is lost), first answers
``{"workdir": PATH}`` (that run state's folder, where the agents' files go),
and takes these requests too: ``{"op": "poll", "pid"}`` ->
``{"status": N or null}``, ``{"op": "kill", "pid"}``, ``{"op": "clock"}`` ->
``{"monotonic": T}``, ``{"op": "write", "path", "text"}`` and
``{"op": "read", "path"}`` -> ``{"text": ...}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from typing import IO, Any

from emulator.base.waiting import wait_until
from emulator.emulation.agents import agent, agent_protocol
from emulator.emulation.machine import confinement
from emulator.emulation.machine.started import StartedRecord
from emulator.emulation.machine.system import end_by_closing_input

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
PR_SET_CHILD_SUBREAPER = 36
NAMESPACES = (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS))
#: Importing numpy must not start BLAS thread pools in the process that forks (a forked child keeps one thread).
SINGLE_THREADED_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_libc = ctypes.CDLL(None, use_errno=True)


class LauncherError(RuntimeError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def join_namespaces(pid: int) -> None:
    """Enter ``pid``'s network and mount namespaces (those it does not already share with this process)."""
    for name, flag in NAMESPACES:
        target = f"/proc/{pid}/ns/{name}"
        if os.stat(target).st_ino == os.stat(f"/proc/self/ns/{name}").st_ino:
            continue
        fd = os.open(target, os.O_RDONLY)
        try:
            _check(_libc.setns(fd, flag), f"setns {target}")
        finally:
            os.close(fd)


def become_subreaper() -> None:
    """Orphaned descendants of this process (the launcher's agents) become its children."""
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


# ------------------------------------------------------------- launcher side
def _run_agent(request: dict[str, Any]) -> None:
    """In the forked agent process: namespaces, output, working directory, memory limit, then the agent. Never
    returns."""
    status = 1
    try:
        os.setsid()
        argv = agent_protocol.preconnect(list(request["argv"]))  # from this server's namespace, not the host's
        join_namespaces(int(request["netns_pid"]))  # entering a mount namespace moves to its root directory
        os.chdir(request["cwd"])
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if request.get("memory_limit") is not None:
            confinement.limit_data(int(request["memory_limit"]))
        status = agent.main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        if confinement.is_out_of_memory(exc):  # before the agent's own handling (its arguments, its log)
            exc.__traceback__ = None
            status = confinement.OUT_OF_MEMORY_STATUS
            print(f"agent: out of memory before it started (memory limit "
                  f"{confinement.describe_limit(confinement.data_limit())}, RLIMIT_DATA)", file=sys.stderr)
        else:
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def _fork_agent(request: dict[str, Any]) -> int:
    """Fork twice (the middle process exits at once, so the agent is re-parented); return the agent's pid."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        try:
            agent_pid = os.fork()
            if agent_pid == 0:
                os.close(write_end)
                _run_agent(request)
            os.write(write_end, str(agent_pid).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = os.read(read_end, 32)
    finally:
        os.close(read_end)
        os.waitpid(middle, 0)
    if not data:
        raise LauncherError("the agent's process could not be forked")
    return int(data)


def serve(requests: IO[str], answers: IO[str], adopted: Adopted | None = None) -> None:
    """Answer every request line (see the module docstring) until end of input."""
    for line in requests:
        try:
            request = json.loads(line)
            if "op" in request:
                if adopted is None:
                    raise LauncherError("this launcher does not adopt its agents (--adopt)")
                answer: dict[str, Any] = adopted.handle(request)
            else:
                answer = {"pid": _fork_agent(request)}
                if adopted is not None:
                    adopted.record(answer["pid"])
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class Adopted:
    """A launcher's own agents (``--adopt``): recorded in a run state of this server, polled and killed here."""

    def __init__(self) -> None:
        become_subreaper()
        self.state = StartedRecord.create("agents")
        os.makedirs(os.path.join(self.state.path, "logs"))
        self.status: dict[int, int] = {}

    def record(self, pid: int) -> None:
        self.state.record_process("agent", pid)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "clock":
            return {"monotonic": time.monotonic()}
        if op == "poll":
            return {"status": self.poll(int(request["pid"]))}
        if op == "kill":
            if self.poll(int(request["pid"])) is None:
                os.kill(int(request["pid"]), signal.SIGKILL)
            return {"ok": True}
        if op == "write":
            path = self._inside(request["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(request["text"])
            return {"ok": True}
        if op == "read":
            with open(self._inside(request["path"]), encoding="utf-8", errors="replace") as fh:
                return {"text": fh.read()}
        raise LauncherError(f"unknown request {op!r}")

    def _inside(self, path: str) -> str:
        """``path`` when it lies in this launcher's folder (the head writes and reads nothing else here)."""
        full = os.path.realpath(path)
        if not full.startswith(os.path.realpath(self.state.path) + os.sep):
            raise LauncherError(f"{path}: outside this launcher's folder {self.state.path}")
        return full

    def poll(self, pid: int) -> int | None:
        if pid not in self.status:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return -1
            if done:
                self.status[pid] = os.waitstatus_to_exitcode(status)
        return self.status.get(pid)

    def close(self) -> None:
        """Kill the agents still running (the head is gone or done), reap them, and remove the run state."""
        for record in self.state.processes():
            pid = int(record["pid"])
            if self.poll(pid) is None:
                os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        self.state.remove()


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session stops the launcher; Ctrl-C is the session's
    if "--adopt" not in (sys.argv[1:] if argv is None else argv):
        serve(sys.stdin, sys.stdout)
        return 0
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a lost ssh session ends our input: we clean up then
    adopted = Adopted()
    try:
        print(json.dumps({"workdir": adopted.state.path}), flush=True)
        serve(sys.stdin, sys.stdout, adopted)
    finally:
        adopted.close()
    return 0


# --------------------------------------------------------------- session side
class AgentProcess:
    """An agent the launcher forked and this process adopted: the parts of :class:`subprocess.Popen` we use."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours (not adopted) or reaped elsewhere: gone, status unknown
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not wait_until(lambda: self.poll() is not None, timeout, 0.01):
            raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class AgentLauncher:
    """The session's launcher process; :meth:`spawn` starts one agent in a host's namespaces."""

    def __init__(self, env: dict[str, str], cwd: str, stderr_path: str):
        self.env = {**env, **SINGLE_THREADED_ENV}
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> AgentLauncher:
        become_subreaper()
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "emulator.emulation.agents.agent_launcher"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         cwd=self.cwd, env=self.env)
        return self

    def spawn(self, netns_pid: int, argv: Sequence[str], output: str,
              memory_limit: int | None = None) -> AgentProcess:
        """Start ``python -m emulator.emulation.agents.agent ARGV`` in ``netns_pid``'s namespaces, under ``RLIMIT_DATA``
        ``memory_limit`` bytes (None: no limit); paths in ``argv`` must be absolute (the agent runs in the
        launcher's working directory, not this process's)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise LauncherError("the agent launcher is not running")
        request = {"netns_pid": netns_pid, "argv": list(argv), "output": os.path.abspath(output),
                   "cwd": os.path.abspath(self.cwd), "memory_limit": memory_limit}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError as exc:
            raise LauncherError(f"the agent launcher is gone ({exc}); see {self.stderr_path}") from None
        if not line:
            raise LauncherError(f"the agent launcher exited (status {proc.poll()}); see {self.stderr_path}")
        answer = json.loads(line)
        if "pid" not in answer:
            raise LauncherError(f"the agent launcher could not start an agent: {answer.get('error')}")
        return AgentProcess(int(answer["pid"]))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            end_by_closing_input(proc, 5)


if __name__ == "__main__":
    sys.exit(main())
