"""Tables for notebooks and terminals: one object, an HTML view and a plain-text twin.

A :class:`Table` displayed in Jupyter renders as an HTML table (``_repr_html_``) and
stores its plain-text twin as ``text/plain`` (``__repr__``); ``print(table)`` writes the
twin. Both are deterministic, so a notebook's stored outputs compare under nbval.

A table wider than a page (:data:`OUTPUT_WIDTH` characters unless ``width=`` says
otherwise) first has its long text columns wrapped onto several lines in the text twin
(the HTML table wraps them itself); what still does not fit is cut into column blocks
that each repeat the key columns. :meth:`Table.transposed` turns a table on its side.
"""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["OUTPUT_WIDTH", "Table", "format_cell", "format_table"]

# The widest line a stored notebook output may hold: a rendered page's code column, a
# terminal, a side-by-side diff. Tables fit it by default; short errors are wrapped to it
# (tetrt_support.notebook); tests/test_notebook_pairs.py checks every stored output.
OUTPUT_WIDTH = 110
_GAP = "  "
_NARROWEST_WRAPPED = 20  # columns up to this wide are never wrapped; wider ones keep at least this


def format_cell(value: Any) -> str:
    """A cell's text: floats to 3 significant digits, collections joined by commas."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(map(str, value)) or "-"
    return str(value)


_NUMERAL = re.compile(r"[-+]?(\d[\d,]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?[x%]?")


def _is_number(value: Any) -> bool:
    """Numbers, and numbers already formatted as text ("0.958", "4124", "1.2x"): right-aligned in HTML."""
    if isinstance(value, str):
        return _NUMERAL.fullmatch(value.strip()) is not None
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Table:
    """Rows under headers, with an optional title.

    ``width`` (characters, :data:`OUTPUT_WIDTH` by default) cuts a wide table into blocks
    of columns, each block repeating the first ``key_columns`` columns; ``None`` keeps one
    block however wide it is.
    """

    def __init__(
        self,
        rows: Iterable[Sequence[Any]],
        headers: Sequence[Any],
        *,
        title: str | None = None,
        width: int | None = OUTPUT_WIDTH,
        key_columns: int = 1,
    ) -> None:
        self.headers = tuple(str(h) for h in headers)
        self.rows = tuple(r if isinstance(r, tuple) else tuple(r) for r in rows)  # NamedTuple rows stay
        bad = next((r for r in self.rows if len(r) != len(self.headers)), None)
        if bad is not None:
            raise ValueError(f"row {bad!r} has {len(bad)} cells but there are {len(self.headers)} headers")
        if width is not None and width < 1:
            raise ValueError(f"width must be a positive number of characters, got {width}")
        if not 0 <= key_columns <= len(self.headers):
            raise ValueError(f"key_columns must be in 0..{len(self.headers)}, got {key_columns}")
        self.title = title
        self.width = width
        self.key_columns = key_columns

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> Table:
        """One row per mapping; the headers are the first record's keys, in order."""
        if not records:
            raise ValueError("from_records needs at least one record to take the headers from")
        headers = list(records[0])
        for i, record in enumerate(records):
            if list(record) != headers:
                raise ValueError(f"record {i} has keys {list(record)}, expected {headers}")
        return cls([[record[h] for h in headers] for record in records], headers, **options)

    # -- reshaping -----------------------------------------------------------------------

    def transposed(self, corner: str | None = None) -> Table:
        """Headers become the first column and each row a column, headed by its first cell."""
        if not self.headers:
            return self
        headers = [corner if corner is not None else self.headers[0], *(format_cell(r[0]) for r in self.rows)]
        rows = [(h, *(r[i] for r in self.rows)) for i, h in enumerate(self.headers) if i]
        return Table(rows, headers, title=self.title, width=self.width, key_columns=min(1, len(headers)))

    def with_width(self, width: int | None, key_columns: int | None = None) -> Table:
        """The same table, cut into column blocks of at most ``width`` characters."""
        keys = self.key_columns if key_columns is None else key_columns
        return Table(self.rows, self.headers, title=self.title, width=width, key_columns=keys)

    def head(self, n: int) -> Table:
        """The first ``n`` rows."""
        return Table(self.rows[:n], self.headers, title=self.title, width=self.width, key_columns=self.key_columns)

    def column(self, header: str) -> list[Any]:
        """The values of one column."""
        try:
            i = self.headers.index(header)
        except ValueError:
            raise KeyError(f"no column {header!r}; columns are {list(self.headers)}") from None
        return [r[i] for r in self.rows]

    # -- rendering -------------------------------------------------------------------------

    def _cells(self) -> list[list[str]]:
        return [list(self.headers)] + [[format_cell(c) for c in r] for r in self.rows]

    def _widths_and_floors(self, cells: list[list[str]]) -> tuple[list[int], list[int]]:
        """Each column's natural width, and the narrowest it may be wrapped to: its longest
        word, and never below ``_NARROWEST_WRAPPED`` (short columns are never wrapped)."""
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        words = [max(len(w) for row in cells for w in row[i].split() or [""]) for i in range(len(self.headers))]
        return widths, [max(word, min(width, _NARROWEST_WRAPPED)) for width, word in zip(widths, words)]

    def blocks(self) -> list[list[int]]:
        """The column indices of each block (key columns first in every block).

        Columns are packed at their narrowest (long text wrapped), so a table whose wide
        columns can wrap stays one block; only what still does not fit is cut."""
        n = len(self.headers)
        if self.width is None or n == 0:
            return [list(range(n))]
        _, floors = self._widths_and_floors(self._cells())
        keys = list(range(self.key_columns))
        base = sum(floors[i] for i in keys) + len(_GAP) * len(keys)
        blocks: list[list[int]] = []
        current: list[int] = []
        used = base
        for i in range(self.key_columns, n):
            extra = floors[i] + (len(_GAP) if current else 0)
            if current and used + extra > self.width:
                blocks.append(keys + current)
                current, used = [], base
                extra = floors[i]
            current.append(i)
            used += extra
        if current or not blocks:
            blocks.append(keys + current)
        return blocks

    def _fitted_widths(self, block: list[int], cells: list[list[str]]) -> list[int]:
        """Column widths of one block: natural, or, if the block is wider than the page,
        its widest columns narrowed in turn (never below their floor)."""
        natural, floors = self._widths_and_floors(cells)
        widths = [natural[i] for i in block]
        if self.width is None:
            return widths
        floor = [floors[i] for i in block]
        while (excess := sum(widths) + len(_GAP) * (len(widths) - 1) - self.width) > 0:
            candidates = [j for j in range(len(block)) if widths[j] > floor[j]]
            if not candidates:
                break
            j = max(candidates, key=lambda k: widths[k])
            second = max([widths[k] for k in candidates if k != j] or [floor[j]])
            widths[j] = max(floor[j], widths[j] - excess, min(second, widths[j] - 1))
        return widths

    def text(self) -> str:
        """The plain-text twin: aligned columns under a dashed rule, blocks one after another."""
        cells = self._cells()
        parts = [self.title] if self.title else []
        blocks = self.blocks()
        for block in blocks:
            widths = self._fitted_widths(block, cells)
            lines = []
            for row in cells:
                wrapped = [textwrap.wrap(row[i], w, break_long_words=False, break_on_hyphens=False) or [""]
                           if len(row[i]) > w else [row[i]] for i, w in zip(block, widths)]
                for k in range(max(map(len, wrapped))):
                    pieces = [(col[k] if k < len(col) else "").ljust(w) for col, w in zip(wrapped, widths)]
                    lines.append(_GAP.join(pieces).rstrip())
                if row is cells[0]:
                    lines.append(_GAP.join("-" * w for w in widths))
            parts.append("\n".join(lines))
        return "\n\n".join(parts) if len(blocks) > 1 else "\n".join(parts)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:  # Jupyter's text/plain: the twin, not an object address
        return self.text()

    def _repr_html_(self) -> str:
        out = []
        blocks = self.blocks()
        for n, block in enumerate(blocks):
            caption = f"<caption>{html.escape(self.title)}</caption>" if self.title and n == 0 else ""
            head = "".join(f"<th>{html.escape(self.headers[i])}</th>" for i in block)
            body = "".join(
                "<tr>" + "".join(
                    f'<td style="text-align:{"right" if _is_number(r[i]) else "left"}">{html.escape(format_cell(r[i]))}</td>'
                    for i in block) + "</tr>"
                for r in self.rows
            )
            out.append(f'<table class="tetrt-table">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
        return "\n".join(out)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Table):
            return NotImplemented
        return (self.headers, self.rows, self.title) == (other.headers, other.rows, other.title)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value: compare, do not hash


def format_table(rows: Sequence[Sequence[Any]], headers: Sequence[Any]) -> str:
    """The plain-text twin of ``Table(rows, headers)`` (for ``print`` and for logs)."""
    return Table(rows, headers).text()


class Collapsed:
    """A long output shown as its summary line, the whole of it behind a closed HTML
    ``<details>`` section (one click opens it, in Lab and on the site).

    The text/plain twin keeps the whole content: it is what strict nbval compares, so a
    collapsed table is asserted as fully as a shown one.
    """

    def __init__(self, summary: str, content: Any) -> None:
        self.summary = summary
        self.content = content

    def _content_html(self) -> str:
        if hasattr(self.content, "_repr_html_"):
            return self.content._repr_html_()
        return f"<pre>{html.escape(str(self.content))}</pre>"

    def _repr_html_(self) -> str:
        return (f"<details><summary>{html.escape(self.summary)}</summary>\n"
                f"{self._content_html()}\n</details>")

    def __repr__(self) -> str:
        return f"{self.summary}\n{self.content!r}" if isinstance(self.content, Table) else (
            f"{self.summary}\n{self.content}")


def collapsed(content: Any, summary: str) -> Collapsed:
    """``content`` (a :class:`Table`, or text such as source code) behind a closed
    ``<details>`` section headed by ``summary``."""
    return Collapsed(summary, content)
