"""Host agents started by forking one pre-imported Python process, not by a fresh interpreter each.

``python -m emulator.emulation.agent`` costs about 0.5 CPU-seconds before it does
anything (the interpreter, numpy, networkx, PyYAML): 16 agents are 4 s of this
2-core machine per cell, 64 agents 14 s, more than half of ``make
experiment``'s wall time (measured, docs/fidelity.md). A session therefore
starts one *launcher* (``python -m emulator.emulation.agent_launcher``) that imports
:mod:`emulator.emulation.agent` once. Per agent, the launcher forks; the child joins the
Mininet host's network and mount namespaces with ``setns(2)`` (what ``mnexec
-a PID`` does), sends its output to the agent's stderr file and runs
:func:`emulator.emulation.agent.main`.

Ownership: :meth:`AgentLauncher.start` makes the session's own process a
child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) and the launcher forks
twice, so every agent is re-parented to the session's process, which waits
for it as for any child: :class:`AgentProcess` has the ``pid``, ``poll``,
``wait``, ``kill`` and ``returncode`` of a :class:`subprocess.Popen`.

Confinement: a request's ``memory_limit`` (bytes, or null for none) is the
agent's ``RLIMIT_DATA``, set in the forked agent before
:func:`emulator.emulation.agent.main` runs (:mod:`emulator.emulation.confinement`); an agent that
runs out exits with :data:`emulator.emulation.confinement.OUT_OF_MEMORY_STATUS`.

Protocol: one JSON line per request on the launcher's stdin
(``{"netns_pid", "argv", "output", "cwd", "memory_limit"}``), one JSON line
per answer on its stdout (``{"pid": N}`` or ``{"error": "..."}``); end of
input ends it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Sequence
from typing import IO, Any

from emulator.base.waiting import wait_until
from emulator.emulation import agent, confinement

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
        status = agent.main(list(request["argv"]))
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


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer every request line (see the module docstring) until end of input."""
    for line in requests:
        try:
            answer: dict[str, Any] = {"pid": _fork_agent(json.loads(line))}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session stops the launcher; Ctrl-C is the session's
    serve(sys.stdin, sys.stdout)
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
            self.proc = subprocess.Popen([sys.executable, "-m", "emulator.emulation.agent_launcher"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, cwd=self.cwd, env=self.env)
        return self

    def spawn(self, netns_pid: int, argv: Sequence[str], output: str,
              memory_limit: int | None = None) -> AgentProcess:
        """Start ``python -m emulator.emulation.agent ARGV`` in ``netns_pid``'s namespaces, under ``RLIMIT_DATA``
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
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
