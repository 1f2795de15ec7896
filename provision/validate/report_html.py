"""One self-contained HTML file: a verdict table and one inline SVG chart per metric.

Each chart draws the value of every node (every GPU, for per-GPU metrics) as a bar coloured
by its verdict, the expectation it was held to as a dashed tick, and the fleet band
(median +- the MAD band the judge used) as a shaded strip. No external JS, CSS or fonts.
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
"""

W, H, PAD_L, PAD_B, PAD_T = 520, 270, 56, 70, 26


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _label(f: Finding) -> str:
    return f"{f.node}/{f.device}" if f.device else f.node


def chart(metric: str, findings: list[Finding]) -> str:
    """An SVG bar chart of one metric across the fleet."""
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
    parts = [
        f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="#424242"/>',
        f'<line x1="{PAD_L}" x2="{W - 8}" y1="{H - PAD_B}" y2="{H - PAD_B}" stroke="#424242"/>',
        f'<text x="4" y="{PAD_T - 12}" font-size="10">{_e(unit)}</text>',
    ]
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


def _table(results: list[NodeResult]) -> str:
    rows = ["<table><tr><th>node</th><th>verdict</th><th>GPU SKU</th><th>why</th></tr>"]
    for r in results:
        bad = [f for f in r.findings if f.verdict in ("fail", "warn")] or [
            f for f in r.findings if f.verdict == "not_run" and not f.reason.startswith("not run: no GPU")
        ]
        why = "; ".join(f"{_label(f)} {f.metric}: {f.reason}" for f in bad[:4]) or "all metrics pass"
        why = "; ".join(r.errors) or why
        rows.append(
            f'<tr><td>{_e(r.node)}</td><td class="v-{_e(r.verdict)}">{_e(r.verdict.upper())}'
            f"</td><td>{_e(r.sku or '-')}</td><td>{_e(why)}</td></tr>"
        )
    return "".join(rows) + "</table>"


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
    return f"<h2>GPU inventory</h2><table><tr><th>node</th>{head}</tr>{''.join(rows)}</table>"


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
        figures.append(
            f"<figure><figcaption>{_e(METRICS[metric].title)} ({_e(metric)})"
            f"</figcaption>{chart(metric, findings)}</figure>"
        )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>{_table(results)}{_legend()}"
        f'<div class="charts">{"".join(figures)}</div>{_gpu_inventory(results)}</body></html>\n'
    )


def write(path: str | Path, results: list[NodeResult], title: str = "provision validate") -> None:
    Path(path).write_text(document(results, title))
