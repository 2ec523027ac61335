"""The one reader of a user's YAML and JSON documents: experiment, cluster, placement, schedule and topology files.

Every file a person writes and the project reads as data goes through
:func:`parse_text` (or :func:`read_document`), which refuses, in one
:class:`~emulator.base.errors.UserError` line, what a plain ``yaml.safe_load``
or ``json.loads`` would let through silently or expensively:

* a mapping key given twice, at any depth: YAML keeps the last one, so a
  second ``head:`` in a cluster file would change the head without a word.
  The message names the key and both lines (JSON gives no lines: the key
  alone);
* alias expansion beyond :data:`MAX_ALIAS_NODES` nodes, or an alias inside its
  own anchor: a "billion laughs" document is a few hundred bytes that expand
  to ~10^9 nodes, and echoing such a value in an error message once printed
  80 MB;
* collections nested deeper than :data:`MAX_DEPTH` levels: libyaml's C
  composer recurses per level, and 40,000 levels crash the interpreter;
* text that is not YAML or JSON at all (a parser's error, cut to
  :data:`~emulator.base.errors.MAX_SHOWN` characters).

The C parser is used where PyYAML has it: its constructor is Python, so the
duplicate check (in ``flatten_mapping``, which sees every mapping before
merge keys change it) works on both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from emulator.base.errors import UserError, shorten, shown
from emulator.base.files import read_text

#: Nodes a document may add through aliases (anchors re-used). A file that shares a fabric block or a run
#: among its series adds hundreds; 100,000 keeps a refused value's checks and message in milliseconds and
#: kilobytes, while a "billion laughs" document (10^7..10^9 nodes from a few hundred bytes) is refused after
#: one pass over the nodes it really holds.
MAX_ALIAS_NODES = 100_000

#: Collections nested deeper than this are refused. No file of the project nests past ~10 levels, and libyaml's
#: C composer recurses once per level: 40,000 nested ``[`` crash the interpreter (a segmentation fault, no error).
MAX_DEPTH = 200
#: Every level of nesting needs an indicator of its own (a flow ``[`` or ``{``, a block ``-``, ``?`` or ``:``),
#: so a text with at most :data:`MAX_DEPTH` of them cannot nest deeper; others are measured first.
_INDICATORS = "[{-?:"

#: What the YAML and JSON readers raise for text they cannot turn into data: besides their own errors,
#: constructors fail on values such as ``!!float x``, ``!!float``, ``2001-13-45`` or a 5000-digit integer, and deep
#: nesting exhausts the recursion limit.
PARSE_ERRORS = (yaml.YAMLError, ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError,
                RecursionError)

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


class _Refused(Exception):
    """A document that parses but is refused (a duplicate key, an alias bomb): the message says why."""


def format_of(path: str) -> str:
    """``json`` for a ``.json`` file, else ``yaml``."""
    return "json" if path.lower().endswith(".json") else "yaml"


def read_document(path: str, where: str, fmt: str | None = None) -> object:
    """The data of the user's file ``path`` (YAML, or JSON by its name unless ``fmt`` says); one-line
    :class:`UserError` naming ``where`` if it cannot be read or is refused."""
    return parse_text(read_text(path, where), where, fmt or format_of(path))


def parse_text(text: str, where: str, fmt: str = "yaml") -> object:
    """YAML (safe subset) or JSON text -> data; one-line :class:`UserError` if it is not readable or is refused
    (a duplicate key, an alias expansion past :data:`MAX_ALIAS_NODES`)."""
    try:
        if fmt == "json":
            return json.loads(text, object_pairs_hook=_json_object)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 -- a safe loader (SafeConstructor) with checks
    except _Refused as exc:
        raise UserError(f"{where}: {exc}") from None
    except PARSE_ERRORS as exc:
        kind = "JSON" if fmt == "json" else "YAML"
        raise UserError(f"{where}: not valid {kind} ({describe_parse_error(exc)})") from None


def describe_parse_error(exc: BaseException) -> str:
    """One short line saying where (line N, when known) and what is wrong in unreadable YAML or JSON text."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}: {exc.msg}"
    mark = getattr(exc, "problem_mark", None)
    line = f"line {mark.line + 1}: " if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    return line + shorten(" ".join(str(what).split()))


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {shown(key)} in one object")
        out[key] = value
    return out


_EventLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (C parser where there is one), refusing duplicate keys and alias bombs."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._text = stream
        self._checked: set[int] = set()

    def get_single_data(self) -> Any:
        _check_depth(self._text)
        node = self.get_single_node()
        if node is None:
            return None
        if "*" in self._text:  # no alias without one
            _check_aliases(node)
        return self.construct_document(node)

    def flatten_mapping(self, node: MappingNode) -> None:
        # The first flatten of a node sees its own keys; later ones (merge keys) see merged ones too.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            self._refuse_duplicates(node)
        super().flatten_mapping(node)

    def _refuse_duplicates(self, node: MappingNode) -> None:
        if all(k.tag == _STR_TAG for k, _ in node.value):  # the common case, fast: string keys compare as written
            texts = [k.value for k, _ in node.value]
            if len(set(texts)) == len(texts):
                return
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=False)
            try:
                seen = first.get(key)
            except TypeError:  # an unhashable key: the constructor refuses it with its line
                continue
            line = key_node.start_mark.line + 1
            if seen is not None:
                raise _Refused(f"line {line}: duplicate key {shown(key)} (first at line {seen})")
            first[key] = line


def _check_depth(text: str) -> None:
    """:class:`_Refused` if collections nest deeper than :data:`MAX_DEPTH`; counted on the parser's events (no
    recursion) unless the indicators are too few to nest that deep (most files: a count at C speed)."""
    if sum(text.count(c) for c in _INDICATORS) <= MAX_DEPTH:
        return
    depth = 0
    for event in yaml.parse(text, Loader=_EventLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(f"line {event.start_mark.line + 1}: collections nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _children(node: Node) -> Iterator[Node]:
    if isinstance(node, SequenceNode):
        yield from node.value
    elif isinstance(node, MappingNode):
        for key, value in node.value:
            yield key
            yield value


def _check_aliases(root: Node) -> None:
    """:class:`_Refused` if aliases add more than :data:`MAX_ALIAS_NODES` nodes to the document, or an alias
    lies inside its own anchor; one pass over the distinct nodes, whatever the expansion."""
    size: dict[int, int] = {}  # a node's size with every alias expanded
    open_: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            continue
        if key in size:
            continue
        if key in open_:
            raise _Refused(f"line {node.start_mark.line + 1}: an alias inside its own anchor (a recursive document)")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    added = size[id(root)] - len(size)
    if added > MAX_ALIAS_NODES:
        raise _Refused(f"aliases expand it by {added} nodes, more than {MAX_ALIAS_NODES} (an alias bomb?)")
