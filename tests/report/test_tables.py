"""report.tables: one Table, an HTML view and a plain-text twin that agree."""

from __future__ import annotations

import collections
import html
import re

import pytest

from tetrt_support.report.tables import Table, format_table


def test_text_aligns_columns_under_a_rule_and_rejects_ragged_rows() -> None:
    text = format_table([("a", 1, 0.5), ("long name", 22, ("x", "y"))], ["name", "n", "v"])
    assert text.splitlines() == [
        "name       n   v",
        "---------  --  ----",
        "a          1   0.5",
        "long name  22  x, y",
    ]
    with pytest.raises(ValueError, match=r"row \('a',\) has 1 cells but there are 2 headers"):
        Table([("a",)], ["x", "y"])


def test_repr_is_the_text_twin_and_html_holds_the_same_cells() -> None:
    table = Table([("a<b", 1, 0.123456), ("c", 22, [])], ["name", "n", "v"], title="T & U")
    assert repr(table) == str(table) == table.text()
    assert table.text().splitlines()[0] == "T & U"
    page = table._repr_html_()
    assert "<caption>T &amp; U</caption>" in page and "a&lt;b" in page
    cells = [html.unescape(c) for c in re.findall(r"<t[dh](?: [^>]*)?>(.*?)</t[dh]>", page)]
    assert cells == ["name", "n", "v", "a<b", "1", "0.123", "c", "22", "-"]
    assert page == table._repr_html_()  # deterministic: no ids, no addresses
    aligned = re.findall(r'<td style="text-align:(\w+)">(.*?)</td>', Table([("x", "0.958", 3, True)], "abcd")._repr_html_())
    assert aligned == [("left", "x"), ("right", "0.958"), ("right", "3"), ("left", "True")]  # numbers, even as text


def test_wide_tables_split_into_blocks_that_repeat_the_key_column() -> None:
    headers = ["case", *(f"column_{i}" for i in range(8))]
    table = Table([(f"r{r}", *range(8)) for r in range(2)], headers, width=40)
    blocks = table.blocks()
    assert all(b[0] == 0 for b in blocks) and sorted({i for b in blocks for i in b}) == list(range(9))
    assert all(len(line) <= 40 for line in table.text().splitlines())
    assert table._repr_html_().count("<table") == len(blocks) > 1
    assert Table(table.rows, table.headers).blocks() == [list(range(9))]


def test_transposed_turns_rows_into_columns() -> None:
    table = Table([("rewrite", 10, True), ("retrace", 12, False)], ["graph", "nodes", "ok"])
    flipped = table.transposed()
    assert flipped.headers == ("graph", "rewrite", "retrace")
    assert flipped.rows == (("nodes", 10, 12), ("ok", True, False))
    assert flipped.transposed().rows == table.rows


def test_from_records_and_column_access() -> None:
    Row = collections.namedtuple("Row", "name n")
    table = Table.from_records([{"name": "a", "n": 1}, {"name": "b", "n": 2}])
    assert table.column("n") == [1, 2] and table.head(1).rows == (("a", 1),)
    with pytest.raises(KeyError, match=r"no column 'x'; columns are \['name', 'n'\]"):
        table.column("x")
    with pytest.raises(ValueError, match=r"record 1 has keys \['n'\], expected \['name', 'n'\]"):
        Table.from_records([{"name": "a", "n": 1}, {"n": 2}])
    assert Table([Row("a", 1)], Row._fields).rows[0].name == "a"  # NamedTuple rows are kept


def test_tables_fit_the_page_by_default_wrapping_a_column_too_wide_for_any_block() -> None:
    from tetrt_support.report.tables import OUTPUT_WIDTH

    ops = ", ".join(f"aten.op_{i}.default" for i in range(12))
    table = Table([("rule_a", "short", ops), ("rule_b", "x", "one.op")], ["rule", "kind", "ops"])
    lines = table.text().splitlines()
    assert table.width == OUTPUT_WIDTH and len(table.blocks()) == 1  # wrapped in place, not cut
    assert all(len(line) <= OUTPUT_WIDTH for line in lines) and len(lines) > 4
    assert " ".join(w for line in lines[2:-1] for w in line.split() if w.startswith("aten.")) == ops
    assert lines[-1].split() == ["rule_b", "x", "one.op"]
    assert "<td" in table._repr_html_() and table._repr_html_().count("<table") == 1  # the browser wraps HTML
    unlimited = Table(table.rows, table.headers, width=None).text().splitlines()
    assert len(unlimited) == 4 and max(map(len, unlimited)) > OUTPUT_WIDTH
