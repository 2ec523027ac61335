"""The report's "Language-model iteration" section: hybrid-parallel iterations measured, beside the model, and
grown to more accelerators by the model.

Per cell of a language model (:mod:`emulator.model.workloads.llm`): the
iteration time, measured (median over repetitions) and the timing model's,
their ratio, the compute-only time and the scaling efficiency (compute-only
over iteration time), and every kind of process group's communication share
of the iteration, measured and the model's
(:mod:`emulator.model.prediction.group_share`). Then each cell's design grown
to :data:`emulator.model.workloads.llm_scale.HOSTS` accelerators, its data-parallel
groups with it (:mod:`emulator.model.workloads.llm_scale`), model only.
"""

from __future__ import annotations

from emulator.base.errors import FieldError, UserError
from emulator.model import fabric
from emulator.model.workloads import llm_scale
from emulator.study.report.doc import Doc
from emulator.study.report.rows import CellRow, llm_rows
from emulator.study.report.sections import fmt_number


def _shares(row: CellRow) -> str:
    """``dp 0.31 (0.29), pp 0.05 (0.05), tp 0.20 (0.21)``: measured (model) per kind."""
    kinds = sorted(set(row.comm_share) | set(row.model_comm_share))
    return ", ".join(f"{k} {fmt_number(row.comm_share.get(k))} ({fmt_number(row.model_comm_share.get(k))})" for k in kinds)


def _label(row: CellRow) -> str:
    return f"{row.topology_slug} {row.routing} dp-{row.algorithm}"


def grown(row: CellRow, profile: fabric.FabricProfile) -> list[llm_scale.LlmPoint]:
    """The cell's iteration grown by the model (nothing without a prediction)."""
    if row.llm is None or row.predicted_time_s is None or row.compute_only_s is None:
        return []
    config = row.llm.llm_config(row.hosts)
    own = row.fabric or fabric.for_workload_scale(profile, row.workload_scale)
    try:
        return llm_scale.grow(row.topology, row.routing, config, row.algorithm, row.workload_scale, own,
                              row.predicted_time_s, row.compute_only_s)
    except (FieldError, UserError) as exc:
        return [llm_scale.LlmPoint(0, None, 0, why=str(exc))]


def section(doc: Doc, rows: list[CellRow], profile: fabric.FabricProfile) -> None:
    """The section (nothing without language-model cells)."""
    cells = llm_rows(rows)
    if not cells:
        return
    doc.h(2, "Language-model iteration: time, communication per group, scaling")
    doc.p("One hybrid-parallel training iteration per cell, as Megatron-LM runs it (tensor-parallel collectives "
          "per layer inside each server, the 1F1B pipeline's messages between stages, then the distributed "
          "optimizer's data-parallel reduce-scatter and all-gather; `docs/schedule-format.md`). Iteration times "
          "are emulated seconds, measured (median over repetitions) and the timing model's. Scaling efficiency = "
          "compute-only time / iteration time (the pipeline's bubble is in both). A group's communication share "
          "is the time its transfers are in flight on a rank (overlapping ones once) over the iteration, "
          "averaged over its ranks, measured (model); shares overlap each other and compute.")
    body = []
    for r in cells:
        body.append([_label(r), f"`{r.workload}`", str(r.hosts), f"{fmt_number(r.iteration_s, 1)} "
                     f"({fmt_number(r.predicted_time_s, 1)})", fmt_number(r.measured_over_predicted),
                     fmt_number(r.compute_only_s, 1), f"{fmt_number(r.scaling_efficiency)} ({fmt_number(r.predicted_scaling_efficiency)})",
                     _shares(r), r.trust_text() if r.trust is not None else r.status])
    doc.table(["fabric", "workload", "accelerators", "iteration s (model)", "measured/model", "compute-only s",
               "efficiency (model)", "communication share per group, measured (model)", "trust"], body)
    _grown(doc, cells, profile)


def _grown(doc: Doc, cells: list[CellRow], profile: fabric.FabricProfile) -> None:
    body = []
    for r in cells:
        for pt in grown(r, profile):
            if pt.iteration_s is None:
                body.append([_label(r), str(pt.hosts), pt.topology or "", str(pt.dp), "", "", pt.why])
                continue
            body.append([_label(r), str(pt.hosts), f"`{pt.topology}`", str(pt.dp), fmt_number(pt.real_iteration_s, 3),
                         fmt_number(pt.efficiency), ""])
    if not body:
        return
    doc.p("The same iterations grown by the model alone (not measured): each design at more accelerators "
          "(`topology.grown_spec`), the tensor- and pipeline-parallel split kept and the data-parallel groups "
          "grown with it (weak scaling: each rank's compute unchanged). The iteration there is the model's "
          "iteration here plus the change of the data-parallel phase, that phase alone by the timing model on "
          "both fabrics (`emulator/model/workloads/llm_scale.py`). Iteration times are real seconds of the full-size "
          "iteration (the dilation and the scale undone).")
    doc.table(["fabric", "accelerators", "grown design", "dp", "iteration s, real (model)", "efficiency (model)",
               "why not"], body)
