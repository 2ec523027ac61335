"""The report as a list of blocks, and its two renderings: Markdown (``report.md``) and HTML (``report.html``).

This module owns the document model and nothing of the report's content:
headings, paragraphs, bullet lists, tables and images, each a frozen block,
appended in order by the sections (:mod:`emulator.study.report.sections`). Both
renderers walk the same blocks, so the two files always say the same thing.
Inline markup is limited to what the report uses: ```code``` and
``**bold**``; the HTML renderer escapes everything else.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass, field

HTML_HEAD = ("<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>"
             "body{{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}}"
             "table{{border-collapse:collapse;font-size:90%}}td,th{{border:1px solid #ccc;padding:2px 6px;"
             "text-align:left}}img{{max-width:100%}}code{{background:#f4f4f4}}</style></head><body>")


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Image:
    path: str  # relative to the report
    alt: str


Block = Heading | Paragraph | Bullets | Table | Image


@dataclass
class Doc:
    """A report as blocks, rendered to Markdown and to HTML."""

    blocks: list[Block] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(Heading(level, text))

    def p(self, text: str) -> None:
        self.blocks.append(Paragraph(text))

    def ul(self, items: Iterable[str]) -> None:
        self.blocks.append(Bullets(tuple(items)))

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(Table(tuple(head), tuple(tuple(row) for row in rows)))

    def img(self, path: str, alt: str) -> None:
        self.blocks.append(Image(path, alt))

    def markdown(self) -> str:
        """The document as Markdown: blocks separated by a blank line, ``|`` in table cells escaped."""
        return "\n\n".join(_markdown(b) for b in self.blocks) + "\n"

    def html(self, title: str) -> str:
        """The document as one self-contained HTML page titled ``title``."""
        return "\n".join([HTML_HEAD.format(title=html.escape(title)), *(_html(b) for b in self.blocks)]) \
            + "</body></html>\n"


def _markdown(block: Block) -> str:
    match block:
        case Heading(level, text):
            return "#" * level + " " + text
        case Paragraph(text):
            return text
        case Bullets(items):
            return "\n".join(f"- {item}" for item in items) if items else "- (none)"
        case Table(head, rows):
            lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            return "\n".join(lines)
        case Image(path, alt):
            return f"![{alt}]({path})"
    raise TypeError(f"not a block: {block!r}")


def _html(block: Block) -> str:
    e = html.escape
    match block:
        case Heading(level, text):
            return f"<h{level}>{e(text)}</h{level}>"
        case Paragraph(text):
            return f"<p>{inline_html(text)}</p>"
        case Bullets(items):
            return "<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in items) + "</ul>"
        case Table(head, rows):
            return ("<table><tr>" + "".join(f"<th>{inline_html(c)}</th>" for c in head) + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in rows)
                    + "</table>")
        case Image(path, alt):
            return f"<p><img src='{e(path)}' alt='{e(alt)}'></p>"
    raise TypeError(f"not a block: {block!r}")


def inline_html(text: str) -> str:
    """Escape, then render `code` and **bold** (the only inline Markdown the report uses)."""
    parts = html.escape(text).split("`")
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    text = "".join(parts)
    bits = text.split("**")
    for i in range(1, len(bits), 2):
        bits[i] = f"<b>{bits[i]}</b>"
    return "".join(bits)
