"""The cluster-wide network lock: one emulated network at a time on every server of a cluster.

Each server keeps its own :class:`~emulator.emulation.machine.network_lock.NetworkLock`
(an ``flock`` its kernel drops when the holder dies). :class:`ClusterLock`
holds it on every server but the head (the head's is the network's own) by
one ssh session each, running ``python -m emulator.emulation.machine.network_lock``,
which takes the lock, says ``locked`` and keeps it until its input ends.
When the head releases the lock, or dies (even by SIGKILL), the ssh sessions
end and every server's lock is free again. Servers are locked in the
cluster file's order, so two heads of the same cluster cannot each hold half.
This also keeps VXLAN identifiers (VNIs) unique between a cluster's servers.
"""

from __future__ import annotations

import subprocess
import sys
import threading

from emulator.base.errors import UserError
from emulator.emulation.cluster import remote_shell
from emulator.emulation.machine.network_lock import DEFAULT_WAIT_S
from emulator.emulation.machine.system import end_by_closing_input
from emulator.runs.cluster_file import Cluster

#: How long a server's lock may take beyond the lock's own wait (ssh start-up).
SSH_MARGIN_S = 30.0


class ClusterLock:
    """The lock of every server of ``cluster`` but the head, held by ssh sessions."""

    def __init__(self, cluster: Cluster, wait_s: float = DEFAULT_WAIT_S):
        self.cluster = cluster
        self.wait_s = wait_s
        self.holders: dict[str, subprocess.Popen[str]] = {}

    def acquire(self) -> ClusterLock:
        try:
            for server in self.cluster.others:
                self.holders[server.name] = self._hold(server.name)
        except BaseException:
            self.release()
            raise
        return self

    def _hold(self, name: str) -> subprocess.Popen[str]:
        proc = remote_shell.popen(self.cluster, self.cluster.server(name),
                                  [sys.executable, "-m", "emulator.emulation.machine.network_lock"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = _readline(proc, self.wait_s + SSH_MARGIN_S)
        if line.strip() != "locked":
            proc.kill()
            _, err = proc.communicate()
            why = line.strip().removeprefix("error: ") or err.strip()[-200:] or f"ssh exited {proc.returncode}"
            raise UserError(f"cluster {self.cluster.name}: server {name}: cannot take its network lock: {why}")
        return proc

    def release(self) -> None:
        holders, self.holders = self.holders, {}
        for proc in holders.values():
            end_by_closing_input(proc, 10)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first line of ``proc``'s output, or "" when none comes within ``timeout`` seconds."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""
