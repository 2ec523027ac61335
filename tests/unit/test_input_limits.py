"""Absurd values (1e30, inf, nan, negative, huge) are refused in one line naming the field and the limit that
applies; the limits of docs/limits.md are the code's."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from emulator.base.errors import FieldError, UserError
from emulator.cli import main as cli
from emulator.cli.commands import admit, replay, schedule
from emulator.model import topology
from emulator.model.collectives import registry
from emulator.model.schedule import format as fmt
from emulator.model.workloads import llm, training
from emulator.runs import admission
from emulator.study import experiment as xp

EXPERIMENT = """
name: t
repeat: 1
warmup: 0
sizes: [64KiB]
series:
  - name: s
    runs:
      - topology: "leafspine:leaves=2,spines=1,hosts_per_leaf=2"
        routing: shortest
        algorithms: [ring]
"""
RUN = ("series", 0, "runs", 0)


def _experiment(path: tuple[object, ...], value: object) -> FieldError:
    data = yaml.safe_load(EXPERIMENT)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(FieldError) as exc:
        xp.from_dict(data, where="x.yaml")
    return exc.value


@pytest.mark.parametrize("path, value, field, limit", [
    (("max_time",), 1e30, "max_time", "at most 7 days"),
    (("max_time",), "1e30s", "max_time", "at most 7 days"),
    (("max_time",), 10**30, "max_time", "at most 7 days"),
    (("timeout_s",), 1e30, "timeout_s", "at most 7 days"),
    (("timeout_s",), math.inf, "timeout_s", "at most 7 days"),
    (("timeout_s",), math.nan, "timeout_s", "at most 7 days"),
    (("repeat",), 10**30, "repeat", f"1..{admission.MAX_REPEAT}"),
    (("warmup",), 10**9, "warmup", f"0..{admission.MAX_WARMUP}"),
    (("ecmp_seeds",), [0, 10**30], "ecmp_seeds[1]", f"0..{admission.MAX_SEED}"),
    (("sizes",), 10**30, "sizes[0]", "at most 1024GiB"),
    ((*RUN, "sizes"), ["2TiB"], "series[0].runs[0].sizes[0]", "at most 1024GiB"),
    ((*RUN, "seeds"), [-1], "series[0].runs[0].seeds[0]", f"0..{admission.MAX_SEED}"),
    ((*RUN, "model"), "resnet50", None, None),
])
def test_an_experiment_files_absurd_numbers_are_refused_naming_the_field_and_its_limit(path, value, field, limit):
    if field is None:  # a run's scale beyond the cap names the cap, not ">= 1"
        data = yaml.safe_load(EXPERIMENT)
        data["series"][0]["runs"][0].update(model="resnet50", scale=1e7)
        with pytest.raises(FieldError) as exc:
            xp.from_dict(data, where="x.yaml")
        assert exc.value.field == "series[0].runs[0].scale" and "1 to 1,000,000" in str(exc.value)
        return
    err = _experiment(path, value)
    assert err.field == field and limit in str(err), str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("argv, field, limit", [
    (["replay", "s", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--max-time", "1e30"],
     "max-time", "at most 7 days"),
    (["replay", "s", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--timeout", "inf"],
     "timeout", "at most 7 days"),
    (["replay", "s", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--repeat", "100000"],
     "repeat", "1..1000"),
    (["replay", "s", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--warmup", "1000"],
     "warmup", "0..100"),
    (["replay", "s", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--ecmp-seed",
      str(1 << 40)], "ecmp-seed", "0..4294967295"),
    (["controller", "--topology", "star:hosts=2", "--routing", "shortest", "--ecmp-seed", str(1 << 32)],
     "ecmp-seed", "0..4294967295"),
    (["up", "star:hosts=2", "--ecmp-seed", str(1 << 32)], "ecmp-seed", "0..4294967295"),
    (["pingall", "star:hosts=2", "--routing", "shortest", "--ecmp-seed", str(1 << 32)], "ecmp-seed", "0..4294967295"),
    (["controller", "--topology", "star:hosts=2", "--routing", "shortest", "--stats-interval", "nan"],
     "stats-interval", "[0.05, 3600]"),
    (["bench", "--bw", "inf"], "bw", "0.1 to 1000"),
    (["mpirun", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "o", "--timeout", "1e30", "true"],
     "timeout", "at most 7 days"),
    (["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "1MiB", "--seed", "-3",
      "-o", "x.json"], "seed", "0..4294967295"),
    (["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "1MiB", "--chunks", "-3",
      "-o", "x.json"], "chunks", f"1..{fmt.MAX_CHUNKS}"),
    (["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "2TiB", "-o", "x.json"],
     "size", "at most 1024GiB"),
    (["schedule", "gen", "--model", "resnet50", "--algo", "ring", "--topology", "star:hosts=4", "--scale", "1e7",
      "-o", "x.json"], "scale", "1 to 1,000,000"),
])
def test_the_command_lines_absurd_numbers_are_refused_naming_the_option_and_its_limit(argv, field, limit, capsys,
                                                                                      tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"field '{field}'" in err and limit in err and "\n" not in err, err
    assert not (tmp_path / "x.json").exists()


LLM = ["schedule", "gen", "--model", "llama2-7b", "--topology", "star:hosts=2", "--tp", "1", "--pp", "1",
       "--dp", "2", "-o", "x.json"]


@pytest.mark.parametrize("extra, flag, words", [
    (["--micro-batch", "100000000"], "micro-batch", "sequences per microbatch"),
    (["--microbatches", "100000"], "microbatches", f"at most {llm.MAX_MICROBATCHES}"),
    (["--layers-per-collective", "3"], "layers-per-collective", "a divisor of the 32 layers"),
])
def test_a_language_models_errors_name_the_flag_the_user_typed(extra, flag, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(LLM + extra) == 2
    err = capsys.readouterr().err.strip()
    assert f"schedule gen: field '{flag}'" in err and words in err, err
    assert "ops[" not in err and "ranks[" not in err


def test_hier_where_its_groups_are_one_group_or_groups_of_one_is_refused_where_the_user_chooses_it(capsys, tmp_path):
    for spec in ("star:hosts=4", "leafspine:leaves=4,spines=1,hosts_per_leaf=1"):
        out = tmp_path / "h.json"
        assert cli.main(["schedule", "gen", "--algo", "hier", "--topology", spec, "--size", "1MiB",
                         "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "field 'algo'" in err and "a plain ring" in err and registry.GROUPS_SPEC in err, err
        assert not out.exists()
    data = yaml.safe_load(EXPERIMENT)
    data["series"][0]["runs"][0].update(topology="star:hosts=4", algorithms=["ring", "hier"])
    with pytest.raises(FieldError) as exc:
        xp.from_dict(data, where="x.yaml")
    assert exc.value.field == "series[0].runs[0].algorithms[1]"
    assert cli.main(["schedule", "gen", "--algo", "hier", "--topology", registry.GROUPS_SPEC, "--size", "1MiB",
                     "-o", str(tmp_path / "ok.json")]) == 0


def _small_machine(gib: float) -> admission.Machine:
    total = int(gib * admission.GiB) + admission.RESERVE_MIN_BYTES
    return admission.Machine(available_bytes=total, total_bytes=total, cores=2)


def test_gen_says_when_a_replay_would_not_fit_and_which_scale_would(capsys, tmp_path, monkeypatch):
    machine = _small_machine(1.0)
    monkeypatch.setattr(admit, "machine", lambda: machine)
    out = tmp_path / "r.json"
    argv = ["schedule", "gen", "--model", "resnet50", "--algo", "ring", "--topology", "star:hosts=4", "-o", str(out)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    match = re.search(r"needs ([0-9.]+ GiB) of memory .* can give (\S+ \S+): --scale ([0-9.]+) would fit", err)
    assert match, err
    need = admission.replay_memory(fmt.load(str(out)), topology.load("star:hosts=4")).total_bytes
    assert match.group(1) == admission.format_bytes(need) and match.group(2) == admission.format_bytes(
        machine.usable_bytes)
    scale = float(match.group(3))
    assert cli.main([*argv, "--scale", f"{scale:g}"]) == 0
    assert capsys.readouterr().err == ""  # the scale it named fits
    sched = fmt.load(str(out))
    assert admission.replay_memory(sched, topology.load("star:hosts=4")).total_bytes <= machine.usable_bytes
    assert cli.main([*argv, "--scale", f"{scale / 2:g}"]) == 0
    assert "would fit" in capsys.readouterr().err  # and half of it does not


def test_replay_refuses_a_schedule_whose_buffers_do_not_fit_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(admit, "machine", lambda: _small_machine(0.5))
    sched = tmp_path / "r.json"
    assert cli.main(["schedule", "gen", "--model", "resnet50", "--algo", "ring", "--topology", "star:hosts=4",
                     "-o", str(sched)]) == 0
    capsys.readouterr()

    def no_root() -> None:
        raise AssertionError("replay went past admission")

    monkeypatch.setattr(replay, "require_root", no_root)
    assert cli.main(["replay", str(sched), "--topology", "star:hosts=4", "--routing", "shortest", "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "field 'memory'" in err and "--scale" in err and "\n" not in err, err


# ---------------------------------------------------------------------------------------------- docs/limits.md
LIMITS = Path(__file__).resolve().parents[2] / "docs" / "limits.md"


def _limits_table() -> dict[str, tuple[str, str]]:
    """docs/limits.md's table: the constant column -> (value, module)."""
    rows = {}
    for line in LIMITS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[1].startswith("`") and not set(cells[0]) <= {"-", " "}:
            rows[cells[1].strip("`")] = (cells[2], cells[3].strip("`"))
    return rows


def _value(text: str) -> float:
    """A number as the table writes it: ``1024``, ``1 TiB``, ``7 days``, ``1,000,000``, ``2^32 - 1``."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "days": 86400.0, "s": 1.0,
             "Mbit/s": 1.0}
    text = text.replace(",", "").replace("−", "-")
    if "^" in text:
        base, rest = text.split("^", 1)
        exponent, _, minus = rest.partition("-")
        return int(base) ** int(exponent) - (int(minus) if minus.strip() else 0)
    number, _, unit = text.partition(" ")
    return float(number) * units.get(unit.strip(), 1.0)


def test_every_limit_in_docs_limits_md_is_the_codes():
    import importlib
    rows = _limits_table()
    assert len(rows) >= 15, rows
    for name, (value, module) in rows.items():
        constant = getattr(importlib.import_module(module.replace("/", ".").removesuffix(".py")), name)
        assert _value(value) == pytest.approx(float(constant)), (name, value, constant)
    assert {"MAX_HOSTS", "MAX_SWITCHES", "MAX_RANKS", "MAX_DURATION_S", "MAX_SCALE", "MAX_MESSAGE_BYTES",
            "MAX_LINK_MBPS", "MAX_REPEAT", "MAX_SEED", "MAX_MICROBATCHES", "MAX_COMPUTE_S"} <= set(rows)


def test_the_scale_cap_is_the_one_every_reader_names():
    for scale in (0.5, training.MAX_SCALE * 2, math.nan, math.inf):
        with pytest.raises(UserError) as exc:
            training.check_scale(scale, "w")
        assert "1 to 1,000,000" in str(exc.value)
    assert training.check_scale(training.MAX_SCALE, "w") == training.MAX_SCALE
    assert schedule.training is training
