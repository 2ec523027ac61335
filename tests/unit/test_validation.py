"""Validation against published nccl-tests tables: the bundled tables load, regimes and verdicts follow their rules,
and ``emu validate`` reports and exits as documented."""

from __future__ import annotations

import json

import pytest

from emulator.cli import main as cli
from emulator.model.nccl.nccl_tests import OPS
from emulator.model.nccl.system import GPUS, System
from emulator.selfcheck.validation import check, tables
from emulator.selfcheck.validation.tables import Measured, Table

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_every_bundled_table_loads_with_a_source():
    found = tables.load_all()
    assert len(found) >= 15
    for t in found:
        assert t.rows, t.name
        assert t.url.startswith("https://") or t.name == "gb10-2x1-roce200-switch-all-gather", t.name
        assert t.system is not None or t.unusable


def _table(sizes: list[int], times: list[float | None], busbw: list[float | None] | None = None) -> Table:
    rates = busbw or [None] * len(sizes)
    rows = tuple(Measured(s, t, b) for s, t, b in zip(sizes, times, rates, strict=True))
    system = System(2, 1, 1, 200, GPUS["a100-pcie"])
    return Table("t", "", "https://example.org", OPS["all_reduce_perf"], system, "auto", "auto", rows, ())


def test_regimes_by_size():
    sizes = [8 << i for i in range(0, 31, 2)]  # 8 B .. 8 GiB
    regimes = check.regime_of(_table(sizes, [1.0] * len(sizes)))
    assert [s for s, r in regimes.items() if r == "latency floor"] == sizes[:4]
    assert [s for s, r in regimes.items() if r == "plateau"] == sizes[-3:]
    middle = [s for s, r in regimes.items() if r == "middle"]
    assert middle and min(middle) >= MiB and max(middle) < sizes[-3]
    assert all(s not in regimes for s in sizes if 64 * KiB < s < MiB)


def test_a_table_without_floor_sizes_leaves_its_floor_unchecked_never_passed():
    sizes = [MiB, 16 * MiB, 256 * MiB, GiB, 4 * GiB]
    result = check.check(_table(sizes, [None] * 5, [5.0, 15.0, 22.0, 22.5, 23.0]))
    verdicts = {r.name: r.verdict for r in result.regimes}
    assert verdicts["latency floor"] == "unchecked"
    assert result.verdict in ("pass", "fail") and verdicts["plateau"] != "unchecked"


def test_a_size_outside_its_band_fails_its_regime_and_the_table():
    sizes = [8, 16, 32, 64]
    model = check.check(_table(sizes, [1.0] * 4))  # any floor the model predicts
    times = [r.prediction.time_us for r in model.rows]
    good = check.check(_table(sizes, times))
    assert good.verdict == "pass" and all(r.ratio == pytest.approx(1.0) for r in good.rows)
    bad = check.check(_table(sizes, [*times[:3], times[3] / 1.31]))  # 31 % slower predicted than real
    assert bad.verdict == "fail" and bad.regimes[0].worst is not None and bad.regimes[0].worst.measured.size == 64


def test_a_bus_bandwidth_only_row_compares_the_same_quotient():
    result = check.check(_table([GiB], [None], [20.0]))
    row = result.rows[0]
    assert row.ratio == pytest.approx(20.0 / row.predicted_busbw_gbs)


def test_a_table_that_cannot_be_predicted_is_unchecked():
    t = next(t for t in tables.load_all() if t.unusable)
    result = check.check(t)
    assert result.verdict == "unchecked" and all(r.verdict == "unchecked" for r in result.regimes)


def test_peaks_become_one_plateau_table_each():
    tcp = [t for t in tables.load_all() if t.name.startswith("tcp-32g")]
    assert len(tcp) == 4 and all(t.plateau_only and len(t.rows) == 1 for t in tcp)
    assert tcp[0].rows[0].busbw_gbs == pytest.approx(31.0 / 8)  # the median of 30.6, 31.0, 31.4 Gbit/s


def test_unstated_setup_is_filled_by_the_documented_rules_and_said():
    t = next(t for t in tables.load_all() if t.name == "h100-8x8-ndr400-default")
    assert t.system is not None and t.system.nics_per_node == 8 and t.system.gdr
    assert any("NICs per node" in a for a in t.assumptions) and any("GPUDirect" in a for a in t.assumptions)


def test_emu_validate_reports_every_table_and_exits_1_on_a_failure(capsys):
    status = cli.main(["validate", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert len(data["tables"]) == len(tables.load_all())
    assert status == (1 if data["counts"]["fail"] else 0)
    one = next(t for t in data["tables"] if t["table"] == "ndr400-2x1-nogdr")
    assert set(one["regimes"]) == {"latency floor", "middle", "plateau"}


def test_emu_validate_one_passing_table_exits_0(tmp_path, capsys):
    sizes = [8, 16, 32, 64]
    model = check.check(_table(sizes, [1.0] * 4))
    rows = "\n".join(f"  - {{size: {r.measured.size}, time_us: {r.prediction.time_us:.4f}}}" for r in model.rows)
    path = tmp_path / "t.yaml"
    path.write_text("name: mine\ntitle: x\nsource: {url: 'https://example.org'}\n"
                    "setup: {op: all_reduce_perf, nodes: 2, gpus_per_node: 1, nics_per_node: 1, nic_gbps: 200,"
                    " gpu: a100-pcie, gdr: true, gpu_nic_path: same-pcie-switch}\nrows:\n" + rows + "\n")
    assert cli.main(["validate", str(path), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "== mine: pass" in out and "latency floor (within 30%): pass" in out
    assert (tmp_path / "plots" / "mine.png").stat().st_size > 1000


def test_emu_validate_names_an_unknown_table(capsys):
    assert cli.main(["validate", "--table", "nope"]) == 2
    assert "field 'table'" in capsys.readouterr().err


def test_a_stated_minimum_of_channels_is_applied():
    t = next(t for t in tables.load_all() if t.name == "h100-8x8-ndr400-min-ctas-24")
    assert t.min_channels == 24
    assert {r.prediction.channels for r in check.check(t).rows} == {24}
