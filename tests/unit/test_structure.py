"""The layout keeps its promises (docs/architecture.md): no room too big, no function past a screen, no import
circle hidden behind ``TYPE_CHECKING``, and a routing policy's name written only where policies are registered."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("emulator", "controllers")
#: The most of the code under emulator/ one folder's own modules may hold.
MAX_FOLDER_SHARE = 0.15
MAX_FUNCTION_LINES = 80
#: A policy's name, quoted, in at most this many files: its registration, and configurations that name it.
MAX_FILES_NAMING_A_POLICY = 3
REGISTRY = "emulator/model/routing/policies.py"


def _sources(*tops: str, suffixes: tuple[str, ...] = (".py",)) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in suffixes and "__pycache__" not in path.parts:
                yield path


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_folder_holds_more_than_its_share_of_the_code():
    lines: Counter[Path] = Counter()
    for path in _sources("emulator", suffixes=(".py", ".c")):
        lines[path.parent.relative_to(ROOT)] += len(path.read_text().splitlines())
    total = sum(lines.values())
    too_big = {str(folder): round(n / total, 3) for folder, n in lines.items() if n > MAX_FOLDER_SHARE * total}
    assert not too_big, f"folders over {MAX_FOLDER_SHARE:.0%} of {total} lines: {too_big}"


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in _sources(*CODE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, modules: set[str]) -> tuple[set[str], set[str]]:
    """The project's modules ``module`` imports when it runs, and those it imports for type checking only."""
    typing_only: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            typing_only.update(n for stmt in node.body for n in ast.walk(stmt))
    runtime: set[str] = set()
    checking: set[str] = set()
    package = module if (ROOT / module.replace(".", "/") / "__init__.py").exists() else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        found = {n for n in names if n in modules}
        (checking if node in typing_only else runtime).update(found)
    return runtime, checking


def test_no_import_behind_type_checking_closes_a_circle():
    paths = {_module(p): p for p in _sources(*CODE)}
    modules = set(paths)
    runtime: dict[str, set[str]] = {}
    checking: dict[str, set[str]] = {}
    for module, path in paths.items():
        runtime[module], checking[module] = _imports(ast.parse(path.read_text()), module, modules)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in runtime[todo.pop()]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    circles = [f"{a} -> {b}" for a, targets in checking.items() for b in targets if reaches(b, a)]
    assert not circles, f"imports behind TYPE_CHECKING that close a circle: {circles}"


def test_a_routing_policys_name_is_written_where_policies_are_registered():
    for name in ("ecmp", "dmodk"):
        quoted = re.compile(rf"[\"']{name}[\"']")
        files = [str(p.relative_to(ROOT)) for p in _sources(*CODE) if quoted.search(p.read_text())]
        assert REGISTRY in files, name
        assert len(files) <= MAX_FILES_NAMING_A_POLICY, (name, files)
