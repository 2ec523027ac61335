"""Every file the repository's text names exists: the README, docs/, experiments/ and the code's docstrings and comments.

A reference is a repository path (a path under ``docs``, ``emulator``,
``tests``, ``experiments``, ``controllers`` or ``vagrant``, or the
``Makefile``, ``setup.cfg``, ``requirements.txt``, ``pyproject.toml``), a
Markdown link's target (relative to the file that links it), a path that
climbs out with ``..`` (it must stay inside the repository), or a bare name
ending in ``.md`` (some file of the repository must have that name, unless
it is one the tool writes into a results folder: :data:`GENERATED`). Web
addresses are not references. A path with ``*`` must match at least one
file. A dotted name of the project's code (``emulator.model.routing.route``,
``controllers.core``) names a module file, and whatever follows the module
must be found in it (imported, so re-exported names count). The test fails naming every reference that does not resolve, with the
file and line that makes it. The notes on third-party data under
``tests/data`` name upstream paths and are not read.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Folders that are not the repository's own text (tools, caches, results of runs).
#: ``tests/data`` is skipped below: its provenance notes name the upstream repositories' paths.
SKIP_DIRS = {".git", ".venv", "results", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
             ".hypothesis", "eflops_emulator.egg-info", ".import_linter_cache"}
TOP_DIRS = ("docs", "emulator", "tests", "experiments", "controllers", "vagrant")
TOP_FILES = ("Makefile", "setup.cfg", "requirements.txt", "pyproject.toml")
#: Files the tool writes into a results folder, named in the docs without their folder.
GENERATED = {"report.md"}

URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(TOP_DIRS) + r")/[\w./*{}-]*|(?:" + "|".join(TOP_FILES) + r")\b)")
BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
CLIMB = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*[\w])")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOTTED = re.compile(r"(?<![\w.])((?:emulator|controllers)(?:\.[A-Za-z_]\w*)+)")


def _repo_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS for part in rel.parts) or not path.is_file():
            continue
        out.append(rel)
    return out


FILES = _repo_files()
BASENAMES = {p.name for p in FILES}


def _texts() -> Iterator[tuple[Path, int, str]]:
    """``(file, line, text)`` of every piece of prose to check."""
    for rel in FILES:
        top = rel.parts[0]
        if rel.parts[:2] == ("tests", "data"):
            continue
        if rel.suffix == ".md" or (top == "experiments" and rel.suffix in (".yaml", ".yml")) or rel.name == "Makefile":
            for n, line in enumerate((ROOT / rel).read_text(encoding="utf-8").splitlines(), 1):
                yield rel, n, line
        elif rel.suffix == ".py" and top in ("emulator", "controllers", "tests"):
            yield from _python_prose(rel)


def _python_prose(rel: Path) -> Iterator[tuple[Path, int, str]]:
    """Docstrings and comments of a Python file, line by line."""
    source = (ROOT / rel).read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                for n, line in enumerate(body[0].value.value.splitlines()):
                    yield rel, body[0].lineno + n, line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield rel, tok.start[0], tok.string


def _exists(target: str, base: Path) -> bool:
    """Whether ``target`` (relative to ``base``, a folder of the repository) names a file or folder of it."""
    target = target.split("#", 1)[0].rstrip("/.,;:")
    if not target:
        return True
    if any(c in target for c in "*{"):
        pattern = re.sub(r"\{[^}]*\}", "*", target)
        return any(True for _ in (ROOT / base).glob(pattern))
    path = (ROOT / base / target).resolve()
    return path.exists() and (path == ROOT or ROOT in path.parents) and \
        not any(part in SKIP_DIRS for part in path.relative_to(ROOT).parts)


def _dotted_exists(name: str) -> bool:
    """Whether a dotted name resolves to a module file of the repository and, past it, to names it holds.

    The module part is found by its file; the rest is looked up on the imported module (re-exports count),
    a field that only a class's annotations declare (a dataclass field without default) included.
    """
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            break
    else:
        return False
    if i == len(parts):
        return True
    obj: object = importlib.import_module(".".join(parts[:i]))
    for attr in parts[i:]:
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        else:
            return isinstance(obj, type) and any(attr in getattr(k, "__annotations__", {}) for k in obj.__mro__)
    return True


def references(rel: Path, line: str) -> Iterator[tuple[str, bool]]:
    """``(reference, resolves)`` for every reference in one line of ``rel``."""
    links = [m.group(1) for m in MD_LINK.finditer(line)] if rel.suffix == ".md" else []
    text = URL.sub(" ", line)
    for target in links:
        if URL.fullmatch(target) or target.startswith(("#", "mailto:")):
            continue
        yield target, _exists(target, rel.parent)
    for m in PATH.finditer(text):
        yield m.group(1), _exists(m.group(1), Path("."))
    for m in DOTTED.finditer(text):
        yield m.group(1), _dotted_exists(m.group(1))
    for m in CLIMB.finditer(text):
        yield m.group(1), _exists(m.group(1), rel.parent)
    for m in BARE_MD.finditer(text):
        yield m.group(1), m.group(1) in BASENAMES or m.group(1) in GENERATED


def test_every_file_the_repository_names_exists():
    missing = sorted({f"{rel}:{n}: {ref}" for rel, n, line in _texts() for ref, ok in references(rel, line) if not ok})
    assert not missing, "references to files the repository does not contain:\n" + "\n".join(missing)


@pytest.mark.parametrize("line, bad", [
    ("the facts are in DOMAIN.md section 6", "DOMAIN.md"),
    ("see `docs/no-such-page.md`", "docs/no-such-page.md"),
    ("see emulator/model/no_such_module.py", "emulator/model/no_such_module.py"),
    ("[the guide](no-such-page.md)", "no-such-page.md"),
    ("as gathered in ../elsewhere/docs/NOTES.md", "../elsewhere/docs/NOTES.md"),
    ("the old :mod:`emulator.calibrate`", "emulator.calibrate"),
    ("see :func:`emulator.model.routing.no_such_function`", "emulator.model.routing.no_such_function"),
    ("as gathered in [the notes](../../elsewhere/NOTES.md)", "../../elsewhere/NOTES.md"),
])
def test_a_reference_to_a_missing_file_is_caught(line, bad):
    found = {ref: ok for ref, ok in references(Path("docs/architecture.md"), line)}
    assert found.get(bad) is False


@pytest.mark.parametrize("line", [
    "see [the domain facts](domain.md) and `emulator/model/topology/kinds.py`",
    "nccl-tests' conventions (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)",
    "`tests/integration/test_faults.py::test_controller_killed` and `Makefile`",
    ":func:`emulator.model.routing.route` and :class:`emulator.model.topology.Topology` (its :meth:`~.hops`)",
])
def test_references_that_exist_or_are_web_addresses_pass(line):
    assert all(ok for _, ok in references(Path("docs/architecture.md"), line))
