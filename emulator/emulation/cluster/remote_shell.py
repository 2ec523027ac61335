"""Commands on a cluster's servers over ssh: the one place that builds an ssh command line.

Every remote command of the project (``emu cluster check``, the remote
bring-up, the agent launchers, the cluster lock, cleanup) goes through
:func:`ssh_argv`, so every one logs in the same way:

* with the key the cluster file names and no other (``IdentitiesOnly``, no
  agent, ``-F none``: neither the user's ssh configuration nor default keys
  take part);
* recording the servers' host keys in the cluster's own ``known_hosts``
  (:attr:`emulator.runs.cluster_file.Cluster.known_hosts`; accepted on first
  contact, checked after), never in the user's;
* in batch mode (a password prompt fails instead of hanging), with a
  connection timeout and keep-alives, so a lost server ends the command.

The remote command is one shell word list, quoted with :func:`shlex.join`;
the remote user's login shell runs it. A non-root user runs it through
``sudo -n`` (never a password).

While a network is up, every command to a server shares one connection
(:func:`open_shared`: an ssh master per server, its socket in the run-state
root) instead of a login each: a bring-up makes dozens of ssh calls per
server, each a key exchange. Without a master, a command connects alone.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from functools import partial

from emulator.emulation.machine.started import remove_ssh_folder, ssh_folder
from emulator.emulation.machine.system import Result, Runner, run
from emulator.runs.cluster_file import Cluster, Server

#: Seconds ssh waits for a server to answer before it gives up.
CONNECT_TIMEOUT_S = 10
#: Seconds a shared connection (:func:`open_shared`) outlives its last session.
SHARED_IDLE_S = 10
#: Keep-alive: a server silent for ALIVE_INTERVAL_S * ALIVE_COUNT seconds is lost, and the command ends.
ALIVE_INTERVAL_S = 3
ALIVE_COUNT = 3


def ssh_path(path: str) -> str:
    """``path`` as an ssh option's value: quoted (ssh splits a known-hosts list at blanks) and with ``%``
    doubled (ssh expands ``%`` tokens in file names)."""
    return '"' + path.replace("%", "%%") + '"'


def control_path() -> str:
    """Where the shared connections' sockets are (``%C``: ssh's hash of the destination)."""
    return os.path.join(ssh_folder(), "%C")


def ssh_options(server: Server, known_hosts: str) -> list[str]:
    """ssh's options for ``server``: its key only, the cluster's known hosts, batch mode, keep-alives, the
    shared connection where one is open (never opening one: :func:`open_shared` does)."""
    return ["-F", "none", "-p", str(server.port), "-o", f"IdentityFile={ssh_path(server.key)}",
            "-o", "ControlMaster=no", "-o", f"ControlPath={control_path()}",
            "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={ssh_path(known_hosts)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={ALIVE_COUNT}", "-o", "LogLevel=ERROR"]


def remote_command(server: Server, command: Sequence[str]) -> str:
    """The command line the server's shell runs: ``command`` quoted, under ``sudo -n`` for a non-root user."""
    words = list(command) if server.user == "root" else ["sudo", "-n", "-E", *command]
    return shlex.join(words)


def ssh_prefix(server: Server, known_hosts: str, *, tty: bool = False) -> list[str]:
    """``ssh`` with its options up to the destination's ``--``: what a remote command line follows."""
    return ["ssh", *ssh_options(server, known_hosts), *(["-tt"] if tty else ["-T"]), f"{server.user}@{server.ssh}",
            "--"]


def ssh_argv(server: Server, command: Sequence[str], known_hosts: str, *, tty: bool = False) -> list[str]:
    """The local argument list that runs ``command`` on ``server`` (``tty``: with a terminal, ``-tt``)."""
    return [*ssh_prefix(server, known_hosts, tty=tty), remote_command(server, command)]


def open_shared(cluster: Cluster) -> list[str]:
    """An ssh master (shared connection) to every server but the head, in the background; the servers where
    none opened (their commands then connect alone). Each master exits :data:`SHARED_IDLE_S` after its last
    session, so a killed head leaves none behind for long. Its standard streams are /dev/null: a master
    holding a caller's pipe would keep the caller waiting for its end."""
    os.makedirs(os.path.dirname(control_path()), mode=0o700, exist_ok=True)
    failed = []
    for server in cluster.others:
        options = [o.replace("ControlMaster=no", "ControlMaster=yes") for o in ssh_options(server, cluster.known_hosts)]
        argv = ["ssh", *options, "-o", f"ControlPersist={SHARED_IDLE_S}", "-f", "-N", f"{server.user}@{server.ssh}"]
        try:
            status = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, timeout=CONNECT_TIMEOUT_S + 5, check=False).returncode
        except subprocess.TimeoutExpired:
            status = 124
        if status != 0:
            failed.append(server.name)
    return failed


def close_shared(cluster: Cluster, local: Runner = run) -> None:
    """End every server's ssh master (:func:`open_shared`), if one is open."""
    for server in cluster.others:
        local(["ssh", *ssh_options(server, cluster.known_hosts), "-O", "exit", f"{server.user}@{server.ssh}"])
    remove_ssh_folder()


def remote_runner(cluster: Cluster, server: Server, local: Runner = run) -> Runner:
    """A :data:`~emulator.emulation.machine.system.Runner` for ``server``: the head's own commands run locally (through
    ``local``), every other server's through ssh."""
    if server.name == cluster.head:
        return local

    def runner(command: Sequence[str]) -> Result:
        return local(ssh_argv(server, command, cluster.known_hosts))
    return runner


def runners(cluster: Cluster, local: Runner = run) -> dict[str, Runner]:
    """:func:`remote_runner` of every server, by name."""
    return {s.name: remote_runner(cluster, s, local) for s in cluster.servers}


def popen(cluster: Cluster, server: Server, command: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
    """A long-lived process on ``server`` (local on the head), its standard streams as ``kwargs`` say (text)."""
    argv = list(command) if server.name == cluster.head else ssh_argv(server, command, cluster.known_hosts)
    return subprocess.Popen(argv, text=True, **kwargs)  # type: ignore[call-overload]


def run_with_timeout(timeout: float) -> Runner:
    """:func:`~emulator.emulation.machine.system.run` with another timeout (a Runner)."""
    return partial(run, timeout=timeout)

