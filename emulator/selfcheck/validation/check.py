"""A published table predicted size by size and judged per regime.

Three regimes, by size alone, the same for every table:

* **latency floor**: the four smallest posted sizes of at most 64 KiB, within
  30 % of real;
* **plateau**: the three largest posted sizes of at least 64 MiB (a table of
  peaks: its peak), within 15 %;
* **middle**: every other posted size from 1 MiB up, within 35 %.

Sizes between the floor and 1 MiB are shown, not judged. A regime without a
posted size is ``unchecked``, never a pass; a table is ``pass`` when every
regime it has passes, ``fail`` when one fails, ``unchecked`` when it has none
(or lacks what a prediction needs).
The ratio is predicted time over real time (for a size posted only as a bus
bandwidth: real bus bandwidth over predicted, the same quotient).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model.nccl import cost, tuning
from emulator.model.nccl.cost import Prediction
from emulator.selfcheck.validation.tables import Measured, Table

KiB, MiB = 1 << 10, 1 << 20
FLOOR_MAX_BYTES = 64 * KiB
FLOOR_SIZES = 4
MIDDLE_MIN_BYTES = 1 * MiB
PLATEAU_MIN_BYTES = 64 * MiB
PLATEAU_SIZES = 3
BANDS = {"latency floor": 0.30, "middle": 0.35, "plateau": 0.15}
REGIMES = tuple(BANDS)


@dataclass(frozen=True)
class RowCheck:
    measured: Measured
    prediction: Prediction
    regime: str  # one of REGIMES, or "" (shown, not judged)
    factor: float = 1.0  # nccl-tests' bus-bandwidth factor of the table's collective and ranks

    @property
    def predicted_busbw_gbs(self) -> float:
        return self.prediction.nbytes / (self.prediction.time_us * 1e3) * self.factor

    @property
    def ratio(self) -> float:
        """Predicted time over real time."""
        m = self.measured
        if m.time_us:
            return self.prediction.time_us / m.time_us
        return (m.busbw_gbs or 0.0) / self.predicted_busbw_gbs

    @property
    def within(self) -> bool:
        return not self.regime or abs(self.ratio - 1.0) <= BANDS[self.regime]


@dataclass(frozen=True)
class RegimeCheck:
    name: str
    rows: tuple[RowCheck, ...]

    @property
    def band(self) -> float:
        return BANDS[self.name]

    @property
    def verdict(self) -> str:
        if not self.rows:
            return "unchecked"
        return "pass" if all(r.within for r in self.rows) else "fail"

    @property
    def worst(self) -> RowCheck | None:
        return max(self.rows, key=lambda r: abs(r.ratio - 1.0), default=None)


@dataclass(frozen=True)
class TableCheck:
    table: Table
    rows: tuple[RowCheck, ...]
    regimes: tuple[RegimeCheck, ...]

    @property
    def verdict(self) -> str:
        verdicts = [r.verdict for r in self.regimes if r.verdict != "unchecked"]
        if not verdicts:
            return "unchecked"
        return "fail" if "fail" in verdicts else "pass"


def regime_of(table: Table) -> dict[int, str]:
    """Size -> regime for the table's posted sizes (see the module docstring)."""
    sizes = sorted(m.size for m in table.rows if m.time_us or m.busbw_gbs)
    if table.plateau_only:
        return dict.fromkeys(sizes, "plateau")
    out = dict.fromkeys([s for s in sizes if s <= FLOOR_MAX_BYTES][:FLOOR_SIZES], "latency floor")
    plateau = [s for s in sizes if s >= PLATEAU_MIN_BYTES][-PLATEAU_SIZES:]
    out.update(dict.fromkeys(plateau, "plateau"))
    out.update({s: "middle" for s in sizes if s >= MIDDLE_MIN_BYTES and s not in out})
    return out


def check(table: Table) -> TableCheck:
    """Predict every posted size of ``table`` and judge its regimes."""
    if table.system is None:
        return TableCheck(table, (), tuple(RegimeCheck(name, ()) for name in REGIMES))
    regimes = regime_of(table)
    factor = table.op.factor(table.system.ranks)
    channels = None
    if table.min_channels is not None:  # NCCL runs at least that many, at least its own count
        channels = max(table.min_channels, tuning.search(table.system).runtime_channels)
    rows = []
    for m in table.rows:
        if not (m.time_us or m.busbw_gbs):
            continue
        prediction = cost.predict(table.system, table.op.collective, m.size, table.algorithm, table.protocol,
                                  channels)
        rows.append(RowCheck(m, prediction, regimes.get(m.size, ""), factor))
    judged = tuple(RegimeCheck(name, tuple(r for r in rows if r.regime == name)) for name in REGIMES)
    return TableCheck(table, tuple(rows), judged)
