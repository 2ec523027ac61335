"""``emu validate``: the NCCL model against published nccl-tests tables from real clusters.

Every table of ``emulator/selfcheck/validation/tables`` (or the files given)
is predicted size by size with one set of rules; each prints predicted/real
per size and a verdict per regime (latency floor, middle, plateau). Exit
status 1 when any regime is outside its band, 0 otherwise. ``--plots DIR``
draws predicted against real time and bus bandwidth, one PNG per table.
"""

from __future__ import annotations

import argparse
import json

from emulator.base.errors import FieldError
from emulator.selfcheck.validation import check, tables
from emulator.selfcheck.validation.check import TableCheck


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="the NCCL model against published nccl-tests tables")
    p.add_argument("files", nargs="*", metavar="TABLE.yaml", help="tables to check (default: every bundled one)")
    p.add_argument("--table", action="append", default=[], metavar="NAME", help="only the bundled table NAME")
    p.add_argument("--plots", metavar="DIR", help="write one PNG per table into DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_validate)


def _selected(args: argparse.Namespace) -> list[tables.Table]:
    found = [t for path in args.files for t in tables.load(path)] if args.files else tables.load_all()
    if args.table:
        names = {t.name.split(".")[0] for t in found}
        for name in args.table:
            if name not in names and name not in {t.name for t in found}:
                raise FieldError("validate", "table", "one of " + ", ".join(sorted(names)), name)
        found = [t for t in found if t.name.split(".")[0] in args.table or t.name in args.table]
    return found


def _ratio(value: float) -> str:
    return f"{value:5.2f}"


def print_check(result: TableCheck) -> None:
    t = result.table
    print(f"== {t.name}: {result.verdict}")
    print(f"   {t.title}")
    print(f"   source: {t.url or '(not a URL: see the table file)'}")
    if t.system is None:
        print(f"   not predicted: {t.unusable}")
        return
    print(f"   model: {t.system.describe()}, {t.op.binary}, algorithm {t.algorithm}, protocol {t.protocol}")
    for line in t.assumptions:
        print(f"   assumed: {line}")
    print(f"   {'size':>12}  {'real us':>9}  {'real busbw':>10}  {'model us':>9}  {'model busbw':>11}  pred/real"
          f"  {'NCCL choice':>14}  regime")
    for r in result.rows:
        m = r.measured
        real_t = f"{m.time_us:9.2f}" if m.time_us else f"{'-':>9}"
        real_b = f"{m.busbw_gbs:10.2f}" if m.busbw_gbs is not None else f"{'-':>10}"
        flag = "" if r.within else "  OUT"
        choice = f"{r.prediction.algorithm}/{r.prediction.protocol}"
        print(f"   {m.size:12d}  {real_t}  {real_b}  {r.prediction.time_us:9.2f}  {r.predicted_busbw_gbs:11.2f}  "
              f"{_ratio(r.ratio):>9}  {choice:>14}  {r.regime or '-'}{flag}")
    for regime in result.regimes:
        worst = regime.worst
        detail = f" (worst {worst.measured.size} B: {worst.ratio:.2f})" if worst else ""
        print(f"   {regime.name} (within {regime.band:.0%}): {regime.verdict}{detail}")


def to_json(result: TableCheck) -> dict:
    return {"table": result.table.name, "verdict": result.verdict, "url": result.table.url,
            "assumptions": list(result.table.assumptions), "unusable": result.table.unusable,
            "regimes": {r.name: {"verdict": r.verdict, "band": r.band,
                                 "worst_ratio": round(r.worst.ratio, 4) if r.worst else None} for r in result.regimes},
            "rows": [{"size": r.measured.size, "real_time_us": r.measured.time_us,
                      "real_busbw_GBps": r.measured.busbw_gbs, "model_time_us": round(r.prediction.time_us, 3),
                      "model_busbw_GBps": round(r.predicted_busbw_gbs, 3), "ratio": round(r.ratio, 4),
                      "algorithm": r.prediction.algorithm, "protocol": r.prediction.protocol, "regime": r.regime}
                     for r in result.rows]}


def cmd_validate(args: argparse.Namespace) -> int:
    results = [check.check(t) for t in _selected(args)]
    if args.plots:
        from emulator.selfcheck.validation import plots  # matplotlib only when drawing
        for result in results:
            plots.draw(result, args.plots)
    counts = {v: sum(r.verdict == v for r in results) for v in ("pass", "fail", "unchecked")}
    if args.json:
        print(json.dumps({"tables": [to_json(r) for r in results], "counts": counts}, sort_keys=True))
    else:
        for result in results:
            print_check(result)
            print()
        print(f"{len(results)} tables: {counts['pass']} pass, {counts['fail']} fail, {counts['unchecked']} unchecked "
              "(bands: latency floor 30 %, middle 35 %, plateau 15 %)")
    return 1 if counts["fail"] else 0
