"""Fake agents for tests without root: real processes speaking the control protocol, no network.

:class:`FakeLauncher` stands in for :class:`emulator.emulation.agents.agent_launcher.AgentLauncher`:
it starts :data:`FAKE_AGENT` (plain ``python -c``, in no namespace) with the
argument list the fleet builds. Each fake agent reads the schedule it is
given, says ``hello`` and ``ready``, and answers every ``go`` with a
``done`` whose operation times are made up from ``start_at``: operation
``op`` of step ``k`` runs from ``start_at + k * STEP_S`` to one step later;
every send carries its details. What a rank does is its *behaviour*
(``ok`` unless the launcher says otherwise):

* ``ok`` -- as above; ``wrong`` -- the same, but its data is wrong;
* ``hang`` -- never answers a ``go``; ``exit`` -- exits with status 3 on a ``go``;
* ``error`` -- answers a ``go`` with an ``error`` message (``boom``);
* ``oom`` -- before ``ready``, reports running out of its memory limit as a real agent does (an ``error``
  with ``out_of_memory``, then exit status :data:`emulator.emulation.machine.confinement.OUT_OF_MEMORY_STATUS`);
  ``oom_exit`` -- only exits with that status, before ``ready``.

The launcher records the memory limit of every spawn (``memory_limits``, in spawn order); the fake agents
run without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_S = 0.01

FAKE_AGENT = r"""
import json, os, sys, time
from emulator.emulation.machine.confinement import OUT_OF_MEMORY_STATUS
from emulator.emulation.agents.agent_protocol import AgentChannel, Msg
from emulator.model.schedule import format as sformat

STEP_S = float(os.environ["EF_FAKE_STEP_S"])
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
rank = int(args["--rank"])
behaviour = json.loads(os.environ["EF_FAKE_AGENTS"]).get(str(rank), "ok")
program = sformat.load(args["--schedule"]).ranks[rank]
channel = AgentChannel(args["--control"])
channel.send(Msg.HELLO, rank=rank)
if behaviour == "oom":
    channel.send(Msg.ERROR, rank=rank, message="agent: out of memory", out_of_memory=True, memory_limit=1)
if behaviour in ("oom", "oom_exit"):
    sys.exit(OUT_OF_MEMORY_STATUS)
channel.send(Msg.READY, rank=rank)
while True:
    msg = channel.receive()
    if msg["type"] == Msg.QUIT:
        sys.exit(0)
    if behaviour == "hang":
        time.sleep(60)
    if behaviour == "exit":
        sys.exit(3)
    if behaviour == "error":
        channel.send(Msg.ERROR, rank=rank, message="boom")
        continue
    for step in msg["watch_steps"]:
        channel.send(Msg.STEP, rank=rank, step=step)
    start = msg["start_at"]
    ops = [[op.id, start + op.step * STEP_S, start + (op.step + 1) * STEP_S] for op in program.ops]
    sends = {str(op.id): [start, start, start + op.step * STEP_S, 0.0] for op in program.ops if op.kind == "send"}
    channel.send(Msg.DONE, rank=rank, rep=msg["rep"], ops=ops, sends=sends, correct=behaviour != "wrong",
                 wrong="element 3 is 7.0" if behaviour == "wrong" else None)
"""


class FakeLauncher:
    """Starts one :data:`FAKE_AGENT` per spawn; ``behaviours`` maps a rank to its behaviour.

    ``fail_at``: the spawn with this index raises, as a launcher that died would.
    """

    def __init__(self, behaviours: dict[int, str] | None = None, fail_at: int | None = None):
        self.behaviours = behaviours or {}
        self.fail_at = fail_at
        self.spawned: list[tuple[int, list[str], subprocess.Popen]] = []
        self.memory_limits: list[int | None] = []

    def spawn(self, netns_pid: int, argv: list[str], output: str, memory_limit: int | None = None) -> subprocess.Popen:
        self.memory_limits.append(memory_limit)
        if self.fail_at is not None and len(self.spawned) == self.fail_at:
            raise RuntimeError("the agent launcher is gone")
        env = dict(os.environ, PYTHONPATH=ROOT, EF_FAKE_STEP_S=str(STEP_S),
                   EF_FAKE_AGENTS=json.dumps({str(r): b for r, b in self.behaviours.items()}))
        with open(output, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", FAKE_AGENT, *argv], stdout=out, stderr=out, cwd=ROOT,
                                    env=env)
        self.spawned.append((netns_pid, list(argv), proc))
        return proc

    def processes(self) -> list[subprocess.Popen]:
        return [proc for _, _, proc in self.spawned]
