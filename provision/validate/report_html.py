"""One self-contained HTML file: the fleet's summary, the nodes that need attention, a verdict
table and one inline SVG chart per metric. No external JS, CSS or fonts.

Up to BARS_MAX values a chart draws each node (each GPU, for per-GPU metrics) as a bar
coloured by its verdict, the expectation it was held to as a dashed tick, and the fleet
band (median +- the MAD band the judge used) as a shaded strip. Past that, bars are thinner
than a pixel (8,000 GPUs in 460 px), so the chart becomes a histogram of the values with
the verdicts stacked, the band and the expectations as vertical marks, and the outliers
named under it. Past SMALL_FLEET nodes the per-node tables sit behind a <details> fold: the
page opens on the summary, and the browser does not lay out 8,000 inventory rows until
asked (issue 20: a 1,000-node report opens in headless Chromium, BENCHMARKS.md).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from provision.metrics import METRICS
from provision.validate.judge import band
from provision.validate.records import Finding, NodeResult

COLORS = {"pass": "#2e7d32", "warn": "#f9a825", "fail": "#c62828", "not_run": "#9e9e9e"}
BAND_COLOR = "#90caf9"
EXPECT_COLOR = "#263238"

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#212121;background:#fff}
table{border-collapse:collapse;margin-bottom:24px}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;font-size:13px}.v-pass{background:#c8e6c9}.v-warn{background:#fff59d}
.v-fail{background:#ffcdd2}.v-not_run{background:#eeeeee}.charts{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0;border:1px solid #ddd;padding:8px}figcaption{font-weight:600;font-size:14px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.outliers{font-size:12px;max-width:520px;margin:4px 0 0}summary{cursor:pointer;margin:12px 0}
"""

W, H, PAD_L, PAD_B, PAD_T = 520, 270, 56, 70, 26
BARS_MAX = 64  # values a bar chart can show at a few pixels each; past it, a histogram
BINS = 40
SMALL_FLEET = 20  # nodes shown unfolded; status's fleet summary uses the same line
MIN_PX = 3.0  # a histogram bin with any value in it is at least this tall
NAMED_MAX = 8  # outliers named under a histogram, then "and N more"
_ORDER = ("fail", "warn", "not_run", "pass")  # worst first


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _label(f: Finding) -> str:
    return f"{f.node}/{f.device}" if f.device else f.node


def chart(metric: str, findings: list[Finding]) -> str:
    """An SVG chart of one metric across the fleet: a bar per value, or a histogram."""
    if len(findings) > BARS_MAX:
        return histogram(metric, findings)
    m = METRICS[metric]
    values = [f.value for f in findings if f.value is not None]
    expectations = [f.expectation for f in findings if f.expectation is not None]
    top = (max(values + expectations) or 1.0) * 1.15  # all-zero counters still get an axis
    plot_w, plot_h = W - PAD_L - 8, H - PAD_B - PAD_T
    step = plot_w / max(len(findings), 1)

    def y(v: float) -> float:
        return PAD_T + plot_h * (1 - v / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'role="img" aria-label="{_e(m.title)}" data-metric="{_e(metric)}">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
    ]
    parts += _band(values, y, plot_w) if m.fleet and m.higher_is_better else []
    parts += _axes(top, y, m.unit)
    for k, f in enumerate(findings):
        x = PAD_L + k * step + step * 0.15
        bw = step * 0.7
        parts += _bar(f, x, bw, y)
        label_y = H - PAD_B + 12
        parts.append(
            f'<text x="{x + bw / 2:.1f}" y="{label_y}" font-size="10" text-anchor="end" '
            f'transform="rotate(-35 {x + bw / 2:.1f} {label_y})">{_e(_label(f))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram(metric: str, findings: list[Finding]) -> str:
    """The values' distribution: BINS bins over 0..top, each a stack of pass/warn/fail counts.
    A bin with any value is at least MIN_PX tall, so one failing GPU among 8,000 shows."""
    m = METRICS[metric]
    measured = [(f.verdict, f.value) for f in findings if f.value is not None]
    values = [v for _, v in measured]
    expectations = sorted({f.expectation for f in findings if f.expectation is not None})
    top = (max(values + expectations) or 1.0) * 1.15
    plot_w, plot_h = W - PAD_L - 8, H - PAD_B - PAD_T
    counts = [dict.fromkeys(COLORS, 0) for _ in range(BINS)]
    for verdict, v in measured:
        counts[min(max(int(v / top * BINS), 0), BINS - 1)][verdict] += 1
    peak = max(sum(c.values()) for c in counts) or 1

    def x(v: float) -> float:
        return PAD_L + plot_w * v / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
        f'aria-label="{_e(m.title)}" data-metric="{_e(metric)}" data-kind="histogram">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
    ]
    b = band(values, 3.0) if m.fleet and m.higher_is_better else None
    if b is not None:
        left, right = x(max(b.low, 0.0)), x(b.high)
        parts.append(
            f'<rect class="band" x="{left:.1f}" y="{PAD_T}" width="{max(right - left, 1.0):.1f}" '
            f'height="{plot_h}" fill="{BAND_COLOR}" opacity="0.45"/>'
        )
    parts += _histogram_axes(top, peak, x, m.unit)
    bw = plot_w / BINS
    for k, c in enumerate(counts):
        base = float(H - PAD_B)
        for verdict in COLORS:
            if not c[verdict]:
                continue
            h = max(plot_h * c[verdict] / peak, MIN_PX)
            lo, hi = top * k / BINS, top * (k + 1) / BINS
            parts.append(
                f'<rect class="bin {verdict}" x="{PAD_L + k * bw + 0.5:.1f}" y="{base - h:.1f}" '
                f'width="{max(bw - 1, 1):.1f}" height="{h:.1f}" fill="{COLORS[verdict]}">'
                f"<title>{c[verdict]} {verdict} in {lo:.4g} to {hi:.4g} {_e(m.unit)}</title></rect>"
            )
            base -= h
    for e in expectations[:4]:  # one per SKU at most; more would hide the bins
        parts.append(
            f'<line class="expect" x1="{x(e):.1f}" x2="{x(e):.1f}" y1="{PAD_T}" y2="{H - PAD_B}" '
            f'stroke="{EXPECT_COLOR}" stroke-width="2" stroke-dasharray="4 2"><title>expectation {e:.4g}</title></line>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _frame(y_label: str) -> list[str]:
    """The two axes and the y axis' label."""
    return [
        f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="#424242"/>',
        f'<line x1="{PAD_L}" x2="{W - 8}" y1="{H - PAD_B}" y2="{H - PAD_B}" stroke="#424242"/>',
        f'<text x="4" y="{PAD_T - 12}" font-size="10">{_e(y_label)}</text>',
    ]


def _histogram_axes(top: float, peak: int, x: Callable[[float], float], unit: str) -> list[str]:
    base = H - PAD_B
    parts = [
        *_frame("count"),
        f'<text x="{PAD_L - 4}" y="{PAD_T + 3}" font-size="9" text-anchor="end">{peak}</text>',
        f'<text x="{W - 8}" y="{base + 30}" font-size="10" text-anchor="end">{_e(unit)}</text>',
    ]
    for k in range(5):
        v = top * k / 4
        parts.append(f'<text x="{x(v):.1f}" y="{base + 14}" font-size="9" text-anchor="middle">{v:.3g}</text>')
    return parts


def _outliers(findings: list[Finding]) -> str:
    """Under a histogram: the counts by verdict, and the values that did not pass, named."""
    by: dict[str, list[Finding]] = {}
    for f in findings:
        by.setdefault(f.verdict, []).append(f)
    counts = ", ".join(f"{len(by[v])} {v.replace('_', ' ')}" for v in _ORDER if v in by)
    bad = [f for v in ("fail", "warn") for f in by.get(v, [])]
    named = "; ".join(f"{_label(f)} {f.verdict} {f.value if f.value is not None else '-'}" for f in bad[:NAMED_MAX])
    more = f"; and {len(bad) - NAMED_MAX} more" if len(bad) > NAMED_MAX else ""
    return f'<p class="outliers">{len(findings)} values: {_e(counts)}{". " if named else ""}{_e(named + more)}</p>'


def _band(values: list[float], y: Callable[[float], float], plot_w: float) -> list[str]:
    b = band(values, 3.0)
    if b is None:
        return []
    high, low = b.high, max(b.low, 0.0)
    return [
        f'<rect class="band" x="{PAD_L}" y="{y(high):.1f}" width="{plot_w:.1f}" '
        f'height="{max(y(low) - y(high), 1.0):.1f}" fill="{BAND_COLOR}" opacity="0.45"/>',
        f'<line x1="{PAD_L}" x2="{PAD_L + plot_w:.1f}" y1="{y(b.median):.1f}" '
        f'y2="{y(b.median):.1f}" stroke="#1565c0" stroke-width="1"/>',
    ]


def _axes(top: float, y: Callable[[float], float], unit: str) -> list[str]:
    parts = _frame(unit)
    for k in range(5):
        v = top * k / 4
        parts.append(f'<text x="{PAD_L - 4}" y="{y(v) + 3:.1f}" font-size="9" text-anchor="end">{v:.3g}</text>')
    return parts


def _bar(f: Finding, x: float, bw: float, y: Callable[[float], float]) -> list[str]:
    title = f"<title>{_e(_label(f))}: {_e(f.value)} {_e(f.unit)} - {_e(f.verdict)}: {_e(f.reason)}</title>"
    if f.value is None:
        parts = [
            f'<rect class="bar not_run" x="{x:.1f}" y="{H - PAD_B - 4}" width="{bw:.1f}" '
            f'height="4" fill="{COLORS["not_run"]}">{title}</rect>'
        ]
    else:
        top = y(f.value)
        parts = [
            f'<rect class="bar {f.verdict}" x="{x:.1f}" y="{top:.1f}" width="{bw:.1f}" '
            f'height="{max(H - PAD_B - top, 1.0):.1f}" fill="{COLORS[f.verdict]}">{title}</rect>'
        ]
    if f.expectation is not None:
        ey = y(f.expectation)
        parts.append(
            f'<line class="expect" x1="{x - 2:.1f}" x2="{x + bw + 2:.1f}" y1="{ey:.1f}" '
            f'y2="{ey:.1f}" stroke="{EXPECT_COLOR}" stroke-width="2" stroke-dasharray="4 2"/>'
        )
    return parts


def _why(r: NodeResult) -> str:
    bad = [f for f in r.findings if f.verdict in ("fail", "warn")] or [
        f for f in r.findings if f.verdict == "not_run" and not f.reason.startswith("not run: no GPU")
    ]
    why = "; ".join(f"{_label(f)} {f.metric}: {f.reason}" for f in bad[:4]) or "all metrics pass"
    return "; ".join(r.errors) or why


def _table(results: list[NodeResult]) -> str:
    rows = ["<table><tr><th>node</th><th>verdict</th><th>GPU SKU</th><th>why</th></tr>"]
    for r in results:
        rows.append(
            f'<tr><td>{_e(r.node)}</td><td class="v-{_e(r.verdict)}">{_e(r.verdict.upper())}'
            f"</td><td>{_e(r.sku or '-')}</td><td>{_e(_why(r))}</td></tr>"
        )
    return "".join(rows) + "</table>"


def _summary(results: list[NodeResult]) -> str:
    """The fleet in a line (nodes by verdict, by GPU SKU), then every node that did not pass,
    worst first: what a reader of a 1,000-node report came for."""
    verdicts = {v: sum(r.verdict == v for r in results) for v in _ORDER}
    skus: dict[str, int] = {}
    for r in results:
        skus[r.sku or "no GPU"] = skus.get(r.sku or "no GPU", 0) + 1
    line = ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in verdicts.items() if n)
    sku_line = ", ".join(f"{sku} x {n}" for sku, n in sorted(skus.items(), key=lambda kv: -kv[1]))
    attention = sorted((r for r in results if r.verdict != "pass"), key=lambda r: _ORDER.index(r.verdict))
    table = f"<h2>Needs attention ({len(attention)})</h2>{_table(attention)}" if attention else ""
    return (
        f'<p class="summary"><b>{len(results)} node{"s" if len(results) != 1 else ""}: {_e(line)}.</b> '
        f"GPU SKUs: {_e(sku_line)}.</p>{table}"
    )


def _folded(title: str, body: str, n_nodes: int) -> str:
    """Open for a small fleet; behind a fold (not laid out until opened) for a large one."""
    if not body or n_nodes <= SMALL_FLEET:
        return f"<h2>{_e(title)}</h2>{body}" if body else ""
    return f"<details><summary><b>{_e(title)}</b></summary>{body}</details>"


_GPU_COLUMNS = (
    ("index", "gpu"),
    ("name", "name"),
    ("driver_version", "driver"),
    ("cuda_version", "CUDA"),
    ("memory_mib", "MiB"),
    ("pcie", "PCIe now / max"),
    ("ecc_uncorrected", "ECC unc."),
    ("retired_pages", "retired / remapped"),
    ("throttle_active", "throttled by"),
    ("persistence_mode", "persistence"),
    ("nvlink_up", "NVLink up"),
)


def _gpu_inventory(results: list[NodeResult]) -> str:
    """Each GPU's inventory as NVML gave it: what was accepted, kept with the verdict."""
    rows = []
    for r in results:
        for g in r.inventory.get("gpus") or []:
            if not isinstance(g, dict):
                continue
            g = {
                **g,
                "pcie": f"gen{g.get('pcie_gen_current')} x{g.get('pcie_width_current')} / "
                f"gen{g.get('pcie_gen_max')} x{g.get('pcie_width_max')}",
                "throttle_active": ", ".join(g.get("throttle_active") or ()) or "-",
            }
            cells = "".join(f"<td>{_e('-' if g.get(k) is None else g.get(k))}</td>" for k, _ in _GPU_COLUMNS)
            rows.append(f"<tr><td>{_e(r.node)}</td>{cells}</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{_e(title)}</th>" for _, title in _GPU_COLUMNS)
    return f"<table><tr><th>node</th>{head}</tr>{''.join(rows)}</table>"


def _legend() -> str:
    items = [f'<span><i class="sw" style="background:{c}"></i>{_e(v)}</span>' for v, c in COLORS.items()]
    items.append(f'<span><i class="sw" style="background:{BAND_COLOR}"></i>fleet band</span>')
    items.append("<span>- - expectation</span>")
    return f'<div class="legend">{"".join(items)}</div>'


def document(results: list[NodeResult], title: str) -> str:
    by_metric: dict[str, list[Finding]] = {}
    for r in results:
        for f in r.findings:
            by_metric.setdefault(f.metric, []).append(f)
    figures = []
    for metric in METRICS:
        findings = by_metric.get(metric, [])
        if not findings or all(f.value is None for f in findings):
            continue  # nothing measured: listed in the table, no empty chart
        below = _outliers(findings) if len(findings) > BARS_MAX else ""
        figures.append(
            f"<figure><figcaption>{_e(METRICS[metric].title)} ({_e(metric)})"
            f"</figcaption>{chart(metric, findings)}{below}</figure>"
        )
    n = len(results)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>{_summary(results)}"
        f"{_folded(f'Every node ({n})', _table(results), n)}{_legend()}"
        f'<div class="charts">{"".join(figures)}</div>{_folded("GPU inventory", _gpu_inventory(results), n)}'
        "</body></html>\n"
    )


def write(path: str | Path, results: list[NodeResult], title: str = "provision validate") -> None:
    Path(path).write_text(document(results, title))
