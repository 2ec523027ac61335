"""The machine underneath: command running, root, Open vSwitch, kernel features.

Small functions that take their command runner as a parameter, so what they
run can be checked in unit tests with a fake runner. Nothing here starts a
network; :mod:`emulator.emulation.network.emulated_network` does.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from emulator.base.errors import UserError


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], Result]


def run(cmd: Sequence[str], timeout: float = 60.0) -> Result:
    """Run a command (argument list, never through a shell) and capture its output."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)  # never the caller's input (ssh would forward it)
    except FileNotFoundError:
        return Result(127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Result(124, "", f"{shlex.join(cmd)}: timed out after {timeout:g} s")
    return Result(proc.returncode, proc.stdout, proc.stderr)


def end_by_closing_input(proc: subprocess.Popen[str], grace_s: float) -> None:
    """End a process that runs until its input ends (an agent launcher, a lock holder over ssh): close its
    input, give it ``grace_s`` to exit, kill it after that; then close the pipes of its output."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(grace_s)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError("this command builds a network: run it as root (sudo)")


def ovs_kernel_module_loaded(sys_module_dir: str = "/sys/module") -> bool:
    """True when the openvswitch kernel module is present (loaded or built in)."""
    return os.path.isdir(os.path.join(sys_module_dir, "openvswitch"))


def choose_datapath(requested: str = "auto", module_loaded: bool | None = None) -> str:
    """``"kernel"`` where the openvswitch module exists, else ``"user"`` (or what was asked for)."""
    if requested not in ("auto", "user", "kernel"):
        raise UserError(f"network: field 'datapath': expected auto, user or kernel, got {requested!r}")
    if requested != "auto":
        if requested == "kernel" and not (ovs_kernel_module_loaded() if module_loaded is None else module_loaded):
            raise UserError("network: field 'datapath': expected auto or user (this kernel has no "
                            "openvswitch module), got 'kernel'")
        return requested
    loaded = ovs_kernel_module_loaded() if module_loaded is None else module_loaded
    return "kernel" if loaded else "user"


def netem_available(runner: Runner = run) -> bool:
    """True when the kernel offers the netem qdisc (needed for delay and loss)."""
    probe = "efnetemprobe"
    made = runner(["ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "1"])
    if made.returncode != 0:
        return False
    try:
        return runner(["tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms"]).returncode == 0
    finally:
        runner(["ip", "link", "del", probe])


def has_netem(sys_module_dir: str = "/sys/module", modules_dir: str = "/lib/modules") -> bool:
    """Whether this kernel has netem, from files alone (loaded, built in, or a module to load); no side effects.

    :func:`netem_available` is the proof, at bring-up.
    """
    if os.path.isdir(os.path.join(sys_module_dir, "sch_netem")):
        return True
    release = os.path.join(modules_dir, platform.release())
    try:
        with open(os.path.join(release, "modules.builtin"), encoding="utf-8") as fh:
            if any(line.rstrip().endswith("/sch_netem.ko") for line in fh):
                return True
    except OSError:
        pass
    sched = os.path.join(release, "kernel", "net", "sched")
    return os.path.isdir(sched) and any(name.startswith("sch_netem.ko") for name in os.listdir(sched))


def ovs_version(runner: Runner = run) -> str | None:
    """The installed Open vSwitch's version (from the binary: no database access needed), or None."""
    res = runner(["ovs-vswitchd", "--version"])
    if res.returncode != 0 or not res.stdout.split():
        return None
    return res.stdout.splitlines()[0].split()[-1]


def machine_identity(runner: Runner = run) -> dict[str, Any]:
    """What a calibration is valid for: this kernel, this Open vSwitch and this many CPUs."""
    return {"kernel": platform.release(), "ovs_version": ovs_version(runner), "nproc": os.cpu_count()}


def require_ovs(runner: Runner = run) -> str:
    """Check that ovsdb-server and ovs-vswitchd answer; return the OVS version."""
    res = runner(["ovs-vsctl", "--timeout=5", "get", "Open_vSwitch", ".", "ovs_version"])
    if res.returncode != 0:
        raise UserError("Open vSwitch is not running (ovs-vsctl cannot reach it): run `make setup` "
                        "or /usr/share/openvswitch/scripts/ovs-ctl start")
    return res.stdout.strip().strip('"')


def require_tools(names: Sequence[str], which: Callable[[str], str | None] | None = None) -> None:
    """Raise :class:`UserError` naming every program of ``names`` not on the PATH (``which`` finds them)."""
    find = which or shutil.which
    missing = [n for n in names if find(n) is None]
    if missing:
        raise UserError(f"missing programs: {', '.join(missing)}: run `make setup`")


def cpu_times() -> tuple[float, float]:
    """(idle, total) CPU seconds summed over all CPUs since boot; idle counts I/O wait, and the time of niced
    processes (niceness > 0: everything else runs first, so it is time the emulation could have had;
    ``emu mpirun`` runs Open MPI's busy-polling ranks so).

    Only differences of two readings mean anything: their ratio is the idle
    share of the time in between.
    """
    times = psutil.cpu_times()
    spare = times.idle + getattr(times, "iowait", 0.0) + getattr(times, "nice", 0.0)
    return spare, float(sum(times))


def cgroup_memory_headroom(proc_cgroup: str, root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's memory cgroup still allows (limit less usage), or None when it sets no limit.

    ``proc_cgroup`` is the text of ``/proc/self/cgroup``; cgroup v2
    (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``,
    ``memory.usage_in_bytes``) are both read. A container's limit can be far
    below what ``/proc/meminfo`` shows.
    """
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            files = (os.path.join(root, path.lstrip("/"), "memory.max"),
                     os.path.join(root, path.lstrip("/"), "memory.current"))
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "memory", path.lstrip("/"))
            files = (os.path.join(base, "memory.limit_in_bytes"), os.path.join(base, "memory.usage_in_bytes"))
        else:
            continue
        try:
            with open(files[0], encoding="ascii") as fh:
                limit_text = fh.read().strip()
            with open(files[1], encoding="ascii") as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 1 << 60:
            continue
        return max(0, int(limit_text) - usage)
    return None


def memory_available() -> tuple[int, int]:
    """(bytes available now, total bytes): the kernel's MemAvailable, within this process's cgroup limit."""
    vm = psutil.virtual_memory()
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            headroom = cgroup_memory_headroom(fh.read())
    except OSError:
        headroom = None
    available = vm.available if headroom is None else min(vm.available, headroom)
    return int(available), int(vm.total)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages to two decimals, as ``/proc/loadavg`` shows them ([] where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, so a terminated command tears down as Ctrl-C does."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
