"""One emulated network at a time on a machine: two on two cores would measure each other.

:class:`NetworkLock` is an exclusive ``flock`` on ``network.lock`` in the
run-state root (:func:`emulator.emulation.machine.started.state_root`). The kernel drops the
lock when its holder dies, even by SIGKILL, so a killed run never leaves the
machine locked; and whoever holds it knows that no live network owns a bridge
of our name pattern (what :func:`emulator.emulation.machine.cleanup.clean` relies on at bring-up).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from typing import IO

from emulator.base.errors import UserError
from emulator.emulation.machine.started import state_root

log = logging.getLogger(__name__)

#: How long :meth:`NetworkLock.acquire` waits by default (seconds); ``EF_NET_LOCK_WAIT`` overrides it.
DEFAULT_WAIT_S = 900.0


class NetworkLock:
    """The machine-wide network lock; also a context manager.

    ``acquire`` waits for the network that is up, at most ``EF_NET_LOCK_WAIT``
    seconds (default :data:`DEFAULT_WAIT_S`), then raises :class:`UserError`.
    """

    def __init__(self) -> None:
        self.fd: int | None = None

    def __enter__(self) -> NetworkLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        os.makedirs(state_root(), exist_ok=True)
        fd = os.open(os.path.join(state_root(), "network.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        wait_s = float(os.environ.get("EF_NET_LOCK_WAIT", str(DEFAULT_WAIT_S)))
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise UserError(f"another emulated network has been up for more than {wait_s:g} s on this "
                                    "machine; wait for it, or stop it (`emu clean --force`)") from None
                if not told:
                    log.warning("another emulated network is up on this machine: waiting for it to finish")
                    told = True
                time.sleep(0.5)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def hold(stdin: IO[str], stdout: IO[str]) -> int:
    """Take the lock, say ``locked`` on ``stdout``, and keep it until ``stdin`` ends (its holder went away: the
    head of a cluster, over ssh; :mod:`emulator.emulation.cluster.cluster_lock`)."""
    lock = NetworkLock()
    try:
        lock.acquire()
    except UserError as exc:
        print(f"error: {exc}", file=stdout, flush=True)
        return 2
    try:
        print("locked", file=stdout, flush=True)
        stdin.read()
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(hold(sys.stdin, sys.stdout))
