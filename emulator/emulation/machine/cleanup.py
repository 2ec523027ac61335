"""``emu clean``: remove what this project left behind, and nothing else.

What is ours is found two ways (see :mod:`emulator.emulation.machine.started`): processes from
the run-state records (pid + start time, plus every process inside a recorded
host namespace), and bridges and root-namespace interfaces by their name
pattern (``efsN``, ``efsN-ethP``, ``efhN-eth0``). Runs whose owning process is
still alive are left alone unless ``force`` is given. Never Mininet's global
cleanup, and never killing processes by name pattern.

Every network bring-up calls :func:`clean` with ``network_lock_held``: it
holds the machine-wide network lock, so no live network can own a bridge of
our pattern, and what a killed run (even SIGKILL) left is removed before the
next run starts. :class:`emulator.emulation.network.emulated_network.EmulatedNetwork` also tears its
own bridges down with :func:`remove_our_bridges`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence

from emulator.base.naming import BRIDGE_RE, CHECK_DEVICE_RE, CHECK_NAMESPACE_PREFIX, INTERFACE_RE, NAME_PREFIX
from emulator.emulation.machine.started import all_runs, kill_recorded, remove_ssh_folder, ssh_folder
from emulator.emulation.machine.system import Runner, run


def interface_names(ip_link_json: str) -> list[str]:
    """The interface names in ``ip -j link show`` output (a veth's peer is a separate field, not part of its name).

    Output that is not a JSON list (``ip`` failed) has none.
    """
    try:
        links = json.loads(ip_link_json)
    except json.JSONDecodeError:
        return []
    if not isinstance(links, list):
        return []
    return [link["ifname"] for link in links if isinstance(link, dict) and isinstance(link.get("ifname"), str)]


def links_with_prefix(runner: Runner, prefix: str) -> list[str]:
    """The root namespace's interfaces whose names start with ``prefix``."""
    return [name for name in interface_names(runner(["ip", "-j", "link", "show"]).stdout) if name.startswith(prefix)]


def remove_our_bridges(runner: Runner, names: Sequence[str]) -> None:
    """Delete the named bridges (ours) and the root-namespace veths that carried their ports (a veth's peer in
    a host goes with it): one ``ovs-vsctl`` and one ``ip -batch``, whatever the network's size."""
    if names:
        cmd = ["ovs-vsctl", "--timeout=60"]
        for name in names:
            cmd += ["--", "--if-exists", "del-br", name]
        runner(cmd)
    prefixes = tuple(f"{name}-eth" for name in names)
    delete_links(runner, [i for i in links_with_prefix(runner, NAME_PREFIX) if i.startswith(prefixes)])


def delete_links(runner: Runner, names: Sequence[str]) -> None:
    """``ip link del`` of every named interface, in one ``ip -force -batch`` (it goes on past one already gone)."""
    if not names:
        return
    fd, path = tempfile.mkstemp(prefix=f"{NAME_PREFIX}-links-", suffix=".batch")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write("".join(f"link del dev {name}\n" for name in names))
        runner(["ip", "-force", "-batch", path])
    finally:
        os.unlink(path)


def remove_check_namespaces(runner: Runner) -> list[str]:
    """Delete the network namespaces of ``emu cluster check``'s MTU probe (``efchk-*``) left by a killed check."""
    res = runner(["ip", "-j", "netns", "list"])
    try:
        listed = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        return []
    names = [n["name"] for n in listed if isinstance(n, dict) and str(n.get("name", "")).startswith(
        CHECK_NAMESPACE_PREFIX)]
    for name in names:
        runner(["ip", "netns", "delete", name])
    return [f"deleted {len(names)} network namespaces of emu cluster check: {' '.join(names)}"] if names else []


def end_shared_connections(runner: Runner) -> list[str]:
    """End the ssh masters a killed cluster head left (:func:`emulator.emulation.cluster.remote_shell.open_shared`;
    each would end by itself when idle) and remove their folder."""
    folder = ssh_folder()
    try:
        sockets = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    for name in sockets:
        runner(["ssh", "-F", "none", "-o", f"ControlPath={os.path.join(folder, name)}", "-O", "exit", "ef-cluster"])
    remove_ssh_folder()
    return [f"ended {len(sockets)} shared ssh connections"] if sockets else []


def clean(force: bool = False, runner: Runner = run, network_lock_held: bool = False) -> list[str]:
    """Remove leftovers; return one line per thing done.

    Bridges and interfaces are left alone while another run is alive (it may
    be a network), unless the caller holds the network lock.
    """
    report: list[str] = []
    active = []
    for state in all_runs():
        if state.owner_alive() and not force:
            owner = state.owner() or {}
            active.append(state)
            report.append(f"left run {state.run_id} alone: its owner (pid {owner.get('pid')}) is still "
                          "running (use --force)")
            continue
        killed = kill_recorded(state)
        if killed:
            report.append(f"run {state.run_id}: killed {len(killed)} processes")
        state.remove()
    if active and not network_lock_held:
        return report  # their bridges share our name pattern: leave all bridges alone
    if not active:  # no live run here: no network of this head needs its servers' shared connections
        report += end_shared_connections(runner)
    res = runner(["ovs-vsctl", "--timeout=10", "list-br"])
    bridges = [b for b in res.stdout.split() if BRIDGE_RE.match(b)]
    if bridges:
        remove_our_bridges(runner, bridges)
        report.append(f"deleted {len(bridges)} bridges: {' '.join(bridges[:8])}{' ...' if len(bridges) > 8 else ''}")
    stray = [name for name in links_with_prefix(runner, NAME_PREFIX) if INTERFACE_RE.match(name)]
    if not network_lock_held:  # a user's `emu clean`: also what a killed `emu cluster check` left
        stray += [name for name in links_with_prefix(runner, NAME_PREFIX) if CHECK_DEVICE_RE.match(name)]
        report += remove_check_namespaces(runner)
    delete_links(runner, stray)
    if stray:
        report.append(f"deleted {len(stray)} interfaces")
    if not report:
        report.append("nothing of ours to clean")
    return report
