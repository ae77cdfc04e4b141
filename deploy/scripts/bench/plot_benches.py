#!/usr/bin/env python3
"""Plots of the benches' JSON reports as SVG files to commit (Python 3 standard library only).

    python3 deploy/scripts/bench/plot_benches.py [DIR]      # DIR: default docs/bench of this repository

Reads the reports in DIR and writes, next to them, one SVG per plot whose input is there. A missing
input skips its plot with one line on stderr; a malformed report is an error naming the file and the key
(exit status 1; the other plots are still written). Same input, byte-identical output.

  answer-recall-by-budget.svg  eval-squad.json (+ eval-scifact.json, eval-cosqa.json: a panel each when
                               their by_budget carries answer_recall), reports of `ragstream eval`:
      cargo run -- eval --dataset squad --out docs/bench/eval-squad.json
      cargo run -- eval --dataset scifact --out docs/bench/eval-scifact.json
      cargo run -- eval --dataset cosqa --out docs/bench/eval-cosqa.json
  latency-idle-vs-ingest.svg   load.json, the report of `ragstream bench load`:
      ./deploy/scripts/bench/load.sh > docs/bench/load.json
  volume-ingest-rate.svg       volume.json, the report of `ragstream bench volume`:
      ./deploy/scripts/bench/volume.sh > docs/bench/volume.json
"""

import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

ROOT = Path(__file__).resolve().parents[3]
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7")  # Okabe-Ito: told apart by colour-blind readers
MARKERS = ("circle", "square", "triangle", "diamond")
W, LEFT, PLOT_W, PANEL_H, PLOT_H = 720, 72, 420, 272, 190  # legend to the right of the plot area
FONT = 'font-family="sans-serif"'


class ReportError(Exception):
    """A report that cannot be plotted: the message names the file and what is wrong."""


def f1(v):
    return f"{v:.1f}"


# ---- the line-chart helper ----------------------------------------------------------------------

def nice_ticks(lo, hi, count=5):
    """Ticks on a 1/2/5 x 10^k step covering [lo, hi], and the decimals their labels need."""
    if hi <= lo:
        lo, hi = (0.0, 1.0) if lo == 0 else (lo - abs(lo) / 2, hi + abs(hi) / 2)  # one value: an axis around it
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [i * step for i in range(first, last + 1)], max(0, -math.floor(math.log10(step) + 1e-9))


def number(v, decimals):
    if decimals == 0 and abs(v) >= 10000:  # index sizes: 250k, 1.5M
        for div, unit in ((1e6, "M"), (1e3, "k")):
            if abs(v) >= div:
                text = f"{v / div:.2f}".rstrip("0").rstrip(".")
                return text + unit
    return f"{v:.{decimals}f}"


def linear_axis(values, lo=0.0, hi=None):
    """(domain low, domain high, [(tick, label)], data -> axis value), covering values, lo (None: the
    lowest value) and hi."""
    low = min(values) if lo is None else min(lo, min(values))
    ticks, decimals = nice_ticks(low, max(values) if hi is None else max(hi, max(values)))
    return ticks[0], ticks[-1], [(t, number(t, decimals)) for t in ticks], float


def log_axis(values):
    """A log scale ticked at the data's own values (token budgets double: evenly spaced)."""
    logs = sorted({math.log(v) for v in values})
    pad = (logs[-1] - logs[0]) * 0.06 or 1.0
    ticks = [(math.log(v), f"{v:g}") for v in sorted(set(values))]
    return logs[0] - pad, logs[-1] + pad, ticks, math.log


def category_axis(names):
    return -0.5, len(names) - 0.5, [(i, n) for i, n in enumerate(names)], float


def marker(kind, x, y, colour):
    fill = f'fill="{colour}" stroke="#ffffff" stroke-width="1"'
    if kind == "circle":
        return f'<circle cx="{f1(x)}" cy="{f1(y)}" r="4.0" {fill}/>'
    if kind == "square":
        return f'<rect x="{f1(x - 3.5)}" y="{f1(y - 3.5)}" width="7.0" height="7.0" {fill}/>'
    if kind == "triangle":
        return f'<path d="M{f1(x)},{f1(y - 5)} L{f1(x + 4.5)},{f1(y + 3.5)} L{f1(x - 4.5)},{f1(y + 3.5)} Z" {fill}/>'
    return f'<path d="M{f1(x)},{f1(y - 5)} L{f1(x + 5)},{f1(y)} L{f1(x)},{f1(y + 5)} L{f1(x - 5)},{f1(y)} Z" {fill}/>'


def panel(top, title, series, xaxis, yaxis, xlabel, ylabel):
    """One plot area with its axes, grid, ticks, one polyline and markers per series, and a legend.
    series: dicts with label, points [(x, y)], colour, marker and dashed."""
    x0, x1, xticks, xf = xaxis
    y0, y1, yticks, yf = yaxis
    pt, pb = top + 30, top + 30 + PLOT_H
    ax = lambda v: LEFT + (v - x0) / (x1 - x0) * PLOT_W  # ax, ay: axis value -> SVG; sx, sy: data -> SVG
    ay = lambda v: pb - (v - y0) / (y1 - y0) * PLOT_H
    sx, sy = lambda v: ax(xf(v)), lambda v: ay(yf(v))
    out = [f'<text x="{LEFT}" y="{top + 18}" font-size="13" font-weight="bold" {FONT}>{escape(title)}</text>']
    for v, label in yticks:
        y = f1(ay(v))
        out.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y}" dy="4" text-anchor="end" font-size="11" {FONT}>{label}</text>')
    for v, label in xticks:
        x = f1(ax(v))
        out.append(f'<line x1="{x}" y1="{pb}" x2="{x}" y2="{pb + 5}" stroke="#333333"/>')
        out.append(f'<text x="{x}" y="{pb + 18}" text-anchor="middle" font-size="11" {FONT}>{escape(label)}</text>')
    out.append(f'<rect x="{LEFT}" y="{pt}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#333333"/>')
    out.append(f'<text x="{LEFT + PLOT_W / 2:.1f}" y="{pb + 38}" text-anchor="middle" font-size="12" {FONT}>'
               f'{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(16,{(pt + pb) / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12" {FONT}>{escape(ylabel)}</text>')
    for i, s in enumerate(series):
        dash = ' stroke-dasharray="6 4"' if s["dashed"] else ""
        pts = " ".join(f"{f1(sx(x))},{f1(sy(y))}" for x, y in s["points"])
        out.append(f'<polyline class="series" data-label={quoteattr(s["label"])} points="{pts}" fill="none" '
                   f'stroke="{s["colour"]}" stroke-width="2"{dash}/>')
        out += [marker(s["marker"], sx(x), sy(y), s["colour"]) for x, y in s["points"]]
        lx, ly = LEFT + PLOT_W + 14, pt + 8 + i * 20
        out.append(f'<g class="legend"><line x1="{lx}" y1="{ly}" x2="{lx + 28}" y2="{ly}" stroke="{s["colour"]}" '
                   f'stroke-width="2"{dash}/>{marker(s["marker"], lx + 14, ly, s["colour"])}'
                   f'<text x="{lx + 34}" y="{ly}" dy="4" font-size="11" {FONT}>{escape(s["label"])}</text></g>')
    return out


def svg(title, panels, caption):
    """The document: title, the panels (from panel()) stacked, and the caption lines at the bottom."""
    height = 40 + PANEL_H * len(panels) + 16 * len(caption) + 8
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}">',
           f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
           f'<text x="{W / 2:.0f}" y="26" text-anchor="middle" font-size="16" font-weight="bold" {FONT}>'
           f'{escape(title)}</text>']
    for i, args in enumerate(panels):
        out += panel(40 + i * PANEL_H, *args)
    for i, line in enumerate(caption):
        y = 40 + PANEL_H * len(panels) + 12 + 16 * i
        out.append(f'<text class="caption" x="{LEFT}" y="{y}" font-size="11" fill="#555555" {FONT}>'
                   f'{escape(line)}</text>')
    return "\n".join(out + ["</svg>", ""])


def series(label, points, i, dashed=False, colour=None):
    return {"label": label, "points": points, "colour": colour or COLOURS[i % 4],
            "marker": MARKERS[i % 4], "dashed": dashed}


# ---- reading the reports ------------------------------------------------------------------------

def load(path):
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ReportError(f"{path.name}: not a JSON report ({e})") from None
    if not isinstance(report, dict):
        raise ReportError(f"{path.name}: not a JSON object")
    return report


def need(report, key, kind, file):
    """report's value at the dotted key, of kind dict, list or float (a JSON number)."""
    value = report
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ReportError(f"{file}: missing `{key}`")
        value = value[part]
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReportError(f"{file}: `{key}` is not a number")
        return float(value)
    if not isinstance(value, kind):
        raise ReportError(f"{file}: `{key}` is not a JSON {'object' if kind is dict else 'array'}")
    return value


def source(file, report, details=""):
    date = next((str(report[k]) for k in ("date", "measured", "generated_at", "timestamp") if k in report), None)
    return f"Source: {file}" + (f", {date}" if date else " (no date in the report)") + details


def recall_points(report, key, file):
    """[(budget, answer_recall)] of the by_budget map at key, sorted; [] when it has no answer_recall."""
    points = []
    for budget, measures in need(report, key, dict, file).items():
        if not budget.isdigit() or int(budget) <= 0:
            raise ReportError(f"{file}: `{key}` has a budget `{budget}` that is not a token count")
        if isinstance(measures, dict) and "answer_recall" in measures:
            points.append((int(budget), need(measures, "answer_recall", float, f"{file} `{key}.{budget}`")))
    return sorted(points)


def plot_recall(d):
    panels, sources, notes = [], [], []
    for name, label in (("squad", "SQuAD"), ("scifact", "SciFact"), ("cosqa", "CoSQA")):
        file = f"eval-{name}.json"
        if not (d / file).exists():
            continue
        report, lines = load(d / file), []
        need(report, "ragstream.by_budget", dict, file)  # required; fill and the baseline when reported
        for i, (key, what) in enumerate((("ragstream.by_budget", "ragstream, default"),
                                         ("ragstream.by_budget_fill", "ragstream, fill"),
                                         ("naive_dense_topk.by_budget", "naive dense top-k"))):
            owner, last = key.rsplit(".", 1)
            if last in need(report, owner, dict, file):
                points = recall_points(report, key, file)
                if points:
                    lines.append(series(what, points, i, dashed=(i == 2)))
        if not lines:
            notes.append(f"{label}: {file} has no per-budget answer_recall (ranking measures only); not plotted.")
            continue
        xs = [x for s in lines for x, _ in s["points"]]
        ys = [y for s in lines for _, y in s["points"]]
        queries = report.get("queries")
        panels.append((label + (f" ({queries} questions)" if isinstance(queries, int) else ""), lines,
                       log_axis(xs), linear_axis(ys, lo=None, hi=1.0),
                       "token budget (tokens, log scale)", "Answer Recall (fraction)"))
        sources.append(source(file, report))
    if not panels:
        raise ReportError("no eval report has per-budget answer_recall: " + " ".join(notes))
    notes.append("Answer Recall: the share of questions whose packed context holds an answer string;")
    notes.append("the y axis starts at its lowest tick, not at 0.")
    return svg("Answer Recall by token budget (ragstream eval)", panels, sources + notes)


PERCENTILES = (("p50_ms", "p50"), ("p90_ms", "p90"), ("p95_ms", "p95"), ("p99_ms", "p99"), ("max_ms", "max"))


def plot_load(d):
    file = "load.json"
    report = load(d / file)
    first = need(report, "idle.with_query_embedding", dict, file)
    pcts = [(k, name) for k, name in PERCENTILES if k in first]
    if not pcts:
        raise ReportError(f"{file}: `idle.with_query_embedding` has no p50_ms/p99_ms/max_ms")
    lines = []
    for i, (kind, what) in enumerate((("with_query_embedding", "query embedded"),
                                      ("embedding_cached", "embedding cached"))):
        for j, (phase, when) in enumerate((("idle", "idle"), ("loaded", "ingest"))):
            summary = need(report, f"{phase}.{kind}", dict, file)
            points = [(n, need(summary, k, float, f"{file} `{phase}.{kind}`")) for n, (k, _) in enumerate(pcts)]
            lines.append(series(f"{when}, {what}", points, 2 * i + j, dashed=(i == 1), colour=COLOURS[j]))
    ys = [y for s in lines for _, y in s["points"]]
    rate = need(report, "ingest.chunks_per_s", float, file)
    embedder = report.get("embedder", {})
    if isinstance(embedder, dict):
        embedder = " ".join(str(embedder.get(k, "")) for k in ("kind", "precision")).strip() or "?"
    caption = [source(file, report, f"; embedder: {embedder}; index: {report.get('index', '?')}"),
               f"idle: nothing ingested; ingest: while the rest of the corpus streams in ({rate:.0f} chunks/s).",
               "Solid: the query is embedded on the way; dashed: its embedding is cached (no model time)."]
    return svg("Query latency: idle vs under ingest (ragstream bench load)",
               [("POST /v1/query round trip", lines, category_axis([n for _, n in pcts]),
                 linear_axis(ys, lo=0), "percentile", "latency (ms)")], caption)


def plot_volume(d):
    file = "volume.json"
    report = load(d / file)
    bands = need(report, "grow.bands", list, file)
    rate = [(need(b, "chunks", float, f"{file} `grow.bands[{i}]`"),
             need(b, "chunks_per_s", float, f"{file} `grow.bands[{i}]`")) for i, b in enumerate(bands)]
    p50, p99 = [], []
    for i, band in enumerate(need(report, "grow.queries_by_band", list, file)):
        where = f"{file} `grow.queries_by_band[{i}]`"
        middle = (need(band, "chunks_from", float, where) + need(band, "chunks_to", float, where)) / 2
        trip = need(band, "queries.round_trip", dict, where)
        if trip.get("n", 1) == 0:
            continue  # no query answered while the index grew through this band
        p50.append((middle, need(trip, "p50_ms", float, where)))
        p99.append((middle, need(trip, "p99_ms", float, where)))
    if not rate or not p50:
        raise ReportError(f"{file}: `grow.bands` or `grow.queries_by_band` holds no measurement")
    xs = [x for x, _ in rate + p50] + [0.0]
    grown = need(report, "grow.chunks", float, file)
    seconds = need(report, "grow.seconds", float, file)
    caption = [source(file, report, f"; grew to {grown:.0f} chunks in {seconds:.0f} s "
                      f"({report.get('workers', '?')} worker(s), {report.get('cores', '?')} cores)"),
               "Query points sit at the middle of their band of index sizes; embedder: instant (model time excluded)."]
    return svg("Index growth: ingest rate and query latency (bench volume)", [
        ("Ingest rate per band", [series("ingest rate", rate, 0)], linear_axis(xs),
         linear_axis([y for _, y in rate], lo=0), "index size (chunks)", "ingest rate (chunks/s)"),
        ("Query round trip while growing", [series("round trip p50", p50, 1), series("round trip p99", p99, 2)],
         linear_axis(xs), linear_axis([y for _, y in p50 + p99], lo=0), "index size (chunks)", "latency (ms)"),
    ], caption)


PLOTS = (("answer-recall-by-budget.svg", "eval-squad.json", plot_recall),
         ("latency-idle-vs-ingest.svg", "load.json", plot_load),
         ("volume-ingest-rate.svg", "volume.json", plot_volume))


def main(argv):
    d = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "bench"
    if not d.is_dir():
        print(f"plot_benches: error: {d} is not a directory", file=sys.stderr)
        return 2
    status = 0
    for name, needed, build in PLOTS:
        if not (d / needed).exists():
            print(f"plot_benches: skipping {name}: no {needed} in {d}", file=sys.stderr)
            continue
        try:
            (d / name).write_bytes(build(d).encode("utf-8"))
            print(f"wrote {d / name}")
        except ReportError as e:
            print(f"plot_benches: error: {name} not written: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
