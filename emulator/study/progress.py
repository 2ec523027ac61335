"""What ``emu run`` prints while it runs: progress bar, time left, one line per network and per cell.

Every console line of the live loop (:mod:`emulator.study.live.runner`) goes through
:class:`Progress`, which keeps the count of cells done and the ids still to
run, and asks :class:`Eta` how long those will take. The file log
(``run.log``) is :meth:`emulator.study.folder.results_folder.ResultsFolder.log`'s, not this
module's.

:class:`Eta` starts from the timing model: each cell's predicted seconds per
repetition times its repetitions, plus :data:`DEFAULT_CELL_OVERHEAD_S` of
agent start-up, plus :data:`DEFAULT_BRINGUP_S` per network still to bring up.
Once cells have run it scales the prediction by how much slower than the model
they actually were, and uses the measured bring-up times, so the estimate
corrects itself as the run goes on.

Pure: it writes to the stream it is given and reads nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import TextIO

from emulator.base.progress import format_duration, progress_bar
from emulator.model import routing
from emulator.study import experiment as xp

#: Until measured: seconds of agent start-up per cell and of bring-up + teardown per network.
DEFAULT_CELL_OVERHEAD_S = xp.CELL_OVERHEAD_S
DEFAULT_BRINGUP_S = 10.0
#: Seconds of teardown added to a network's own bring-up time (which does not include it).
TEARDOWN_S = 4.0
#: Flags left out of the per-cell line: every cell of a machine without a calibration has it.
QUIET_FLAGS = frozenset({"uncalibrated"})


class Eta:
    """Time left: the model's prediction of the remaining cells, scaled by what was seen so far."""

    def __init__(self, prepared: Mapping[str, xp.PreparedCell]):
        self.prepared = prepared
        self.cell_s: list[float] = []  # measured wall seconds of run cells
        self.raw_s: list[float] = []  # their prediction-based estimate without overhead
        self.bringup_s: list[float] = []

    def observe_cell(self, cell_id: str, wall_s: float) -> None:
        """A cell that finished ok took ``wall_s`` seconds."""
        self.cell_s.append(wall_s)
        self.raw_s.append(xp.estimate_s(self.prepared[cell_id], 0.0))

    def observe_bringup(self, seconds: float) -> None:
        """A network took ``seconds`` to come up and (estimated) go away."""
        self.bringup_s.append(seconds)

    def remaining_s(self, cell_ids: Iterable[str], networks_left: int) -> float:
        """Seconds to run ``cell_ids`` and bring up ``networks_left`` more networks."""
        if self.cell_s:
            # wall = overhead + scale * prediction, fitted as a ratio of sums with the overhead fixed
            overhead = min(DEFAULT_CELL_OVERHEAD_S, min(self.cell_s))
            raw = sum(self.raw_s)
            scale = (sum(self.cell_s) - overhead * len(self.cell_s)) / raw if raw > 0 else 1.0
            scale = max(scale, 0.5)
        else:
            overhead, scale = DEFAULT_CELL_OVERHEAD_S, 1.5
        bringup = statistics.mean(self.bringup_s) if self.bringup_s else DEFAULT_BRINGUP_S
        cells = sum(overhead + scale * xp.estimate_s(self.prepared[c], 0.0) for c in cell_ids)
        return cells + networks_left * bringup


class Progress:
    """The console of one ``emu run``: ``total`` cells, of which :meth:`begin` says which are left.

    Call :meth:`begin` once, then :meth:`network` before each network's
    cells and :meth:`cell_ok` / :meth:`cell_failed` after each cell.
    """

    def __init__(self, stream: TextIO, eta: Eta, total: int):
        self.stream = stream
        self.eta = eta
        self.total = total
        self.done = 0
        self.remaining: list[str] = []
        self.networks = 0
        self.networks_started = 0

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _eta_s(self) -> float:
        return self.eta.remaining_s(self.remaining, self.networks - self.networks_started)

    def begin(self, out: str, skipped: int, remaining: Iterable[str], networks: int) -> None:
        """The run starts with ``skipped`` cells finished before, ``remaining`` to run on ``networks`` networks."""
        self.done, self.remaining, self.networks, self.networks_started = skipped, list(remaining), networks, 0
        if skipped:
            self.say(f"resuming {out}: {skipped} of {self.total} cells finished before, skipped")
        self.say(f"{progress_bar(self.done, self.total)} {self.done}/{self.total} cells, {networks} networks to "
                 f"bring up, ETA {format_duration(self._eta_s())}")

    def network(self, spec: str, policy: str, seed: int, cells: int) -> None:
        """The next network is coming up for ``cells`` cells."""
        self.networks_started += 1
        seed_text = routing.seed_words(policy, seed)
        self.say(f"network {self.networks_started}/{self.networks}: {spec} ({policy}{seed_text}), {cells} cells")

    def rebuilding(self, reason: str) -> None:
        self.say(f"  network failed its probe ({reason}): rebuilding it")

    def damaged(self, reason: str) -> None:
        self.say(f"  network broken ({reason}): rebuilding it")

    def probe_failed_again(self, reason: str, flag: str) -> None:
        self.say(f"  network failed its probe again ({reason}): its cells are flagged {flag} and not trusted")

    def _head(self, cell_id: str) -> str:
        if cell_id in self.remaining:
            self.remaining.remove(cell_id)
        self.done += 1
        return (f"{progress_bar(self.done, self.total)} {self.done}/{self.total} "
                f"ETA {format_duration(self._eta_s())}  {cell_id}: ")

    def cell_ok(self, cell_id: str, line: str) -> None:
        """A cell finished ok; ``line`` is what its kind says of it
        (:meth:`emulator.study.cell_kinds.CellKind.line`)."""
        self.say(self._head(cell_id) + line)

    def cell_failed(self, cell_id: str, error: str | None) -> None:
        self.say(self._head(cell_id) + f"FAILED ({error})")

    def interrupted(self, out: str) -> None:
        self.say(f"interrupted: {self.done} of {self.total} cells finished and kept in {out}; "
                 "run the same command again to finish the rest")
