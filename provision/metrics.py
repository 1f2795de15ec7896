"""The metrics validate knows: name, unit, direction and the benchmark group they belong to.

A metric name is the key everywhere: in the agent's JSON, in --expect files, in the
``validate_expect`` setting, in reports and in history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provision.errors import InputError, Problem


@dataclass(frozen=True)
class Metric:
    """One kind of measured value."""

    name: str  # key, e.g. "gpu_bf16_tflops"
    group: str  # --only group: cpu, ram, disk, net, gpu, allreduce
    unit: str  # unit of the value, as printed
    title: str  # short human label for tables and charts
    higher_is_better: bool = True  # False for error counts
    per_device: bool = False  # measured once per GPU (value on the node is its slowest GPU)
    fleet: bool = True  # compare across nodes (median/MAD); False for counts and link states


_m = Metric  # short alias for the table below

# The validate agent's phases, each with its own time budget (the agent's BUDGETS_S keys:
# the agent runs alone on a node and imports nothing of this package, so the list is
# written twice; tests/unit/test_validate_budgets.py holds the two equal). The
# ``validate_budgets_s`` setting names them.
AGENT_PHASES = ("cpu", "ram", "disk", "gemm", "hbm", "copies", "burn", "allreduce")


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _m("cpu_gemm_gflops", "cpu", "GFLOP/s", "CPU fp32 GEMM"),
        _m("cpu_gemm_peak_fraction", "cpu", "ratio", "CPU GEMM / peak", fleet=False),
        _m("ram_copy_gbs", "ram", "GB/s", "RAM copy"),
        _m("ram_scale_gbs", "ram", "GB/s", "RAM scale"),
        _m("ram_add_gbs", "ram", "GB/s", "RAM add"),
        _m("ram_triad_gbs", "ram", "GB/s", "RAM triad"),
        _m("disk_seq_read_mibs", "disk", "MiB/s", "disk seq read 1M"),
        _m("disk_seq_write_mibs", "disk", "MiB/s", "disk seq write 1M"),
        _m("disk_rand_read_iops", "disk", "IOPS", "disk rand read 4k"),
        _m("net_gbits", "net", "Gbit/s", "NIC bandwidth"),
        _m("allreduce_nodes_busbw_gbs", "allreduce", "GB/s", "all-reduce across nodes", fleet=False),
        _m("gpu_bf16_tflops", "gpu", "TFLOP/s", "GEMM bf16", per_device=True),
        _m("gpu_fp16_tflops", "gpu", "TFLOP/s", "GEMM fp16", per_device=True),
        _m("gpu_tf32_tflops", "gpu", "TFLOP/s", "GEMM tf32", per_device=True),
        _m("gpu_fp32_tflops", "gpu", "TFLOP/s", "GEMM fp32", per_device=True),
        _m("gpu_hbm_gbs", "gpu", "GB/s", "HBM bandwidth", per_device=True),
        _m("gpu_h2d_gbs", "gpu", "GB/s", "host to device", per_device=True),
        _m("gpu_d2h_gbs", "gpu", "GB/s", "device to host", per_device=True),
        _m("gpu_burn_mismatches", "gpu", "count", "burn mismatches", False, True, False),
        _m("gpu_burn_throughput_ratio", "gpu", "ratio", "burn last/first window", per_device=True, fleet=False),
        _m("gpu_pcie_gen", "gpu", "gen", "PCIe generation", per_device=True, fleet=False),
        _m("gpu_pcie_width", "gpu", "lanes", "PCIe width", per_device=True, fleet=False),
        _m("gpu_ecc_uncorrected", "gpu", "count", "ECC uncorrected", False, True, False),
        _m("gpu_retired_pages", "gpu", "count", "retired/remapped", False, True, False),
        _m("gpu_hw_slowdown", "gpu", "count", "HW slowdown reasons", False, True, False),
        _m("gpu_allreduce_busbw_gbs", "allreduce", "GB/s", "all-reduce in node"),
    )
}

GROUPS = ("cpu", "ram", "disk", "net", "gpu", "allreduce")


def metric(name: str) -> Metric:
    return METRICS[name]


def in_groups(groups: set[str]) -> list[Metric]:
    return [m for m in METRICS.values() if m.group in groups]


_FLEET_KEYS = {"warn_drop", "fail_drop", "mad_k"}


def check_budgets(values: dict[str, float]) -> str | None:
    """The ``validate_budgets_s`` setting: known phases, 1 s to a day each."""
    bad = [f"{k!r}: unknown phase (one of {', '.join(AGENT_PHASES)})" for k in values if k not in AGENT_PHASES]
    bad += [
        f"{k}: {s!r} is not between 1 and 86400 seconds"
        for k, s in values.items()
        if k in AGENT_PHASES and not (isinstance(s, int | float) and not isinstance(s, bool) and 1 <= s <= 86400)
    ]
    return "; ".join(bad) or None


def check_flat(values: dict[str, float]) -> str | None:
    """The settings validator's form: None when fine, else the problems in one message."""
    try:
        parse_flat_keys(values, "validate_expect")
    except InputError as e:
        return "; ".join(
            f"{p.what} at {p.where.split(': ', 1)[-1]}" + (f" ({p.fix})" if p.fix else "") for p in e.problems
        )
    return None


def _unknown(where: str, key: str) -> Problem:
    import difflib

    close = difflib.get_close_matches(str(key).split(".")[0], list(METRICS), n=1)
    fix = f"did you mean {close[0]!r}?" if close else "metric names: " + ", ".join(METRICS)
    return Problem(f"{where}: {key}", "unknown metric", fix)


@dataclass(frozen=True)
class FlatKeys:
    """Expectation overrides in flat-key form, checked against the catalogue."""

    floors: dict[str, float] = field(default_factory=dict)  # metric -> minimum value
    fractions: dict[str, float] = field(default_factory=dict)  # metric -> share of spec
    ceilings: dict[str, float] = field(default_factory=dict)  # counter metric -> maximum
    fleet: dict[str, float] = field(default_factory=dict)  # warn_drop / fail_drop / mad_k


def parse_flat_keys(values: dict[str, Any], where: str) -> FlatKeys:
    """The grammar of the ``validate_expect`` setting and of --expect files:

    ``"<metric>": floor``, ``"<metric>.fraction": share of spec``, ``"<metric>.max": ceiling``,
    ``"fleet.warn_drop" / "fleet.fail_drop" / "fleet.mad_k"``. InputError names every bad key.
    """
    problems: list[Problem] = []
    keys = FlatKeys()
    for key, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            problems.append(Problem(f"{where}: {key}", f"{value!r} is not a number >= 0"))
            continue
        head, _, tail = str(key).partition(".")
        if head == "fleet" and tail in _FLEET_KEYS:
            keys.fleet[tail] = float(value)
        elif head not in METRICS:
            problems.append(_unknown(where, key))
        elif tail == "":
            keys.floors[head] = float(value)
        elif tail == "fraction" and value <= 1.5:
            keys.fractions[head] = float(value)
        elif tail == "max":
            keys.ceilings[head] = float(value)
        else:
            problems.append(Problem(f"{where}: {key}", "suffix must be .fraction (<= 1.5) or .max"))
    if problems:
        raise InputError(problems)
    return keys
