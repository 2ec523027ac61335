"""The report of an experiment's results folder: ``report.md``, ``report.html``, ``cells.csv``, ``summary.json``, plots.

Pure: it only reads what :class:`emulator.runner.Runner` and the replay wrote
(``experiment.json``, ``state.json``, ``cells/<id>/results.json``,
``timeline.jsonl``, ``schedule.json``, ``topology.json``) and writes into the
same folder, so ``emu report DIR`` can rewrite it at any time, also for an
unfinished run. Matplotlib runs with the Agg backend (no display).

What it shows, all from median busbw (nccl-tests definition) of the measured
repetitions, with the model's prediction (``schedule check``, max-min fair
flow level) beside every number:

* first, the answers to the paper's questions in a few sentences
  (:mod:`emulator.answers` picks and phrases them; ``summary.json`` holds them
  as numbers);
* the speedup of the reference (by default BiGraph + hdrm) over every other
  topology x routing x algorithm of the same series and host count, per size;
  ECMP seeds are folded into one row (median over seeds, range given); every
  speedup has its 95% hierarchical bootstrap interval over repetitions and
  seeds (:mod:`emulator.stats`) and says when that contains 1; cells at
  different link rates compare efficiencies (busbw / link goodput), not busbw;
* one NIC per accelerator against a shared NIC, where server designs exist;
* busbw against size, one line per topology x routing x algorithm;
* a per-step heat map of every directed switch-to-switch link for one
  congested and one clean cell: flows the model puts on the link, and the
  mean goodput the transfers crossing it got (timeline + routing.route);
* a timeline (Gantt) of the same two cells' first measured repetition;
* scaling efficiency (busbw / link goodput) against the number of hosts, for
  every family of cells measured at more than one host count;
* every cell: measured against predicted, fidelity flags, failures.
"""

from __future__ import annotations

import csv
import html
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from emulator import fabric, paper_scale, stats, topology
from emulator.files import read_json, read_jsonl, write_atomic, write_json_atomic
from emulator.report import answers
from emulator.schedule.format import format_size

CSV_FIELDS = ("id", "series", "topology", "kind", "hosts", "routing", "seed", "algorithm", "placement", "size",
              "status", "outcome", "busbw_mbps", "busbw_min_mbps", "busbw_max_mbps", "time_s", "predicted_time_s",
              "predicted_busbw_mbps", "alpha_beta_time_s", "measured_over_predicted", "max_flows_per_link",
              "trusted", "flags", "qdisc_drops", "tcp_retransmits", "repetitions", "wall_s", "error")
LEGACY_GOODPUT = 1448 / 1514  # TCP payload per wire byte at MTU 1500, for results whose prediction has no goodput
RESAMPLES = stats.DEFAULT_RESAMPLES  # bootstrap resamples behind every speedup's interval


# ------------------------------------------------------------------ blocks
@dataclass
class Doc:
    """A report as blocks, rendered to Markdown and to HTML."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: Iterable[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (head, rows)))

    def img(self, path: str, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def markdown(self) -> str:
        out = []
        for kind, data in self.blocks:
            if kind == "h":
                out.append("#" * data[0] + " " + data[1])
            elif kind == "p":
                out.append(data)
            elif kind == "ul":
                out.append("\n".join(f"- {item}" for item in data) if data else "- (none)")
            elif kind == "table":
                head, rows = data
                lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"![{data[1]}]({data[0]})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
               "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;"
               "text-align:left}img{max-width:100%}code{background:#f4f4f4}</style></head><body>"]
        for kind, data in self.blocks:
            if kind == "h":
                out.append(f"<h{data[0]}>{e(data[1])}</h{data[0]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(data)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in data) + "</ul>")
            elif kind == "table":
                head, rows = data
                out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                           + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                                     for row in rows) + "</table>")
            elif kind == "img":
                out.append(f"<p><img src='{e(data[0])}' alt='{e(data[1])}'></p>")
        return "\n".join(out) + "</body></html>\n"


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** (the only inline Markdown the report uses)."""
    parts = html.escape(text).split("`")
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    text = "".join(parts)
    bits = text.split("**")
    for i in range(1, len(bits), 2):
        bits[i] = f"<b>{bits[i]}</b>"
    return "".join(bits)


# -------------------------------------------------------------- reading


def family_of(row: dict[str, Any], with_seed: bool = False) -> str:
    """``leafspine-4x4x4 ecmp hd`` (the label of a line or a table row)."""
    algo = row["algorithm"] if row["placement"] in ("identity", "hdrm") else f"{row['algorithm']}-{row['placement']}"
    routing = f"{row['routing']}-s{row['seed']}" if with_seed and row["routing"] == "ecmp" else row["routing"]
    return f"{row['topology_slug']} {routing} {algo}"


def load_rows(out: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experiment and one row per cell (planned cells that never ran have status ``not run``)."""
    plan = read_json(os.path.join(out, "experiment.json"))
    if not isinstance(plan, dict):
        raise FileNotFoundError(f"{out}: no experiment.json (not a results folder of `emu run`)")
    state = (read_json(os.path.join(out, "state.json")) or {}).get("cells", {})
    rows = []
    for cell in plan["cells"]:
        cdir = os.path.join(out, "cells", cell["id"])
        res = read_json(os.path.join(cdir, "results.json")) or {}
        st = state.get(cell["id"], {})
        reps = res.get("repetitions") or []
        finished = res.get("status") == "ok" and (res.get("config") or {}).get("cell", {}).get("id") == cell["id"]
        status = "ok" if finished else (st.get("status") or res.get("status") or "not run")
        if status == "running":
            status = "interrupted"
        pred = res.get("prediction") or {}
        flags = sorted({f for r in reps for f in (r.get("fidelity") or {}).get("flags", [])})
        busbws = [r["busbw_mbps"] for r in reps]
        slug = cell["id"].split(".")[1]
        params = topology.parse_spec(cell["topology"])[1]
        link_mbps = res.get("link_mbps") or plan["experiment"]["link_mbps"]
        rows.append({
            **{k: cell[k] for k in ("id", "series", "topology", "kind", "hosts", "routing", "seed", "algorithm",
                                    "placement", "size")},
            "topology_slug": slug,
            "status": status,
            "busbw_mbps": res.get("busbw_mbps_median") if finished else None,
            "busbw_min_mbps": min(busbws) if busbws and finished else None,
            "busbw_max_mbps": max(busbws) if busbws and finished else None,
            "time_s": res.get("time_s_median") if finished else None,
            "predicted_time_s": pred.get("predicted_time_s", cell.get("predicted_time_s")),
            "predicted_busbw_mbps": pred.get("busbw_mbps", cell.get("predicted_busbw_mbps")),
            "alpha_beta_time_s": pred.get("alpha_beta_time_s", cell.get("alpha_beta_time_s")),
            "measured_over_predicted": res.get("measured_over_predicted_median") if finished else None,
            "max_flows_per_link": max(pred.get("max_flows_per_link") or [cell.get("max_flows_per_link", 0)]),
            "trusted": res.get("trusted") if finished else None,
            "flags": flags,
            "qdisc_drops": sum((r.get("fidelity") or {}).get("qdisc_drops", 0) for r in reps),
            "tcp_retransmits": sum((r.get("fidelity") or {}).get("tcp_retransmits", 0) for r in reps),
            "repetitions": len(reps),
            "wall_s": st.get("wall_s"),
            "error": None if finished else (st.get("error") or res.get("error")),
            "goodput": pred.get("goodput"),
            "link_mbps": link_mbps,
            "capacity_mbps": link_mbps * (pred.get("goodput") or LEGACY_GOODPUT),
            "rep_busbw": busbws if finished else [],
            "datapath": res.get("datapath"),
            "outcome": res.get("outcome") or status,
            "servers": params.get("servers"),
            "accels_per_server": params.get("accels_per_server"),
            "nics_per_server": params.get("nics_per_server"),
            "server_design": _server_design(params),
            "faults": res.get("faults") or [],
            "dir": cdir,
        })
    return plan, rows


def write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({**row, "flags": " ".join(row["flags"])})
    write_atomic(path, buf.getvalue())


# ---------------------------------------------------------------- numbers
def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def is_reference(row: dict[str, Any], ref: dict[str, str]) -> bool:
    return row["algorithm"] == ref["algorithm"] and row["routing"] == ref["routing"]


def by_efficiency(rows: Iterable[dict[str, Any]]) -> bool:
    """Whether a comparison of these rows must divide efficiencies: their cells ran at different link rates."""
    return len({r["link_mbps"] for r in rows}) > 1


def speedup_interval(num: list[dict[str, Any]], den: list[dict[str, Any]],
                     efficiency: bool = False) -> stats.Interval | None:
    """The bootstrap interval of median(num) / median(den) over the repetitions of the cells, a group per cell.

    Per-repetition busbw, or busbw / link goodput when ``efficiency``. None when a side has no measured
    repetition.
    """
    def groups(rows: list[dict[str, Any]]) -> list[list[float]]:
        return [[v / (r["capacity_mbps"] if efficiency else 1.0) for v in r["rep_busbw"]]
                for r in rows if r["rep_busbw"]]

    n, d = groups(num), groups(den)
    if not n or not d:
        return None
    return stats.ratio_interval(n, d, resamples=RESAMPLES)


def _with_interval(entry: dict[str, Any], iv: stats.Interval | None) -> dict[str, Any]:
    entry["interval"] = (iv.low, iv.high) if iv else None
    entry["significant"] = stats.significant(iv) if iv else None
    return entry


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def _baseline_entry(rr: dict[str, Any] | None, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference ``rr`` against one baseline family's cells (one per ECMP seed) at one size."""
    eff = by_efficiency([rr, *cells]) if rr else False

    def values(rows: list[dict[str, Any]], key: str) -> list[float]:
        """busbw, or busbw / link goodput when the link rates differ, of the rows that have one."""
        return [r[key] / (r["capacity_mbps"] if eff else 1.0) for r in rows if r[key]]

    entry: dict[str, Any] = {"busbw": _median([c["busbw_mbps"] for c in cells]),
                             "model_busbw": _median([c["predicted_busbw_mbps"] for c in cells]),
                             "seeds": len(cells), "cells": cells, "by_efficiency": eff,
                             "speedup": None, "model_speedup": None, "range": None}
    if rr is None:
        return _with_interval(entry, None)
    ok, ref_v = values(cells, "busbw_mbps"), values([rr], "busbw_mbps")
    if ref_v and ok:
        entry["speedup"] = ref_v[0] / statistics.median(ok)
        if len(ok) > 1:
            entry["range"] = (ref_v[0] / max(ok), ref_v[0] / min(ok))
    model, ref_m = values(cells, "predicted_busbw_mbps"), values([rr], "predicted_busbw_mbps")
    if ref_m and model:
        entry["model_speedup"] = ref_m[0] / statistics.median(model)
    return _with_interval(entry, speedup_interval([rr], cells, eff))


def speedup_tables(rows: list[dict[str, Any]], ref: dict[str, str]) -> list[dict[str, Any]]:
    """Per (series, hosts) that has reference cells: the reference's busbw over every other family's, per size.

    Returns dicts with ``series``, ``hosts``, ``sizes``, ``reference`` (size -> row) and ``baselines``:
    family -> size -> {busbw, model_busbw, seeds, cells, speedup, model_speedup, range, interval,
    significant, by_efficiency}. ``speedup`` is the reference's busbw over the median of the family's
    (ECMP seeds: median over seeds, ``range`` over seeds); ``interval`` its 95% bootstrap interval over
    repetitions and seeds (:func:`speedup_interval`), ``significant`` whether that excludes 1. Cells at
    different link rates (``by_efficiency``) compare busbw / link goodput instead of busbw.
    """
    out = []
    keys = sorted({(r["series"], r["hosts"]) for r in rows if is_reference(r, ref)})
    for series, hosts in keys:
        group = [r for r in rows if r["series"] == series and r["hosts"] == hosts]
        refs = {r["size"]: r for r in group if is_reference(r, ref)}
        fams: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for r in group:
            if not is_reference(r, ref):
                fams.setdefault(family_of(r), {}).setdefault(r["size"], []).append(r)
        base = {fam: {size: _baseline_entry(refs.get(size), cells) for size, cells in by_size.items()}
                for fam, by_size in fams.items()}
        out.append({"series": series, "hosts": hosts, "sizes": sorted({r["size"] for r in group}),
                    "reference": refs, "baselines": base})
    return out


def _server_design(params: dict[str, Any]) -> str | None:
    if "servers" not in params:
        return None
    a, n = params["accels_per_server"], params["nics_per_server"]
    return "shared NIC" if n == 1 else "NIC per accelerator" if n == a else f"{n} NICs for {a}"


def _server_entry(o: dict[str, Any], sh: dict[str, Any], family: str) -> dict[str, Any]:
    eff = by_efficiency([o, sh])

    def per(r: dict[str, Any], key: str) -> float | None:
        return r[key] / r["capacity_mbps"] if r[key] and eff else r[key]

    entry = {"family": family, "size": o["size"], "own": o, "shared": sh, "by_efficiency": eff,
             "speedup": _ratio(per(o, "busbw_mbps"), per(sh, "busbw_mbps")),
             "model_speedup": _ratio(per(o, "predicted_busbw_mbps"), per(sh, "predicted_busbw_mbps"))}
    return _with_interval(entry, speedup_interval([o], [sh], eff))


def server_speedup_tables(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One NIC per accelerator against a shared NIC, for every (fabric, servers, routing, algorithm, size).

    Cells match when everything but ``nics_per_server`` and the NIC
    placement is the same. Returns dicts with ``family``, ``size``, ``own``
    and ``shared`` (rows), the measured and model ``speedup`` (own busbw
    over shared busbw; busbw / link goodput if their link rates differ,
    ``by_efficiency``), its 95% bootstrap ``interval`` over the repetitions
    and whether that excludes 1 (``significant``).
    """
    def key(r: dict[str, Any]) -> tuple:
        fabric = r["topology_slug"].split("-srv")[0]
        return (fabric, r["servers"], r["accels_per_server"], r["routing"], r["seed"], r["algorithm"],
                r["placement"], r["size"])

    own: dict[tuple, dict[str, Any]] = {}
    shared: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r["servers"] is None:
            continue
        if r["nics_per_server"] == r["accels_per_server"] and r["nics_per_server"] > 1:
            own[key(r)] = r
        elif r["nics_per_server"] == 1:
            shared[key(r)] = r
    out = []
    for k in sorted(set(own) & set(shared)):
        fabric, servers, accels, routing, seed, algo, placement, size = k
        routing_label = f"{routing}-s{seed}" if routing == "ecmp" else routing
        out.append(_server_entry(own[k], shared[k], f"{fabric} {servers}x{accels} {routing_label} {algo}"))
    return out


def _headline(table: dict[str, Any]) -> str:
    """One sentence on the largest size: the reference against its best and worst baseline, with the model.

    Baselines rank by speedup (by efficiency where link rates differ), never by busbw across link rates.
    """
    size = max(table["sizes"])
    rr = table["reference"].get(size)
    entries = {fam: by[size] for fam, by in table["baselines"].items() if by.get(size, {}).get("speedup")}
    if not rr or not rr["busbw_mbps"] or not entries:
        return ""
    ahead = [f for f, e in entries.items() if e["speedup"] > 1]
    best = min(entries, key=lambda f: entries[f]["speedup"])
    worst = max(entries, key=lambda f: entries[f]["speedup"])
    return (f"At {format_size(size)}: the reference `{family_of(rr)}` reaches **{rr['busbw_mbps']:.2f} Mbit/s** "
            f"busbw (model {_fmt(rr['predicted_busbw_mbps'])}), ahead of {len(ahead)} of {len(entries)} "
            f"baselines. Best baseline: `{best}` {entries[best]['busbw']:.2f} (model "
            f"{_fmt(entries[best]['model_busbw'])}); worst: `{worst}` {entries[worst]['busbw']:.2f} (model "
            f"{_fmt(entries[worst]['model_busbw'])}).")


def scaling_families(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], dict[int, dict[str, Any]]]:
    """(kind, routing, algorithm+placement, size) -> hosts -> {efficiency, model efficiency}, for families
    measured at two or more host counts (ECMP seeds folded by median)."""
    acc: dict[tuple[str, str, str, int], dict[int, list[dict[str, Any]]]] = {}
    for r in rows:
        algo = r["algorithm"] if r["placement"] in ("identity", "hdrm") else f"{r['algorithm']}-{r['placement']}"
        acc.setdefault((r["kind"], r["routing"], algo, r["size"]), {}).setdefault(r["hosts"], []).append(r)
    out = {}
    for key, by_hosts in acc.items():
        if len(by_hosts) < 2:
            continue
        fam = {}
        for hosts, cells in sorted(by_hosts.items()):
            capacity = [c["capacity_mbps"] for c in cells]
            eff = _median([c["busbw_mbps"] / cap for c, cap in zip(cells, capacity, strict=True)
                           if c["busbw_mbps"]])
            model = _median([c["predicted_busbw_mbps"] / cap for c, cap in zip(cells, capacity, strict=True)
                             if c["predicted_busbw_mbps"]])
            fam[hosts] = {"efficiency": eff, "model_efficiency": model,
                          "busbw": _median([c["busbw_mbps"] for c in cells])}
        out[key] = fam
    return out


def pick_heatmap_cells(rows: list[dict[str, Any]], ref: dict[str, str]) -> tuple[dict | None, dict | None]:
    """One congested cell and one clean reference cell, at the largest size.

    Congested: an ECMP hd cell if one shares a link (the paper's case), else the cell with the most flows on a
    link; ties go to the lowest busbw. Clean: a reference cell with at most one flow per link.
    """
    ok = [r for r in rows if r["status"] == "ok" and r["kind"] != "star"]
    if not ok:
        return None, None
    largest = max(r["size"] for r in ok)
    pool = [r for r in ok if r["size"] == largest] or ok
    # the paper's case first: halving-doubling hashed by ECMP; then whatever shares links most
    # at the host count most cells have (the main comparison), not a scaling point
    hosts = statistics.mode(r["hosts"] for r in pool)
    congested = max(pool, key=lambda r: (r["routing"] == "ecmp" and r["algorithm"] == "hd" and r["max_flows_per_link"] > 1,
                                         r["hosts"] == hosts, r["max_flows_per_link"], -(r["busbw_mbps"] or 0)))
    clean_pool = [r for r in pool if is_reference(r, ref) and r["max_flows_per_link"] <= 1] or \
                 [r for r in pool if r["max_flows_per_link"] <= 1]
    clean = max(clean_pool, key=lambda r: (r["hosts"] == congested["hosts"], r["busbw_mbps"] or 0)) \
        if clean_pool else None
    if congested["max_flows_per_link"] <= 1:
        return None, clean
    return congested, clean


def link_step_matrix(cell_dir: str, rep: int | None = None) -> dict[str, Any]:
    """Per step x directed switch-to-switch link: flows predicted and mean measured goodput (Mbit/s).

    Reads the cell's schedule, topology, results (routing, seed) and timeline.
    """
    from emulator import routing, topology
    from emulator.schedule import cost
    from emulator.schedule import format as sformat

    res = read_json(os.path.join(cell_dir, "results.json")) or {}
    cfg = res.get("config") or {}
    topo = topology.load(os.path.join(cell_dir, "topology.json"))
    schedule = sformat.load(os.path.join(cell_dir, "schedule.json"))
    policy, seed = cfg.get("routing", "shortest"), int(cfg.get("seed", 0))
    report = cost.analyze(schedule, topo, policy, seed=seed)
    links = sorted({lk for st in report.steps for lk in st.flows_per_link
                    if topo.is_switch(lk[0]) and topo.is_switch(lk[1])},
                   key=lambda lk: (int(lk[0][1:]), int(lk[1][1:])))
    steps = [st.step for st in report.steps]
    flows = [[st.flows_per_link.get(lk, 0) for lk in links] for st in report.steps]
    if rep is None:
        rep = int(cfg.get("warmup", 0))
    rates: dict[tuple[int, tuple[str, str]], list[float]] = {}
    paths: dict[tuple[str, str], list[str]] = {}
    for t in read_jsonl(os.path.join(cell_dir, "timeline.jsonl")):
        if t.get("rep") != rep or t["end"] <= t["start"]:
            continue
        key = (t["src_host"], t["dst_host"])
        if key not in paths:
            paths[key] = routing.route(topo, policy, routing.agent_flow(topo, *key), seed=seed)
        mbps = t["bytes"] * 8 / (t["end"] - t["start"]) / 1e6
        for lk in routing.switch_links_of(paths[key]):
            rates.setdefault((t["step"], lk), []).append(mbps)
    measured = [[statistics.mean(rates[(s, lk)]) if (s, lk) in rates else None for lk in links] for s in steps]
    return {"links": [f"{a}>{b}" for a, b in links], "steps": steps, "flows": flows, "measured_mbps": measured,
            "rep": rep}


# ------------------------------------------------------------------ plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_busbw_vs_size(path: str, rows: list[dict[str, Any]], title: str) -> bool:
    fams: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if r["busbw_mbps"]:
            fams.setdefault(family_of(r), {}).setdefault(r["size"], []).append(r["busbw_mbps"])
    if not fams:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for fam, by_size in sorted(fams.items()):
        xs = sorted(by_size)
        ax.plot(xs, [statistics.median(by_size[x]) for x in xs], marker="o",
                linewidth=2.5 if "hdrm" in fam else 1.2, label=fam)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["size"] for r in rows})
    ax.set_xticks(sizes, [format_size(s) for s in sizes])
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw (Mbit/s, median; ECMP seeds: median)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_heatmaps(path: str, cells: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """For each (row, matrix): predicted flows per link per step, and measured mean goodput."""
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(len(cells), 2, figsize=(14, 4.2 * len(cells)), squeeze=False)
    for i, (row, m) in enumerate(cells):
        flows = np.array(m["flows"], dtype=float).T if m["links"] else np.zeros((1, len(m["steps"])))
        meas = np.array([[np.nan if v is None else v for v in col] for col in m["measured_mbps"]],
                        dtype=float).T if m["links"] else np.zeros((1, len(m["steps"])))
        ax = axes[i][0]
        im = ax.imshow(flows, aspect="auto", cmap="Reds", vmin=0, vmax=max(2, float(flows.max(initial=0))),
                       interpolation="nearest")
        fig.colorbar(im, ax=ax, label="flows on the link (model)")
        ax.set_title(f"{row['id']}: flows per link (predicted)", fontsize=9)
        ax2 = axes[i][1]
        im2 = ax2.imshow(meas, aspect="auto", cmap="viridis_r", vmin=0, vmax=row["link_mbps"],
                         interpolation="nearest")
        fig.colorbar(im2, ax=ax2, label="mean goodput of its transfers (Mbit/s)")
        ax2.set_title(f"measured, repetition {m['rep']} (yellow = slow, dark = fast, blank = unused)", fontsize=9)
        for a in (ax, ax2):
            a.set_xlabel("step")
            a.set_yticks(range(len(m["links"])), m["links"], fontsize=6)
            a.set_xticks(range(len(m["steps"])), [str(s) for s in m["steps"]], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gantt(path: str, cells: list[dict[str, Any]]) -> bool:
    plt = _plt()
    data = []
    for row in cells:
        res = read_json(os.path.join(row["dir"], "results.json")) or {}
        rep = int((res.get("config") or {}).get("warmup", 0))
        recs = [t for t in read_jsonl(os.path.join(row["dir"], "timeline.jsonl")) if t.get("rep") == rep]
        if recs:
            data.append((row, rep, recs))
    if not data:
        return False
    fig, axes = plt.subplots(len(data), 1, figsize=(11, 3.6 * len(data)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    xmax = max(max(t["end"] for t in recs) - min(t["start"] for t in recs) for _, _, recs in data)
    for i, (row, rep, recs) in enumerate(data):
        ax = axes[i][0]
        t0 = min(t["start"] for t in recs)
        for t in recs:
            ax.barh(t["src"], t["end"] - t["start"], left=t["start"] - t0, height=0.8,
                    color=cmap(t["step"] % 10), edgecolor="black", linewidth=0.2)
        ax.set_xlim(0, xmax * 1.02)
        ax.set_ylabel("sending rank")
        ax.set_title(f"{row['id']}, repetition {rep}: transfers (send start to receive end), colour = step",
                     fontsize=9)
        ax.invert_yaxis()
    axes[-1][0].set_xlabel("seconds since the first send")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_scaling(path: str, fams: dict[tuple[str, str, str, int], dict[int, dict[str, Any]]]) -> bool:
    if not fams:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, ((kind, routing, algo, size), by_hosts) in enumerate(sorted(fams.items())):
        xs = sorted(h for h, v in by_hosts.items() if v["efficiency"] is not None)
        color = plt.get_cmap("tab10")(i % 10)
        label = f"{kind} {routing} {algo} {format_size(size)}"
        if xs:
            ax.plot(xs, [by_hosts[h]["efficiency"] for h in xs], marker="o", color=color, label=label)
        mx = sorted(h for h, v in by_hosts.items() if v["model_efficiency"] is not None)
        ax.plot(mx, [by_hosts[h]["model_efficiency"] for h in mx], linestyle=":", color=color,
                label=f"{label} (model)")
    ax.set_xscale("log", base=2)
    hosts = sorted({h for v in fams.values() for h in v})
    ax.set_xticks(hosts, [str(h) for h in hosts])
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("hosts")
    ax.set_ylabel("busbw / link goodput")
    ax.set_title("scaling efficiency (1 = every host's link busy all the time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_measured_vs_predicted(path: str, rows: list[dict[str, Any]]) -> bool:
    pts = [r for r in rows if r["busbw_mbps"] and r["predicted_busbw_mbps"]]
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    kinds = sorted({r["kind"] for r in pts})
    for i, kind in enumerate(kinds):
        sel = [r for r in pts if r["kind"] == kind]
        ax.scatter([r["predicted_busbw_mbps"] for r in sel], [r["busbw_mbps"] for r in sel], label=kind,
                   marker="os^Dv"[i % 5], alpha=0.8)
    untrusted = [r for r in pts if r["trusted"] is False]
    if untrusted:
        ax.scatter([r["predicted_busbw_mbps"] for r in untrusted], [r["busbw_mbps"] for r in untrusted],
                   facecolors="none", edgecolors="red", s=120, label="fidelity flag")
    top = max(max(r["predicted_busbw_mbps"] for r in pts), max(r["busbw_mbps"] for r in pts)) * 1.05
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="measured = model")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("model busbw (Mbit/s, max-min fair)")
    ax.set_ylabel("measured busbw (Mbit/s, median)")
    ax.set_title("every cell: measured against the model")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def fabric_sentence(spec: str | None, link_mbps: float) -> str:
    """What the emulated figures stand for: the experiment's fabric profile (older runs had none)."""
    if not spec:
        dilation = fabric.default().link_gbps * 1000 / link_mbps
        return (f"Time dilation: a {link_mbps:g} Mbit/s emulated link stands for a {fabric.default().link_gbps:g} "
                f"Gbit/s one, every time divided by {dilation:g}. This run predates fabric profiles: only "
                "bandwidth was dilated, so small messages here are more latency-bound than on the real fabric.")
    profile = fabric.parse(spec)
    return (f"Fabric: {profile.describe()}. Divide an emulated time by {profile.dilation:g} (multiply a rate by "
            f"it) for the real fabric's: busbw {link_mbps * 0.9:.1f} Mbit/s here is "
            f"{profile.real_mbps(link_mbps * 0.9) / 1000:.0f} Gbit/s there.")


# ----------------------------------------------------------------- report
def speedup_text(speedup: float | None, interval: tuple[float, float] | None, significant: bool | None) -> str:
    """``×1.24 (1.10–1.38)``, ``×1.02 (0.97–1.08) n.s.`` or ``–``."""
    if speedup is None:
        return "–"
    text = f"×{speedup:.2f}"
    if interval:
        text += f" ({interval[0]:.2f}–{interval[1]:.2f})"
    return text + (" n.s." if significant is False else "")


INTERVAL_SENTENCE = (f"In brackets after a speedup: its 95% bootstrap interval ({RESAMPLES} resamples: the ECMP "
                     "seeds with replacement, then the repetitions within each drawn seed, the median of the "
                     "pooled draw on each side); **n.s.** = not significant, the interval contains 1.")


def answers_section(doc: Doc, found: list[answers.Answer], repeat: int) -> None:
    """The "Answers" section: per question its sentences (nothing when no answer has data)."""
    if not found:
        return
    doc.h(2, "Answers")
    for question, title in answers.QUESTIONS.items():
        texts = [a.text for a in found if a.question == question]
        if texts:
            doc.p(f"**{title}**")
            doc.ul(texts)
    doc.p(f"Measured: median busbw of the measured repetitions (ECMP seeds: median over seeds); 95%: the "
          f"bootstrap interval of that ratio over repetitions and ECMP seeds ({RESAMPLES} resamples); model: "
          "`schedule check`'s max-min fair prediction on the same routes. Cells at different link rates are "
          "compared by efficiency (busbw / link goodput), never by busbw. Details in the tables below."
          + (f" With {repeat} measured repetitions per cell the bootstrap sees little of the run-to-run spread: "
             "read a narrow interval as a lower bound on the uncertainty." if repeat < 5 else ""))


def _point_label(pt: paper_scale.Point) -> str:
    """``BiGraph + hdrm``, ``leaf-spine + ECMP + hd``."""
    routing = "" if pt.routing == "bigraph" else f" + {answers.ROUTINGS.get(pt.routing, pt.routing)}"
    return f"{answers.KINDS.get(pt.fabric, pt.fabric)}{routing} + {pt.algorithm}"


def model_error_text(errors: list[paper_scale.ModelError]) -> str:
    """``measured/model time 0.97-1.12 (median 1.03) over 40 trusted cells at 8-64 hosts``."""
    if not errors:
        return "no trusted cell measured its error"
    lo, hi = min(e.low for e in errors), max(e.high for e in errors)
    cells = sum(e.cells for e in errors)
    med = statistics.median(r for e in errors for r in [e.median] * e.cells)
    hosts = f"{errors[0].hosts}" if len(errors) == 1 else f"{errors[0].hosts}-{errors[-1].hosts}"
    return f"measured/model time {lo:.2f}-{hi:.2f} (median {med:.2f}) over {cells} trusted cells at {hosts} hosts"


def projection_answers(comparisons: Iterable[paper_scale.Comparison], error: str) -> list[answers.Answer]:
    """At the largest projected scale, per size, the reference against the leaf-spine baselines: model only."""
    comps = list(comparisons)
    if not comps:
        return []
    top = max(c.hosts for c in comps)
    out = []
    for c in comps:
        if c.hosts != top or c.baseline.fabric != "leafspine":
            continue
        text = (f"Model only, not measured: at {c.hosts} accelerators and {format_size(c.size)} per rank, "
                f"{_point_label(c.reference)} would be ×{c.speedup:.2f} faster than {_point_label(c.baseline)} "
                f"(efficiency {c.reference.efficiency:.2f} against {c.baseline.efficiency:.2f}); the model's "
                f"error where the emulator measured it: {error}.")
        out.append(answers.Answer(question="projection", text=text, comparison=f"{_point_label(c.reference)} / "
                                  f"{_point_label(c.baseline)}", hosts=c.hosts, size=c.size, measured=None,
                                  interval=None, significant=None, model=c.speedup, trusted=True, cells=()))
    return out


def projection_section(doc: Doc, comparisons: Iterable[paper_scale.Comparison], error: str,
                       profile: fabric.FabricProfile) -> None:
    """The "Paper scale (model)" section: the reference against each baseline at 128..1024 accelerators."""
    comps = list(comparisons)
    doc.h(2, "Paper scale, by the model alone (not measured)")
    if not comps:
        doc.p("No projection: the experiment measured its reference at fewer than two host counts.")
        return
    body = []
    for c in comps:
        body.append([str(c.hosts), format_size(c.size), _point_label(c.baseline), f"`{c.baseline.topology}`",
                     f"{c.reference.real_time_s * 1e3:.3f} ms, eff. {c.reference.efficiency:.2f}",
                     f"{c.baseline.real_time_s * 1e3:.3f} ms, eff. {c.baseline.efficiency:.2f}",
                     f"model ×{c.speedup:.2f}"])
    doc.table(["accelerators", "size per rank", "baseline (model)", "baseline fabric",
               "reference: real time, efficiency (model)", "baseline: real time, efficiency (model)",
               "speedup (model)"], body)
    ref_specs = sorted({(c.hosts, c.reference.topology) for c in comps})
    doc.p("Every number in this section is the timing model's, on the real fabric the profile names ("
          f"{profile.link_gbps:g} Gbit/s links, {profile.alpha_us:g} µs per message, {profile.switch_latency_us:g} "
          "µs per switch, MTU " f"{profile.mtu}), computed by `emulator.schedule.projection` (which equals "
          "`schedule check`'s prediction of the same schedule on the sizes the emulator runs). Reference: "
          + ", ".join(f"`{spec}` ({h})" for h, spec in ref_specs)
          + "; fabrics of equal switch radix k (k/2 hosts per leaf; BiGraph with k/2 switches per group), ECMP "
          f"folded by the median over seeds {', '.join(map(str, paper_scale.SEEDS))}. The model's error where "
          f"the emulator measured it: {error}. Efficiency = busbw / link goodput.")


def build(out: str) -> tuple[Doc, list[dict[str, Any]], list[answers.Answer]]:
    """Compute everything, draw the plots into ``out/plots/``; return the document, the rows and the answers."""
    plan, rows = load_rows(out)
    exp = plan["experiment"]
    ref = exp.get("reference") or {"algorithm": "hdrm", "routing": "bigraph"}
    link = exp["link_mbps"]
    plots = os.path.join(out, "plots")
    os.makedirs(plots, exist_ok=True)
    doc = Doc()
    n_ok = sum(r["status"] == "ok" for r in rows)
    failed = [r for r in rows if r["status"] not in ("ok", "not run")]
    not_run = [r for r in rows if r["status"] == "not run"]
    tables, server_tables = speedup_tables(rows, ref), server_speedup_tables(rows)
    found = answers.find(rows, ref, tables, server_tables)
    error = model_error_text(paper_scale.model_error(rows))
    profile = fabric.parse(exp["fabric"]) if exp.get("fabric") else fabric.default()
    # the projection answers the scaling question at the paper's scale: only for experiments that ask it
    scaled = len({r["hosts"] for r in rows if is_reference(r, ref)}) > 1
    projected = paper_scale.project_comparisons(profile) if scaled else ()
    found += projection_answers(projected, error)
    doc.h(1, f"Experiment `{exp['name']}`")
    if exp.get("description"):
        doc.p(exp["description"])
    answers_section(doc, found, exp["repeat"])
    datapaths = sorted({r["datapath"] for r in rows if r["datapath"]})
    doc.ul([
        f"**{n_ok} of {len(rows)} cells finished**, {len(failed)} failed or interrupted, {len(not_run)} not run"
        + ("" if n_ok == len(rows) else " (run `emu run` again to finish them)") + ".",
        f"Links: {link:g} Mbit/s (host and switch links unless a topology sets its own); Open vSwitch datapath: "
        f"{', '.join(datapaths) or 'unknown'}; repetitions per cell: {exp['warmup']} warm-up + {exp['repeat']} "
        f"measured; ECMP seeds: {', '.join(map(str, exp['ecmp_seeds']))}.",
        "busbw is the nccl-tests bus bandwidth (algbw x 2(p-1)/p), the median of the measured repetitions; a "
        "perfect allreduce reaches the link's TCP goodput. The model is `schedule check`'s timing model on the "
        "same routes: max-min fair sharing of every link, and the fabric's per-message latency, with the agents' "
        "own dependency rules (it knows contention and latency, not the emulator's CPU limits).",
        fabric_sentence(exp.get("fabric"), link),
    ])

    clean_ratios = [r["measured_over_predicted"] for r in rows
                    if r["measured_over_predicted"] and r["max_flows_per_link"] <= 1]
    if clean_ratios and statistics.median(clean_ratios) > 1.3:
        doc.p(f"**Caution:** cells the model calls contention-free (at most one flow per link) took "
              f"{statistics.median(clean_ratios):.1f}x their predicted time (median of {len(clean_ratios)}). "
              "Something other than the fabric's links limits them: on this machine, the CPU (Python agents and "
              "the userspace Open vSwitch datapath share its cores) or TCP losses (see the retransmits column). "
              "That ceiling applies to every fabric alike and compresses the measured differences between them; "
              "the model's numbers show the fabric-only effect. Fewer hosts, lower link rates or a calibrated "
              "kernel datapath bring the measurement closer to the model.")

    # speedup
    doc.h(2, f"Speedup of {ref['routing']} + {ref['algorithm']} over every baseline")
    if not tables:
        doc.p("No reference cells (the experiment's `reference`) finished or were planned.")
    for t in tables:
        doc.h(3, f"series `{t['series']}`, {t['hosts']} hosts")
        headline = _headline(t)
        if headline:
            doc.p(headline)
        head = ["baseline"] + [f"{format_size(s)}: speedup (95%), model" for s in t["sizes"]]
        ref_row = ["**reference busbw**, Mbit/s (model)"]
        for s in t["sizes"]:
            rr = t["reference"].get(s)
            ref_row.append(f"**{_fmt(rr and rr['busbw_mbps'])}** ({_fmt(rr and rr['predicted_busbw_mbps'])})"
                           + (f" {rr['id'].split('.')[1]}" if rr else ""))
        body = [ref_row]
        for fam in sorted(t["baselines"]):
            cells = []
            for s in t["sizes"]:
                e = t["baselines"][fam].get(s)
                if e is None:
                    cells.append("")
                    continue
                cells.append(_baseline_cell(e))
            body.append([fam] + cells)
        doc.table(head, body)
    doc.p("Speedup = reference busbw / baseline busbw (medians; for ECMP the median over seeds, with the range "
          "over seeds). Above 1: the reference is faster. " + INTERVAL_SENTENCE + " Model: the same ratio "
          "from the model. By efficiency: the two ran at different link rates, so the ratio is of busbw / "
          "link goodput.")

    if server_tables:
        doc.h(2, "Server designs: one NIC per accelerator against a shared NIC")
        doc.table(["servers x accelerators, routing, algorithm", "size", "speedup (95%), model",
                   "NIC per accelerator busbw (model)", "shared NIC busbw (model)"],
                  [[t["family"], format_size(t["size"]),
                    speedup_text(t["speedup"], t["interval"], t["significant"])
                    + f", model ×{_fmt(t['model_speedup'])}" + (", by efficiency" if t["by_efficiency"] else ""),
                    f"{_fmt(t['own']['busbw_mbps'])} ({_fmt(t['own']['predicted_busbw_mbps'])})",
                    f"{_fmt(t['shared']['busbw_mbps'])} ({_fmt(t['shared']['predicted_busbw_mbps'])})"]
                   for t in server_tables])
        doc.p("Each server's accelerators sit behind one PCIe switch; with a shared NIC they all leave the "
              "server through one link, with a NIC each every accelerator uses its own (EFLOPS). Speedup = busbw "
              "with a NIC per accelerator / busbw with the shared NIC, same fabric, routing, algorithm and size; "
              "in brackets the model's ratio. Only the phases that cross servers gain: intra-server steps run "
              "over PCIe either way (which is also why busbw may exceed the NIC rate). A ring with identity "
              "placement sends one flow out of each server per step, so a shared NIC costs it nothing. "
              + INTERVAL_SENTENCE)

    # busbw vs size
    doc.h(2, "busbw against message size")
    for series in dict.fromkeys(r["series"] for r in rows):
        sel = [r for r in rows if r["series"] == series]
        name = f"busbw-{series}.png"
        if plot_busbw_vs_size(os.path.join(plots, name), sel, f"series {series}: busbw against size"):
            doc.img(f"plots/{name}", f"busbw against size, series {series}")

    # heat map and Gantt
    congested, clean = pick_heatmap_cells(rows, ref)
    doc.h(2, "Congestion per link and step")
    chosen = [r for r in (congested, clean) if r is not None]
    if chosen:
        mats = []
        for r in chosen:
            try:
                mats.append((r, link_step_matrix(r["dir"])))
            except Exception as exc:  # a damaged cell folder must not cost the whole report
                doc.p(f"No heat map for {r['id']}: {type(exc).__name__}: {exc}")
        if mats:
            plot_heatmaps(os.path.join(plots, "heatmap.png"), mats)
            doc.p("Rows: directed switch-to-switch links; columns: steps. Left: flows the model routes over the "
                  "link in that step (2 or more = shared). Right: the mean goodput the transfers crossing the "
                  "link got in the first measured repetition. "
                  + (f"Congested: `{congested['id']}` (up to {congested['max_flows_per_link']} flows on a link). "
                     if congested else "No congested cell finished. ")
                  + (f"Clean: `{clean['id']}` (never more than one flow per link)." if clean else ""))
            doc.img("plots/heatmap.png", "flows and goodput per link and step")
        doc.h(2, "Timeline")
        if plot_gantt(os.path.join(plots, "gantt.png"), chosen):
            doc.p("Every transfer of the first measured repetition, from the send's start to the receive's end, "
                  "one row per sending rank, coloured by step; both runs on the same time axis.")
            doc.img("plots/gantt.png", "timeline of transfers")
    else:
        doc.p("No finished cell with switch-to-switch links.")

    # scaling
    doc.h(2, "Scaling")
    fams = scaling_families(rows)
    if plot_scaling(os.path.join(plots, "scaling.png"), fams):
        hosts = sorted({h for v in fams.values() for h in v})
        body = []
        for (kind, routing, algo, size), by_hosts in sorted(fams.items()):
            body.append([f"{kind} {routing} {algo} {format_size(size)}"]
                        + [f"{_fmt(by_hosts[h]['efficiency'])} ({_fmt(by_hosts[h]['model_efficiency'])})"
                           if h in by_hosts else "" for h in hosts])
        doc.table(["family"] + [f"{h} hosts" for h in hosts], body)
        doc.p("Efficiency = busbw / link goodput (1 = near-linear scaling: the allreduce keeps every host link "
              "busy however many hosts take part); model in brackets.")
        doc.img("plots/scaling.png", "scaling efficiency")
    else:
        doc.p("No family of cells was measured at more than one host count.")

    projection_section(doc, projected, error, profile)

    # every cell
    doc.h(2, "Every cell: measured against the model")
    if plot_measured_vs_predicted(os.path.join(plots, "measured-vs-model.png"), rows):
        doc.img("plots/measured-vs-model.png", "measured against predicted busbw")
    body = []
    for r in rows:
        body.append([f"`{r['id']}`", r["status"], _fmt(r["busbw_mbps"]), _fmt(r["predicted_busbw_mbps"]),
                     _fmt(r["time_s"], 3), _fmt(r["predicted_time_s"], 3), _fmt(r["measured_over_predicted"]),
                     str(r["max_flows_per_link"]), ", ".join(r["flags"]) or "none",
                     str(r["qdisc_drops"]), str(r["tcp_retransmits"])])
    doc.table(["cell", "status", "busbw", "model busbw", "time s", "model s", "measured/model time",
               "max flows/link", "fidelity flags", "qdisc drops", "TCP retrans."], body)
    doc.p("Times are the median of the measured repetitions; busbw in Mbit/s. Fidelity flags per repetition "
          "(any repetition): `over_capacity` = the switch datapath was offered more than this machine's "
          "calibrated capacity, `cpu_saturated` = the CPU had under 5% idle time, `uncalibrated` = `emu "
          "calibrate` never ran here (the capacity is the documented default). A cell with `over_capacity` or "
          "`cpu_saturated` is not trusted: it measures the emulator, not the fabric.")

    faulted = [r for r in rows if r["faults"]]
    if faulted:
        doc.h(2, "Faults")
        body = []
        for r in faulted:
            for f in r["faults"]:
                affected = f.get("affected_transfers") or []
                slow = [t["time_s"] for t in affected if t.get("time_s") is not None]
                body.append([f"`{r['id']}`", f"`{f['spec']}`",
                             "not fired" if f.get("fired_s") is None else f"{f['fired_s']:.3f} s",
                             "" if f.get("reroute_s") is None else f"{f['reroute_s'] * 1000:.0f} ms",
                             f"{len(affected)}" + (f" (slowest {max(slow):.3f} s)" if slow else ""),
                             f.get("error") or f.get("note") or "", r["outcome"]])
        doc.table(["cell", "fault", "fired at", "controller done after", "transfers on the link", "what happened",
                   "cell outcome"], body)
        doc.p("`fired at` counts from the repetition's common start; `controller done after` is the time until "
              "the controller had every switch confirmed with entries that route around (or back over) the link, "
              "or had resynchronised every switch after a restart. Transfers on the link are those whose planned "
              "path crossed it, with the slowest one's measured time. A cell whose repetitions all finished with "
              "correct data despite a fault is `degraded`; a fault that stops a rank fails the cell.")

    doc.h(2, "Fidelity flags and failures")
    flag_counts: dict[str, int] = {}
    for r in rows:
        for f in r["flags"]:
            flag_counts[f] = flag_counts.get(f, 0) + 1
    doc.ul([f"`{f}`: {n} cells" for f, n in sorted(flag_counts.items())] or ["no fidelity flag in any cell"])
    untrusted = [r for r in rows if r["trusted"] is False]
    if untrusted:
        doc.p("Not trusted: " + ", ".join(f"`{r['id']}`" for r in untrusted) + ".")
    doc.ul([f"`{r['id']}`: {r['status']}: {r['error'] or 'no error recorded'}" for r in failed]
           or ["no failed cells"])
    if not_run:
        doc.p(f"Not run yet: {len(not_run)} cells.")
    doc.p("Every cell's numbers are in `cells.csv`; raw results in `cells/<cell>/` (results.json, timeline.jsonl, "
          "links.jsonl); the answers, as numbers, in `summary.json`.")
    return doc, rows, found


def _baseline_cell(e: dict[str, Any]) -> str:
    """One baseline at one size: ``×1.24 (1.10–1.38); model ×1.25; seeds ×1.20..×1.28; busbw 4.1 (4.2)``."""
    text = speedup_text(e["speedup"], e["interval"], e["significant"]) + f"; model ×{_fmt(e['model_speedup'])}"
    if e["by_efficiency"]:
        text += "; by efficiency"
    if e["range"]:
        text += f"; seeds ×{e['range'][0]:.2f}..×{e['range'][1]:.2f}"
    return text + f"; busbw {_fmt(e['busbw'])} ({_fmt(e['model_busbw'])})"


def write_report(out: str) -> str:
    """Write ``report.md``, ``report.html``, ``cells.csv``, ``summary.json`` and ``plots/*.png`` into ``out``.

    Returns report.md's path. ``summary.json``'s ``wall_s`` is ``run.json``'s (null when it has none).
    """
    doc, rows, found = build(out)
    write_csv(os.path.join(out, "cells.csv"), rows)
    plan = read_json(os.path.join(out, "experiment.json")) or {}
    name = (plan.get("experiment") or {}).get("name", "experiment")
    wall_s = (read_json(os.path.join(out, "run.json")) or {}).get("wall_s")
    write_json_atomic(os.path.join(out, "summary.json"),
                      answers.summary(name, float(wall_s) if isinstance(wall_s, int | float) else None, found))
    write_atomic(os.path.join(out, "report.html"), doc.html(f"Experiment {name}"))
    path = os.path.join(out, "report.md")
    write_atomic(path, doc.markdown())
    return path
