"""Security basics: loopback by default, no shell for names from configs, atomic result files."""

from __future__ import annotations

import ast
import json
import os

import pytest

from controllers.core import DEFAULT_LISTEN, Settings
from emulator import cli, faults, fidelity, topology
from emulator.errors import UserError
from emulator.files import write_json_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPO = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")


def test_controller_listens_on_loopback_unless_told_otherwise():
    assert DEFAULT_LISTEN[0] == "127.0.0.1"
    assert Settings(topology="star:hosts=2").listen[0] == "127.0.0.1"
    args = cli.build_parser().parse_args(["controller", "--topology", "star:hosts=2", "--routing", "shortest"])
    assert args.listen.startswith("127.0.0.1:")


def _calls(path: str):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _sources():
    for top in ("emulator", "controllers"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def test_no_shell_strings_built_from_names():
    """Processes get argument lists; the one place a Mininet shell runs a command quotes it with shlex."""
    shell_calls = []
    for path in _sources():
        for call in _calls(path):
            for kw in call.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    shell_calls.append(f"{path}:{call.lineno}")
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "system" and getattr(func.value, "id", "") == "os":
                shell_calls.append(f"{path}:{call.lineno}")
            if isinstance(func, ast.Attribute) and func.attr == "cmd" and path.endswith("network.py"):
                arg = call.args[0] if call.args else None
                quoted = (isinstance(arg, ast.BinOp) and isinstance(arg.left, ast.Call)
                          and getattr(arg.left.func, "attr", "") == "join"
                          and getattr(arg.left.func.value, "id", "") == "shlex")
                if not quoted:
                    shell_calls.append(f"{path}:{call.lineno} (node.cmd without shlex.join)")
    assert not shell_calls, shell_calls


@pytest.mark.parametrize("name", ["s1-s3; rm -rf /", "s1-s3 && true", "$(id)-s1", "s1-s3 x", "../s1-s3"])
def test_link_names_from_configs_must_be_links_of_the_model(name):
    with pytest.raises(UserError):
        fidelity.parse_link_name(TOPO, name)
    with pytest.raises(UserError):
        faults.parse_fault(f"link_down:{name}@1s", TOPO, 8, 6)


def test_a_failed_write_leaves_the_previous_result_whole(tmp_path):
    path = str(tmp_path / "results.json")
    write_json_atomic(path, {"status": "ok", "busbw": 9.1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"status": "ok", "bad": object()})  # not serialisable
    assert json.loads(open(path).read()) == {"status": "ok", "busbw": 9.1}
    assert os.listdir(tmp_path) == ["results.json"]  # no temporary file left
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
