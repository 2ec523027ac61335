"""One PNG per validated table: predicted against real time (left) and bus bandwidth (right), by size."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from emulator.selfcheck.validation.check import TableCheck  # noqa: E402


def draw(result: TableCheck, folder: str) -> str | None:
    """Write ``folder/<table>.png``; None for a table without predicted rows."""
    rows = result.rows
    if not rows:
        return None
    os.makedirs(folder, exist_ok=True)
    sizes = [r.measured.size for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    timed = [r for r in rows if r.measured.time_us]
    left.loglog([r.measured.size for r in timed], [r.measured.time_us for r in timed], "o-", label="real")
    left.loglog(sizes, [r.prediction.time_us for r in rows], "s--", label="model")
    left.set_xlabel("size (bytes)")
    left.set_ylabel("time (us)")
    left.legend()
    real_bus = [(r.measured.size, r.measured.busbw_gbs) if r.measured.busbw_gbs is not None
                else (r.measured.size, r.measured.size / ((r.measured.time_us or 1.0) * 1e3) * r.factor) for r in rows]
    right.semilogx([s for s, _ in real_bus], [b for _, b in real_bus], "o-", label="real")
    right.semilogx(sizes, [r.predicted_busbw_gbs for r in rows], "s--", label="model")
    right.set_xlabel("size (bytes)")
    right.set_ylabel("bus bandwidth (GB/s)")
    right.legend()
    fig.suptitle(f"{result.table.name}: {result.verdict}", fontsize=10)
    fig.tight_layout()
    path = os.path.join(folder, f"{result.table.name}.png")
    tmp = f"{path}.tmp"
    try:
        fig.savefig(tmp, format="png", dpi=90)
        os.replace(tmp, path)  # a reader never sees half a plot
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
