"""Reports: one self-contained HTML file (inline CSS, inline SVG charts) and the
same tables on a rich console.

    Report("run r1").add_metrics({"pass@1": "0.42"}).add_line_chart("reward", {"train": pts})
        .add_bars("time split", {"model": 812.0, "env": 301.5}, unit="s")
        .add_table("episodes", ["task", "verdict"], rows).write("report.html")

Everything shown may come from an agent (task ids, tool output, error text), so
every string is HTML-escaped where it is written — element text and attributes,
in HTML and in SVG — and the page's Content-Security-Policy forbids scripts as a
second line of defence. On the console, cells are rich `Text`, never markup.
No JavaScript, no external assets: the file opens the same offline, years later.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text as RichText

Cell = str | int | float | bool | None
Point = tuple[float, float | None]
BandPoint = tuple[float, float | None, float | None]   # (x, lo, hi); a None breaks the band

# Colour-blind-safe (Okabe-Ito, reordered so the first few contrast on white).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


# ---- sections -------------------------------------------------------------------------

@dataclass
class Text:
    text: str
    title: str = ""


@dataclass
class Metrics:
    items: list[tuple[str, Cell]]
    title: str = ""


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""


@dataclass
class Series:
    name: str
    points: list[Point]            # (x, y); y None breaks the line


@dataclass
class LineChart:
    title: str
    series: list[Series]
    x_label: str = ""
    y_label: str = ""
    y_range: tuple[float, float] | None = None
    caption: str = ""
    # Interval bands, keyed by the name of the series they belong to (drawn shaded in its colour).
    bands: dict[str, list[BandPoint]] = field(default_factory=dict)
    dashed: frozenset[str] = frozenset()   # names of series drawn dashed (fits, references)


@dataclass
class Bars:
    title: str
    items: list[tuple[str, float]]
    unit: str = ""
    caption: str = ""


@dataclass
class Histogram:
    title: str
    values: list[float]
    bins: int = 20
    x_label: str = ""
    caption: str = ""


Section = Text | Metrics | Table | LineChart | Bars | Histogram


@dataclass
class Report:
    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)

    def add_text(self, text: str, title: str = "") -> Report:
        self.sections.append(Text(text, title))
        return self

    def add_metrics(self, metrics: Mapping[str, Cell] | Iterable[tuple[str, Cell]], title: str = "") -> Report:
        """Headline numbers, shown as cards."""
        items = list(metrics.items()) if isinstance(metrics, Mapping) else list(metrics)
        self.sections.append(Metrics(items, title))
        return self

    def add_table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[Cell]], *,
                  caption: str = "") -> Report:
        rows = [list(r) for r in rows]
        for i, r in enumerate(rows):
            if len(r) != len(columns):
                raise ValueError(f"table {title!r}: row {i} has {len(r)} cells for {len(columns)} columns")
        self.sections.append(Table(title, list(columns), rows, caption))
        return self

    def add_line_chart(self, title: str, series: Mapping[str, Iterable[Point] | Iterable[float | None]], *,
                       x_label: str = "step", y_label: str = "", y_range: tuple[float, float] | None = None,
                       caption: str = "", bands: Mapping[str, Iterable[BandPoint]] | None = None,
                       dashed: Iterable[str] = ()) -> Report:
        """Curves over a shared x axis. Each series is (x, y) points, or plain y values
        (x = 0, 1, 2...). A y of None leaves a gap. `bands` shades an interval around
        a series: {series name: [(x, lo, hi), ...]} (a lone point gets an error bar; a
        None bound leaves a gap). Series named in `dashed` are drawn dashed."""
        out = []
        for name, pts in series.items():
            points: list[Point] = []
            for i, p in enumerate(pts):
                x, y = (p[0], p[1]) if isinstance(p, tuple | list) else (i, p)
                points.append((float(x), None if y is None or _bad(y) else float(y)))
            out.append(Series(name, points))
        names = {s.name for s in out}
        band_pts: dict[str, list[BandPoint]] = {}
        for name, pts in (bands or {}).items():
            if name not in names:
                raise ValueError(f"chart {title!r}: band for unknown series {name!r}")
            band_pts[name] = [(float(x), None if lo is None or _bad(lo) else float(lo),
                               None if hi is None or _bad(hi) else float(hi)) for x, lo, hi in pts]
        self.sections.append(LineChart(title, out, x_label, y_label, y_range, caption, band_pts,
                                       frozenset(dashed)))
        return self

    def add_bars(self, title: str, values: Mapping[str, float] | Iterable[tuple[str, float]], *, unit: str = "",
                 caption: str = "") -> Report:
        """Labelled quantities (time split, termination reasons, flags by kind), as
        horizontal bars in the order given."""
        items = list(values.items()) if isinstance(values, Mapping) else list(values)
        self.sections.append(Bars(title, [(str(k), float(v)) for k, v in items], unit, caption))
        return self

    def add_histogram(self, title: str, values: Iterable[float], *, bins: int = 20, x_label: str = "",
                      caption: str = "") -> Report:
        if bins < 1:
            raise ValueError(f"bins must be >= 1, not {bins}")
        vals = [float(v) for v in values if v is not None and not _bad(v)]
        self.sections.append(Histogram(title, vals, bins, x_label, caption))
        return self

    def to_html(self) -> str:
        body = "\n".join(_section_html(s) for s in self.sections)
        sub = f'<p class="sub">{_e(self.subtitle)}</p>' if self.subtitle else ""
        made = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" "
            "content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n"
            f"<title>{_e(self.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
            f"<header><h1>{_e(self.title)}</h1>{sub}<p class=\"made\">generated {_e(made)}</p></header>\n"
            f"{body}\n</main>\n</body>\n</html>\n")

    def write(self, path: str | Path) -> Path:
        """Write the HTML file (via a temporary name: a viewer never sees half a report)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{time.time_ns()}")
        tmp.write_text(self.to_html(), encoding="utf-8")
        tmp.replace(path)
        return path


# ---- formatting -----------------------------------------------------------------------

def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _bad(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def fmt(v: Cell) -> str:
    """A cell as text: integers grouped, floats to 4 significant digits, None as a dash."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        if abs(v) < 1e-3:
            return f"{v:.2e}"
        return f"{v:.4g}"
    return str(v)


def _numeric(rows: list[list[Cell]], col: int) -> bool:
    vals = [r[col] for r in rows if r[col] is not None]
    return bool(vals) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def _tick_label(v: float, step: float) -> str:
    """Just enough decimals to tell ticks `step` apart."""
    d = next((d for d in range(7) if abs(round(step, d) - step) <= 1e-9 * max(1.0, abs(step))), 6)
    if d == 0:
        return f"{round(v):,}" if abs(v) < 1e6 else f"{v:.3g}"
    return f"{v:.{d}f}"


def _approx_width(s: str, size: float = 11) -> float:
    return len(s) * size * 0.58


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


# ---- HTML sections --------------------------------------------------------------------

def _section_html(s: Section) -> str:
    title = getattr(s, "title", "")
    head = f"<h2>{_e(title)}</h2>" if title else ""
    caption = getattr(s, "caption", "")
    foot = f'<p class="caption">{_e(caption)}</p>' if caption else ""
    if isinstance(s, Text):
        inner = "".join(f"<p>{_e(p)}</p>" for p in s.text.split("\n\n"))
    elif isinstance(s, Metrics):
        inner = '<div class="metrics">' + "".join(
            f'<div class="metric"><div class="v">{_e(fmt(v))}</div><div class="k">{_e(k)}</div></div>'
            for k, v in s.items) + "</div>"
    elif isinstance(s, Table):
        inner = _table_html(s)
    elif isinstance(s, LineChart):
        inner = _line_svg(s)
    elif isinstance(s, Bars):
        inner = _bars_svg(s)
    else:
        inner = _hist_svg(s)
    return f'<section class="card">{head}{inner}{foot}</section>'


def _cell_html(v: Cell) -> str:
    text = fmt(v)
    if v is None:
        return '<span class="none">—</span>'
    if isinstance(v, str) and (len(v) > 80 or "\n" in v):
        return f'<div class="long">{_e(text)}</div>'
    return _e(text)


def _table_html(t: Table) -> str:
    num = [_numeric(t.rows, i) for i in range(len(t.columns))]
    cls = ['class="num"' if n else "" for n in num]
    head = "".join(f"<th {c}>{_e(col)}</th>" for col, c in zip(t.columns, cls, strict=True))
    body = "".join("<tr>" + "".join(f"<td {c}>{_cell_html(v)}</td>" for v, c in zip(r, cls, strict=True)) + "</tr>"
                   for r in t.rows)
    if not t.rows:
        body = f'<tr><td colspan="{len(t.columns)}" class="none">no rows</td></tr>'
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


# ---- SVG charts -------------------------------------------------------------------------

_W = 760
_FONT = 'font-size="11" fill="#6b7280"'


def _svg(height: float, body: str, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height:.0f}" role="img" '
            f'aria-label="{_e(label)}">{body}</svg>')


def _empty(title: str) -> str:
    return _svg(60, f'<text x="{_W / 2}" y="34" text-anchor="middle" {_FONT}>no data</text>', title)


def _legend(names: list[str], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Legend entries laid out in rows; returns the SVG and the height used."""
    out, x, y = [], x0, y0
    for i, name in enumerate(names):
        label = _clip(name, 40)
        w = 18 + _approx_width(label, 12) + 18
        if x + w > x0 + width and x > x0:
            x, y = x0, y + 18
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{x:.1f}" y="{y - 5.5:.1f}" width="12" height="3" rx="1.5" fill="{color}"/>'
                   f'<text x="{x + 18:.1f}" y="{y:.1f}" font-size="12" fill="#374151">{_e(label)}'
                   f'<title>{_e(name)}</title></text>')
        x += w
    return "".join(out), y - y0 + 18


def _line_svg(c: LineChart) -> str:
    pts = [(x, y) for s in c.series for x, y in s.points if y is not None]
    if not pts:
        return _empty(c.title)
    pts += [(x, v) for band in c.bands.values() for x, lo, hi in band if lo is not None and hi is not None
            for v in (lo, hi)]
    left, right = 64, 20
    legend, legend_h = _legend([s.name for s in c.series], left, 16, _W - left - right)
    top, plot_h = 16 + legend_h + 8, 230
    height = top + plot_h + 48
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_ticks = nice_ticks(*(c.y_range or (min(ys), max(ys))))
    y_lo, y_hi = (c.y_range or (y_ticks[0], y_ticks[-1]))
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 1, y_hi + 1
    y_ticks = [t for t in y_ticks if y_lo - 1e-12 <= t <= y_hi + 1e-12]
    plot_w = _W - left - right

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (min(max(y, y_lo), y_hi) - y_lo) / (y_hi - y_lo) * plot_h

    parts = []
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    for t in y_ticks:
        parts.append(f'<line x1="{left}" x2="{_W - right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{left - 8}" y="{py(t) + 4:.1f}" text-anchor="end" {_FONT}>'
                     f'{_e(_tick_label(t, y_step))}</text>')
    x_ticks = [t for t in nice_ticks(x_lo, x_hi, 6) if x_lo - 1e-9 <= t <= x_hi + 1e-9]
    if all(float(x).is_integer() for x in xs):   # steps: no tick between two steps
        x_ticks = [t for t in x_ticks if float(t).is_integer()] or [x_lo, x_hi]
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    base = top + plot_h
    parts.append(f'<line x1="{left}" x2="{_W - right}" y1="{base}" y2="{base}" stroke="#9ca3af"/>')
    for t in x_ticks:
        parts.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{base}" y2="{base + 4}" stroke="#9ca3af"/>'
                     f'<text x="{px(t):.1f}" y="{base + 17}" text-anchor="middle" {_FONT}>'
                     f'{_e(_tick_label(t, x_step))}</text>')
    if c.x_label:
        parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 8:.1f}" text-anchor="middle" '
                     f'font-size="12" fill="#374151">{_e(c.x_label)}</text>')
    if c.y_label:
        parts.append(f'<text transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" '
                     f'font-size="12" fill="#374151">{_e(c.y_label)}</text>')
    colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(c.series)}
    for name, band in c.bands.items():     # under the lines
        color = colors[name]
        spans: list[list[tuple[float, float, float]]] = [[]]
        for x, lo, hi in sorted(band, key=lambda p: p[0]):
            if lo is None or hi is None:
                spans.append([])
            else:
                spans[-1].append((x, min(lo, hi), max(lo, hi)))
        for span in spans:
            tip = "".join(f"{fmt(x)}: [{fmt(lo)}, {fmt(hi)}]\n" for x, lo, hi in span).strip()
            if len(span) > 1:
                edge = [f"{px(x):.1f},{py(hi):.1f}" for x, _, hi in span]
                edge += [f"{px(x):.1f},{py(lo):.1f}" for x, lo, _ in reversed(span)]
                parts.append(f'<polygon points="{" ".join(edge)}" fill="{color}" fill-opacity="0.16" '
                             f'stroke="{color}" stroke-opacity="0.35" stroke-width="0.75">'
                             f'<title>{_e(name)} interval\n{_e(tip)}</title></polygon>')
            elif span:
                x, lo, hi = span[0]
                parts.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(lo):.1f}" y2="{py(hi):.1f}" '
                             f'stroke="{color}" stroke-opacity="0.6" stroke-width="2">'
                             f'<title>{_e(name)} interval {_e(tip)}</title></line>')
    dense = sum(len(s.points) for s in c.series) > 120
    for i, s in enumerate(c.series):
        color = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.name in c.dashed else ""
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in sorted(s.points, key=lambda p: p[0]):
            if y is None:
                runs.append([])
            else:
                runs[-1].append((x, y))
        for run in runs:
            if len(run) > 1:
                coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2" '
                             f'stroke-linejoin="round" stroke-linecap="round"{dash}/>')
            if dash and len(run) > 1:
                continue   # a fit or reference line: no markers
            for x, y in run:
                # Isolated points need a marker to be seen at all; dense curves only get hover targets.
                r = 2.5 if not dense or len(run) == 1 else 1.5
                parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{r}" fill="{color}">'
                             f'<title>{_e(s.name)}: {_e(fmt(x))}, {_e(fmt(y))}</title></circle>')
    return _svg(height, legend + "".join(parts), c.title)


def _bars_svg(b: Bars) -> str:
    if not b.items:
        return _empty(b.title)
    row, label_w, value_w = 26, 200, 110
    height = len(b.items) * row + 12
    top = 6
    bar_w = _W - label_w - value_w - 16
    peak = max((v for _, v in b.items if math.isfinite(v)), default=0.0)
    total = sum(v for _, v in b.items if math.isfinite(v) and v > 0)
    parts = []
    for i, (label, v) in enumerate(b.items):
        y = top + i * row
        w = 0.0 if not math.isfinite(v) or v <= 0 or peak <= 0 else max(1.0, v / peak * bar_w)
        share = f" ({v / total:.0%})" if total > 0 and len(b.items) > 1 and v >= 0 else ""
        value = f"{fmt(v)}{(' ' + b.unit) if b.unit else ''}{share}"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + row / 2 + 4:.1f}" text-anchor="end" font-size="12" fill="#374151">'
            f'{_e(_clip(label, 30))}<title>{_e(label)}</title></text>'
            f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row - 8}" rx="3" '
            f'fill="{PALETTE[0]}"><title>{_e(label)}: {_e(value)}</title></rect>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + row / 2 + 4:.1f}" {_FONT}>{_e(value)}</text>')
    return _svg(height, "".join(parts), b.title)


def histogram_bins(values: Sequence[float], bins: int) -> list[tuple[float, float, int]]:
    """Equal-width bins over [min, max] as (lo, hi, count); the last bin is closed."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if lo == hi:
        return [(lo, hi, len(values))]
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return [(lo + i * width, lo + (i + 1) * width if i < bins - 1 else hi, n) for i, n in enumerate(counts)]


def _hist_svg(h: Histogram) -> str:
    bins = histogram_bins(h.values, h.bins)
    if not bins:
        return _empty(h.title)
    left, right, top, plot_h = 64, 20, 12, 200
    height = top + plot_h + 48
    plot_w = _W - left - right
    x_lo, x_hi = bins[0][0], bins[-1][1]
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    peak = max(n for _, _, n in bins)
    y_ticks = [t for t in nice_ticks(0, peak, 4) if t >= 0 and float(t).is_integer()] or [0.0, float(peak)]
    y_hi = max(y_ticks[-1], peak)

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(n: float) -> float:
        return top + plot_h - n / y_hi * plot_h

    parts = []
    for t in y_ticks:
        parts.append(f'<line x1="{left}" x2="{_W - right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{left - 8}" y="{py(t) + 4:.1f}" text-anchor="end" {_FONT}>{int(t):,}</text>')
    for lo, hi, n in bins:
        x0, x1 = (px(lo), px(hi)) if hi > lo else (px(x_lo), px(x_hi))
        parts.append(f'<rect x="{x0 + 0.5:.1f}" y="{py(n):.1f}" width="{max(0.5, x1 - x0 - 1):.1f}" '
                     f'height="{py(0) - py(n):.1f}" fill="{PALETTE[0]}" fill-opacity="0.85">'
                     f'<title>[{_e(fmt(lo))}, {_e(fmt(hi))}]: {n}</title></rect>')
    base = top + plot_h
    parts.append(f'<line x1="{left}" x2="{_W - right}" y1="{base}" y2="{base}" stroke="#9ca3af"/>')
    x_ticks = [t for t in nice_ticks(x_lo, x_hi, 6) if x_lo - 1e-9 <= t <= x_hi + 1e-9]
    step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in x_ticks:
        parts.append(f'<text x="{px(t):.1f}" y="{base + 17}" text-anchor="middle" {_FONT}>'
                     f'{_e(_tick_label(t, step))}</text>')
    label = f"{h.x_label} (n={len(h.values):,})" if h.x_label else f"n={len(h.values):,}"
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 8:.1f}" text-anchor="middle" font-size="12" '
                 f'fill="#374151">{_e(label)}</text>')
    return _svg(height, "".join(parts), h.title)


_CSS = """
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--card:#fff;--bg:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
 font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1040px;margin:0 auto;padding:32px 24px 64px}
header h1{font-size:24px;margin:0 0 4px;letter-spacing:-.01em}
.sub{margin:0;color:var(--muted)}
.made{margin:2px 0 0;color:var(--muted);font-size:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:16px 0;
 box-shadow:0 1px 2px rgba(16,24,40,.04)}
h2{font-size:15px;margin:0 0 12px}
p{margin:0 0 8px;white-space:pre-wrap;overflow-wrap:anywhere}
.caption{color:var(--muted);font-size:12px;margin:8px 0 0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;font-weight:600;color:var(--muted);white-space:nowrap}
.num{text-align:right;white-space:nowrap}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#f1f5f9}
.none{color:#9ca3af}
.long{max-height:12em;max-width:60ch;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere;
 font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.metrics{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:12px}
.metric{border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.metric .v{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums;overflow-wrap:anywhere}
.metric .k{color:var(--muted);font-size:12px}
svg{display:block;width:100%;height:auto;font-family:inherit}
"""


# ---- console ----------------------------------------------------------------------------

def _console_cell(v: Cell, max_lines: int = 4, max_chars: int = 240) -> str:
    """A cell clipped for a terminal: the HTML report has the whole text."""
    text = fmt(v)
    lines = text.splitlines() or [""]
    if len(lines) > max_lines:
        text = "\n".join(lines[:max_lines]) + f"\n… (+{len(lines) - max_lines} lines)"
    return _clip(text, max_chars)


def render_tables(report: Report, console: Console) -> None:
    """The report's metrics, tables and bar charts on a rich console (charts of curves
    and histograms are left to the HTML). Cells are Text: agent output is never markup."""
    console.print(RichText(report.title, style="bold"))
    if report.subtitle:
        console.print(RichText(report.subtitle, style="dim"))
    for s in report.sections:
        if isinstance(s, Metrics):
            t = RichTable(title=RichText(s.title) if s.title else None, show_header=False, box=None)
            t.add_column(style="dim")
            t.add_column(justify="right")
            for k, v in s.items:
                t.add_row(RichText(k), RichText(fmt(v)))
            console.print(t)
        elif isinstance(s, Table):
            t = RichTable(title=RichText(s.title, style="bold"), caption=RichText(s.caption) if s.caption else None)
            for i, col in enumerate(s.columns):
                t.add_column(RichText(col), justify="right" if _numeric(s.rows, i) else "left",
                             overflow="fold")
            for r in s.rows:
                t.add_row(*(RichText(_console_cell(v)) for v in r))
            console.print(t)
        elif isinstance(s, Bars):
            t = RichTable(title=RichText(s.title, style="bold"), show_header=False)
            t.add_column()
            t.add_column(justify="right")
            t.add_column()
            peak = max((v for _, v in s.items if math.isfinite(v)), default=0.0)
            for label, v in s.items:
                n = 0 if peak <= 0 or not math.isfinite(v) or v <= 0 else max(1, round(v / peak * 30))
                t.add_row(RichText(label), RichText(f"{fmt(v)}{(' ' + s.unit) if s.unit else ''}"),
                          RichText("█" * n, style="blue"))
            console.print(t)
