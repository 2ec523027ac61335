"""The one reader of users' YAML and JSON (emulator/base/documents.py): duplicate keys, alias bombs, short errors,
through the library and through `emu` (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from emulator.base import documents
from emulator.base.errors import MAX_LINE, MAX_SHOWN, FieldError, UserError
from emulator.cli.main import main
from emulator.runs import cluster_file

EXPERIMENT = """\
name: t
link_mbps: 20
repeat: 1
warmup: 0
sizes: [64KiB]
repeat: 3
series:
  - name: star
    runs:
      - topology: {kind: star, hosts: 4}
        routing: shortest
        algorithms: ring
"""

CLUSTER = """\
name: lab
head: a
underlay_mtu: 9100
private_underlay: true
servers:
  - {name: a, ssh: 192.0.2.10, key: /root/.ssh/ef_lab, underlay: 10.77.0.1}
  - {name: b, ssh: 192.0.2.11, key: /root/.ssh/ef_lab, underlay: 10.77.0.2}
head: b
"""


def _refusal(text: str, fmt: str = "yaml") -> str:
    with pytest.raises(UserError) as info:
        documents.parse_text(text, "f.yaml", fmt)
    message = str(info.value)
    assert "\n" not in message
    return message


def _bomb(levels: int = 7) -> str:
    """The "billion laughs": nine aliases of the level below on each level, the last in one field."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"name: *a{levels - 1}"]) + "\n"


def test_a_key_given_twice_is_refused_at_any_depth_naming_the_key_and_both_lines():
    assert _refusal("head: a\nx: 1\nhead: b\n") == "f.yaml: line 3: duplicate key 'head' (first at line 1)"
    deep = "series:\n  - name: s\n    runs:\n      - topology: star\n        routing: a\n        routing: b\n"
    assert _refusal(deep) == "f.yaml: line 6: duplicate key 'routing' (first at line 5)"
    assert "duplicate key 1 " in _refusal("{1: a, 0x1: b}\n")  # equal once read, as a dict would keep one
    merged = "base: &b {x: 1, y: 2}\nmine: {<<: *b, x: 3}\nboth: {<<: [*b, {z: 4}]}\n"  # a merge key is no duplicate
    assert documents.parse_text(merged, "f") == {"base": {"x": 1, "y": 2}, "mine": {"x": 3, "y": 2},
                                                 "both": {"x": 1, "y": 2, "z": 4}}


def test_a_json_key_given_twice_is_refused_naming_it():
    assert _refusal('{"a": {"b": 1, "b": 2}}', "json") == "f.yaml: duplicate key 'b' in one object"


def test_an_alias_bomb_is_refused_in_bounded_time_with_a_short_message():
    start = time.perf_counter()
    message = _refusal(_bomb())
    assert time.perf_counter() - start < 1.0
    assert len(message) < 200 and f"more than {documents.MAX_ALIAS_NODES}" in message
    assert "inside its own anchor" in _refusal("a: &a [1, *a]\n")
    documents.parse_text(_bomb(4), "f")  # 9^4 = 6561 nodes: within the bound
    shared = "run: &r {topology: star, routing: shortest, sizes: [1, 2, 3]}\nall: [" + ", ".join(["*r"] * 1000) + "]\n"
    assert len(documents.parse_text(shared, "f")["all"]) == 1000  # type: ignore[index]


def test_values_echoed_in_errors_are_cut_and_keep_the_fields_path():
    message = str(FieldError("x.yaml", "series[0].name", "a name", "y" * 1_000_000))
    assert message.startswith("x.yaml: field 'series[0].name': expected a name, got 'yyy")
    assert len(message) < len("x.yaml: field 'series[0].name': expected a name, got ") + MAX_SHOWN + 1
    assert len(_refusal("a: !!float " + "x" * 100_000 + "\n")) < 3 * MAX_SHOWN
    assert len(_refusal("z" * 100_000 + ": [\n")) < 3 * MAX_SHOWN
    assert str(FieldError("x", "f", "an int", 10 ** 5000)) == "x: field 'f': expected an int, got an integer of 16610 bits"


def test_emu_never_prints_an_error_line_over_the_limit(tmp_path, capsys):
    long_name = "d" * 250
    path = tmp_path
    for _ in range(12):  # a 3000-character path that exists, to a schedule that does not
        path = path / long_name
    path.mkdir(parents=True)
    assert main(["schedule", "check", str(path / "s.yaml"), "--topology", "star:hosts=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= MAX_LINE + 1 and err.startswith("emu: schedule '")


def test_emu_run_check_refuses_an_experiment_with_repeat_twice(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text(EXPERIMENT)
    assert main(["run", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == f"emu: {path}: line 6: duplicate key 'repeat' (first at line 3)\n"


def test_a_cluster_file_with_head_twice_is_refused_by_every_command(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    path.write_text(CLUSTER)
    assert main(["cluster", "place", str(path), "--topology", "star:hosts=2"]) == 2
    err = capsys.readouterr().err
    assert err == f"emu: cluster file {path}: line 8: duplicate key 'head' (first at line 2)\n"
    with pytest.raises(UserError, match="duplicate key 'head'"):
        cluster_file.load(str(path))
    path.write_text(CLUSTER.replace("head: b\n", ""))
    assert cluster_file.load(str(path)).head == "a"
    assert yaml.safe_load(CLUSTER)["head"] == "b"  # what a plain reader made of it


def test_deep_nesting_is_refused_not_a_crash(tmp_path):
    """libyaml's C composer recurses once per level: 100,000 nested lists once killed the process (SIGSEGV)."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    done = subprocess.run([sys.executable, "-m", "emulator", "schedule", "check", str(deep), "--topology",
                           "star:hosts=2"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr == f"emu: schedule '{deep}': line 1: collections nested deeper than 200 levels\n"
    assert "nested deeper" in _refusal("a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300)))
    assert documents.parse_text("[" * 150 + "]" * 150, "f") is not None  # deep, within the bound
