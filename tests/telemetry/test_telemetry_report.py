"""The HTML report: escaped, self-contained, with well-formed inline SVG charts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from tryloop.telemetry.report import Report, histogram_bins, nice_ticks, render_tables

SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<script>alert('pwned')</script>"


def _report() -> Report:
    return (Report(f"run {EVIL}", subtitle="step 0-3 & more")
            .add_metrics({"pass@1": 0.4213, "episodes": 12345, EVIL: None})
            .add_line_chart("reward", {"train": [(0, 0.1), (1, 0.3), (2, 0.35), (3, 0.5)],
                                       "held-out": [(0, 0.1), (1, None), (2, 0.3), (3, 0.4)],
                                       EVIL: [0.2, 0.25]}, y_label="mean reward")
            .add_bars("termination reasons", {"submitted": 90, "turn_limit": 8, EVIL: 2})
            .add_histogram("completion tokens", [100, 120, 130, 400, 410, 900], bins=4, x_label="tokens")
            .add_table("episodes", ["task", "verdict", "reward", "last output"],
                       [["calc/add", "pass", 1.0, EVIL], ["calc/mean", "fail", 0.0, "x\n" * 40],
                        ["<b>bold</b>", None, None, "[bold]not markup[/bold]"]],
                       caption=EVIL)
            .add_text(f"agent said: {EVIL}", title="notes"))


def _svgs(doc: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", doc, flags=re.S)]


def test_agent_text_is_escaped_everywhere(tmp_path):
    doc = _report().write(tmp_path / "r.html").read_text()
    assert "<script" not in doc.lower()
    assert "<b>bold</b>" not in doc
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in doc
    assert "&lt;b&gt;bold&lt;/b&gt;" in doc
    # Belt and braces: the page forbids scripts even if an escape were missed.
    assert "Content-Security-Policy" in doc and "default-src 'none'" in doc


def test_charts_are_inline_wellformed_svg():
    doc = _report().to_html()
    line, bars, hist = _svgs(doc)             # one per chart, in order
    # A None breaks held-out's line: its first point stands alone (a marker, no line), the rest is a line.
    assert len(line.findall(f"{SVG}polyline")) == 1 + 1 + 1
    assert len(line.findall(f"{SVG}circle")) == 4 + 3 + 2
    labels = [t.text for t in line.iter(f"{SVG}text")]
    assert EVIL in labels                      # the legend shows it as text (parsed back from escapes)
    assert {"0", "1", "2", "3"} <= set(labels)  # integer steps, no ticks between them
    assert len(bars.findall(f"{SVG}rect")) == 3
    assert sum(int(r.findtext(f"{SVG}title").rsplit(" ", 1)[1]) for r in hist.findall(f"{SVG}rect")) == 6
    # Self-contained: no link to anything outside the file.
    assert not re.search(r"(src|href)=", doc) and "@import" not in doc


def test_empty_charts_say_so():
    doc = Report("empty").add_line_chart("r", {"a": []}).add_bars("b", {}).add_histogram("h", []).to_html()
    assert doc.count("no data") == 3 and len(_svgs(doc)) == 3


def test_table_rows_must_match_columns():
    with pytest.raises(ValueError, match="row 1"):
        Report("x").add_table("t", ["a", "b"], [[1, 2], [3]])


def test_console_renders_tables_as_text_not_markup():
    console = Console(record=True, width=120)
    render_tables(_report(), console)
    out = console.export_text()
    assert "episodes" in out and "calc/add" in out and "12,345" in out
    assert "[bold]not markup[/bold]" in out     # shown literally, not interpreted
    assert EVIL in out
    assert "… (+36 lines)" in out               # long cells are clipped on a terminal


def test_ticks_and_bins_by_hand():
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 17, 4) == [0, 5, 10, 15, 20]
    assert nice_ticks(0.13, 0.87, 4) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 1, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert histogram_bins([0, 1, 2, 3, 4], 2) == [(0, 2, 2), (2, 4, 3)]   # the last bin is closed
    assert histogram_bins([5, 5], 10) == [(5, 5, 2)]
