"""Pure verdicts: measurements + expectations -> a Finding per metric and a verdict per node.

Three independent checks, the worst one wins:

1. the datasheet: a GPU below ``spec x fraction`` for its SKU fails, a link below the
   SKU's PCIe generation or width fails, health counters above their ceiling fail;
2. user floors (``validate_expect`` setting, ``--expect`` file) fail, built-in floors warn;
3. the fleet: per metric, a value far below the median of its peers (the other nodes; for
   GPUs, every GPU of the same SKU in the fleet, so also the GPUs in its own node) warns
   or fails even when it clears the floor. "Far" means below the median by more than
   ``warn_drop``/``fail_drop`` AND outside ``mad_k`` scaled MADs (of the logarithms: noise
   is a ratio), so honest noise on equal hardware does not warn.

A node is judged by its worst finding, so by its slowest GPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from provision.metrics import METRICS, Metric
from provision.validate import gpu_checks
from provision.validate.expectations import DEFAULT_FLOORS, GpuSpec, Overrides, find_sku
from provision.validate.records import SEVERITY, Finding, GpuInfo, Measurement, NodeResult

NO_GPU = "not run: no GPU"  # the agent's not_run text on a machine without NVIDIA GPUs
MIG_NOT_RUN = "not run: MIG is enabled"  # the agent's not_run text for GPUs it leaves to MIG


@dataclass
class NodeInput:
    """What the judge needs about one node."""

    node: str  # inventory name
    measurements: list[Measurement]  # agent's and controller's values
    gpus: list[GpuInfo] = field(default_factory=list)  # inventory from NVML / nvidia-smi
    wants_gpu: bool = False  # the host is in gpu_nodes: no GPU is then a fail
    overrides: Overrides = field(default_factory=Overrides)  # its group's and the run's thresholds
    errors: list[str] = field(default_factory=list)  # could not run at all (unreachable, crash)
    inventory: dict[str, Any] = field(default_factory=dict[str, Any])  # passed through to the report


def worst(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=lambda v: SEVERITY[v], default="pass")


# --- GPU inventory -> health measurements ---------------------------------------------------


def gpu_health(node: str, gpus: list[GpuInfo], measured: set[tuple[str, str]]) -> list[Measurement]:
    """PCIe link, volatile ECC and retired-page values from the inventory, for every GPU
    (the other health flags are judged in gpu_checks).

    ``measured`` holds (metric, device) pairs the agent already sent (it reads the PCIe link
    under load, which beats the idle value here: an idle link drops to gen 1).
    """
    out = []
    for g in gpus:
        dev = f"gpu{g.index}"
        hw = [r for r in g.throttle_active if r.startswith("hw_")]
        values = {
            "gpu_hw_slowdown": (len(hw), "active: " + (", ".join(hw) or "none")),
            "gpu_pcie_gen": (g.pcie_gen_max, "max link generation the GPU and slot agree on"),
            "gpu_pcie_width": (g.pcie_width_max, "max link width"),
            "gpu_ecc_uncorrected": (g.ecc_uncorrected_volatile, "volatile (since boot) uncorrectable ECC errors"),
            "gpu_retired_pages": (g.retired_pages, "pages retired (pre-Ampere page retirement); no default ceiling"),
        }
        for metric, (value, detail) in values.items():
            if (metric, dev) in measured:
                continue
            not_run = "" if value is not None else "not run: the driver reports N/A"
            if metric == "gpu_hw_slowdown" and hw:
                # One idle reading (the burn's NVML samples did not run: no NVML in it, MIG):
                # a slowdown counts only when seen in more than one sample, so it warns.
                value, not_run = None, f"{SEEN_ONCE}: {', '.join(hw)} active in one idle reading; no samples under load"
            out.append(Measurement(node, metric, None if value is None else float(value), dev, not_run, detail))
    return out


# --- single-value checks ------------------------------------------------------------------


def _spec_check(
    m: Metric, value: float, spec: GpuSpec | None, gpu: GpuInfo | None, ov: Overrides
) -> tuple[str, float | None, str]:
    """(verdict, expectation, reason) against the SKU's datasheet."""
    if m.name in ("gpu_pcie_gen", "gpu_pcie_width"):
        return _link_check(m, value, spec, gpu)
    if spec is None:
        return "pass", None, ""
    figure, fraction = spec.spec(m.name), ov.fraction(m.name)
    if figure is None or fraction is None:
        return "pass", None, ""
    floor = figure * fraction
    verdict = "fail" if value < floor else "pass"
    sign = "<" if verdict == "fail" else ">="
    return verdict, floor, (f"{value:.4g} {sign} {fraction:g} x {figure:g} ({spec.key} spec, {spec.source})")


def _link_check(m: Metric, value: float, spec: GpuSpec | None, gpu: GpuInfo | None) -> tuple[str, float | None, str]:
    what = "generation" if m.name == "gpu_pcie_gen" else "width"
    if spec is not None:
        want = spec.pcie_gen if m.name == "gpu_pcie_gen" else spec.pcie_width
        if want is None:
            return "pass", None, f"{spec.key} has no PCIe host link (NVLink-C2C)"
        if value < want:
            return "fail", want, f"PCIe {what} {value:g} below {want} ({spec.key} spec): degraded link"
        return "pass", want, f"PCIe {what} {value:g} (spec {want})"
    # Unknown SKU: the GPU's own maximum is the reference, x16 for the width.
    want = (
        gpu.pcie_gen_device_max
        if gpu is not None and m.name == "gpu_pcie_gen"
        else 16
        if m.name == "gpu_pcie_width"
        else None
    )
    if want is not None and value < want:
        return "fail", want, f"PCIe {what} {value:g} below the GPU's own {want}: degraded link or slot"
    return "pass", want, ""


def _threshold_check(m: Metric, value: float, ov: Overrides) -> tuple[str, float | None, str]:
    """User floors fail; built-in floors warn (they are rough); counters have ceilings."""
    if not m.higher_is_better:
        ceiling = ov.ceiling(m.name)
        if ceiling is not None and value > ceiling:
            return "fail", ceiling, f"{value:g} {m.unit} > allowed {ceiling:g}"
        return "pass", ceiling, f"{value:g} <= allowed {ceiling:g}" if ceiling is not None else ""
    floor = ov.floor(m.name)
    if floor is None:
        return "pass", None, ""
    builtin = m.name not in ov.floors and m.name in DEFAULT_FLOORS
    if value < floor:
        return (
            ("warn" if builtin else "fail"),
            floor,
            (f"{value:.4g} < {'built-in' if builtin else 'expected'} floor {floor:g} {m.unit}"),
        )
    return "pass", floor, f"{value:.4g} >= floor {floor:g} {m.unit}"


@dataclass(frozen=True)
class Band:
    """The fleet's spread for one metric (and SKU, for GPUs)."""

    median: float  # fleet median
    low: float  # below this a value is outside the spread: median / exp(k x scaled MAD of logs)
    size: int  # values the band was made from
    high: float  # the same distance above the median (for the report's band)


def band(values: list[float], k: float) -> Band | None:
    """Median and MAD band of a fleet; None with fewer than 2 values (nothing to compare).

    The MAD is taken of the logarithms: throughput noise is a ratio (a busy host halves a
    link, it does not take 10 Gbit/s off it), so the band is a ratio around the median.
    In plain units, links of 24 and 63 Gbit/s on a loaded host made a band reaching below
    zero, and a node at 0.05 Gbit/s, bisected and blamed, passed. For a tight fleet the two
    agree (log(1+x) ~ x)."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    # With 2 values the MAD is half their gap, which says nothing; only the drop counts then.
    if len(values) < 3 or med <= 0:
        return Band(med, med, len(values), med)
    tiny = med * 1e-9  # a measured 0 is a huge outlier, not a math error
    logs = [math.log(max(v, tiny)) for v in values]
    centre = statistics.median(logs)
    spread = k * 1.4826 * statistics.median(abs(x - centre) for x in logs)
    return Band(med, math.exp(centre - spread), len(values), math.exp(centre + spread))


# With two values there is no spread to tell noise from a fault, and no third value to say
# which of the two is off: a pair fails only when the slower is under a third of the faster
# (more than 50% below their midpoint); a smaller gap warns.
PAIR_FAIL_DROP = 0.50


def _fleet_check(m: Metric, value: float, b: Band | None, ov: Overrides) -> tuple[str, str]:
    if not m.fleet or not m.higher_is_better or b is None or b.median <= 0:
        return "pass", ""
    drop = 1 - value / b.median
    rule = ov.fleet_rule(m.name)
    if value >= b.low or drop <= rule.warn_drop:
        return "pass", f"fleet median {b.median:.4g} over {b.size}"
    verdict = "fail" if drop > rule.fail_drop else "warn"
    reason = f"{drop:.0%} below the fleet median {b.median:.4g} ({b.size} values)"
    if b.size == 2 and verdict == "fail" and drop <= PAIR_FAIL_DROP:
        verdict = "warn"
        reason += "; only 2 values: a gap under 3x warns, since either node may be the odd one"
    return verdict, reason


# --- the whole fleet ------------------------------------------------------------------------

# not-run reasons that describe the hardware, not a broken run: they do not lower a node.
SEEN_ONCE = "not judged: seen once"  # a hardware flag seen in one reading only: a warn
BENIGN_NOT_RUN = (NO_GPU, "not run: the driver reports N/A", "not run: one node", "not run: one GPU")


@dataclass(frozen=True)
class _Context:
    """Per-measurement facts the checks need."""

    spec: GpuSpec | None  # the GPU's SKU, when known
    gpu: GpuInfo | None  # the GPU's inventory
    pool: str  # fleet pool key: the metric plus SKU (GPUs) or "" (node metrics)


def _context(m: Measurement, gpus: dict[str, GpuInfo]) -> _Context:
    gpu = gpus.get(m.device)
    if not METRICS[m.metric].per_device:
        return _Context(None, None, m.metric)
    if gpu is None:
        return _Context(None, None, f"{m.metric}|unknown SKU: ?")
    spec = find_sku(gpu.name, gpu.pci_device_id)
    return _Context(spec, gpu, f"{m.metric}|{spec.key if spec else 'unknown SKU: ' + gpu.name}")


def _prepared(i: NodeInput) -> tuple[list[Measurement], dict[str, GpuInfo]]:
    gpus = {f"gpu{g.index}": g for g in i.gpus}
    measured = {(m.metric, m.device) for m in i.measurements}
    ms = [m for m in i.measurements if m.metric in METRICS]
    return ms + gpu_health(i.node, i.gpus, measured), gpus


def judge(inputs: list[NodeInput]) -> list[NodeResult]:
    """A NodeResult per input node, in input order."""
    prepared = [(i, *_prepared(i)) for i in inputs]
    pools = _pools(prepared)
    return [_judge_node(i, ms, gpus, pools) for i, ms, gpus in prepared]


def fleet_outliers(inputs: list[NodeInput]) -> dict[str, list[Measurement]]:
    """Per node, the measured values that the fleet check alone would fail.

    These are the values a neighbour can cause: nodes measured at once share a hypervisor,
    a storage backend or, on the testbed, one host's disk and cores. The controller
    measures them again with the node alone (provision.validate.remeasure) before judging."""
    prepared = [(i, *_prepared(i)) for i in inputs]
    pools = _pools(prepared)
    out: dict[str, list[Measurement]] = {}
    for i, ms, gpus in prepared:
        for m in ms:
            if m.value is None:
                continue
            rule = i.overrides.fleet_rule(m.metric)
            fleet_band = pools.band(_context(m, gpus).pool, rule.mad_k)
            if _fleet_check(METRICS[m.metric], m.value, fleet_band, i.overrides)[0] == "fail":
                out.setdefault(i.node, []).append(m)
    return out


def _pools(prepared: list[tuple[NodeInput, list[Measurement], dict[str, GpuInfo]]]) -> _Pools:
    pools = _Pools()
    for _, ms, gpus in prepared:
        for m in ms:
            if m.value is not None:
                pools.setdefault(_context(m, gpus).pool, []).append(m.value)
    return pools


def _judge_node(i: NodeInput, ms: list[Measurement], gpus: dict[str, GpuInfo], pools: _Pools) -> NodeResult:
    findings = [_finding(i, m, _context(m, gpus), pools) for m in ms] + _gpu_count(i)
    findings += gpu_checks.gpu_checks(i.node, i.gpus)
    verdict = worst([_counted(f) for f in findings] + (["fail"] if i.errors else []))
    return NodeResult(i.node, verdict, findings, _sku_label(gpus), dict(i.inventory), list(i.errors))


def _counted(f: Finding) -> str:
    """A not-run lowers the node to warn unless it only describes the hardware."""
    if f.verdict != "not_run":
        return f.verdict
    return "pass" if f.reason.startswith(BENIGN_NOT_RUN) else "warn"


# Not a metric of metrics.METRICS (nothing to set a floor on): NVML's and CUDA's GPU counts,
# from the agent's inventory, must agree.
GPU_COUNT = "gpu_count"


def _gpu_count(i: NodeInput) -> list[Finding]:
    """A GPU that NVML lists but CUDA cannot use (lost, hidden, broken driver) fails the node."""
    counts = i.inventory.get("gpu_counts") or {}
    nvml, cuda = counts.get("nvml"), counts.get("cuda")
    if nvml is None or cuda is None:
        return []
    if nvml == cuda:
        return [Finding(i.node, GPU_COUNT, "", float(cuda), "GPUs", float(nvml), "pass", f"CUDA and NVML see {cuda}")]
    reason = (
        f"CUDA sees {cuda} GPUs, NVML sees {nvml}: a GPU is lost, hidden by CUDA_VISIBLE_DEVICES or unusable "
        "by the driver (see dmesg for Xid errors), and gpuN results may not name the GPU NVML calls gpuN"
    )
    return [Finding(i.node, GPU_COUNT, "", float(cuda), "GPUs", float(nvml), "fail", reason)]


def _sku_label(gpus: dict[str, GpuInfo]) -> str:
    labels = []
    for g in gpus.values():
        spec = find_sku(g.name, g.pci_device_id)
        labels.append(spec.key if spec else f"unknown SKU: {g.name}")
    return ", ".join(sorted(set(labels)))


def _finding(i: NodeInput, m: Measurement, ctx: _Context, pools: _Pools) -> Finding:
    metric = METRICS[m.metric]
    if m.value is None:
        return _not_run(i, m, metric)
    checks = [
        _spec_check(metric, m.value, ctx.spec, ctx.gpu, i.overrides),
        _threshold_check(metric, m.value, i.overrides),
    ]
    # A node's own value stays in its pool: the median resists one outlier by design.
    fleet_band = pools.band(ctx.pool, i.overrides.fleet_rule(m.metric).mad_k)
    fleet_verdict, fleet_reason = _fleet_check(metric, m.value, fleet_band, i.overrides)
    verdict = worst([v for v, _, _ in checks] + [fleet_verdict])
    expectation = next((e for _, e, _ in checks if e is not None), None)
    reasons = [r for _, _, r in checks if r] + ([fleet_reason] if fleet_reason else [])
    verdict, reasons = _unjudged(metric, m, ctx, expectation, pools, verdict, reasons)
    if verdict in ("warn", "fail") and m.detail:
        reasons.append(m.detail)  # how it was measured (for links: the bisection) helps the fix
    if m.note:
        reasons.append(m.note)
    return Finding(i.node, m.metric, m.device, m.value, metric.unit, expectation, verdict, "; ".join(reasons))


class _Pools(dict[str, list[float]]):
    """The fleet's values per pool, each pool's band worked out once: a band is a median
    of the whole pool and every value in the pool asks for it (worked out per value,
    judging 100 8-GPU nodes took 6 s and grew with the square of the fleet)."""

    def __init__(self) -> None:
        super().__init__()
        self._bands: dict[tuple[str, float], Band | None] = {}  # (pool, mad_k) -> its band

    def band(self, pool: str, k: float) -> Band | None:
        if (pool, k) not in self._bands:
            self._bands[(pool, k)] = band(self.get(pool, []), k)
        return self._bands[(pool, k)]


def _unjudged(
    metric: Metric,
    m: Measurement,
    ctx: _Context,
    expectation: float | None,
    pools: dict[str, list[float]],
    verdict: str,
    reasons: list[str],
) -> tuple[str, list[str]]:
    """Say so when nothing judged a value; an unknown GPU with nothing to compare warns."""
    fleet_size = len(pools.get(ctx.pool, []))
    if expectation is not None or (metric.fleet and fleet_size >= 2):
        if metric.per_device and ctx.spec is None:
            reasons = [f"unknown SKU ({ctx.gpu.name if ctx.gpu else '?'}): judged on the fleet only", *reasons]
        return verdict, reasons
    if metric.per_device and ctx.spec is None and metric.fleet:
        name = ctx.gpu.name if ctx.gpu else "?"
        return worst([verdict, "warn"]), [
            f"unknown SKU ({name}): no datasheet figure and no other GPU of this kind to compare; "
            f"set a floor with --expect {m.metric}=<value>",
            *reasons,
        ]
    return verdict, reasons or ["measured; no floor set and no other node to compare"]


def _not_run(i: NodeInput, m: Measurement, metric: Metric) -> Finding:
    reason = m.not_run or "not run"
    verdict = "not_run"
    if i.wants_gpu and metric.group == "gpu" and reason.startswith(NO_GPU):
        verdict, reason = "fail", "no GPU found, but the host is in gpu_nodes"
    elif reason.startswith((MIG_NOT_RUN, SEEN_ONCE)):
        pass  # reported and counted as a warn: MIG slices are not judged as whole GPUs, nor one reading
    elif metric.name.startswith("gpu_") and not reason.startswith(BENIGN_NOT_RUN) and _has_gpu(i):
        # A GPU that could not be measured (a step raised, CUDA sees nothing, NVML lost it)
        # is never skipped quietly on a GPU host: it may be the broken one.
        verdict, reason = "fail", f"{reason}; a GPU host must measure every GPU"
    return Finding(i.node, m.metric, m.device, None, metric.unit, None, verdict, reason)


def _has_gpu(i: NodeInput) -> bool:
    """The host should have GPUs: it is in gpu_nodes, sysfs lists NVIDIA GPUs, NVML or
    nvidia-smi listed some, or the agent reported on a GPU by name (one NVML could not read)."""
    in_sysfs = bool(i.inventory.get("gpu_pci"))  # NVIDIA GPUs on the PCI bus, whatever NVML said
    return i.wants_gpu or in_sysfs or bool(i.gpus) or any(m.device.startswith("gpu") for m in i.measurements)


def fleet_summary(results: list[NodeResult]) -> dict[str, int]:
    """How many nodes got each verdict."""
    counts = {"pass": 0, "warn": 0, "fail": 0}
    for r in results:
        counts[r.verdict if r.verdict in counts else "warn"] += 1
    return counts


def exit_code(results: list[NodeResult], warn_ok: bool = False) -> int:
    """0 when every node passed (or only warned, with warn_ok); 1 otherwise."""
    bad = {"fail"} if warn_ok else {"fail", "warn", "not_run"}
    return 1 if any(r.verdict in bad for r in results) or not results else 0
