"""Pure parsers: tool output text -> typed values. No I/O, no judgement.

fio ``--output-format=json``, iperf3 ``-J``, ``nvidia-smi -q -x`` (XML), ``nvidia-smi -q``
(text), the NVML dict the agent prints, and the agent's whole JSON document.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import MISSING, dataclass, fields
from typing import Any

from provision.validate.records import GpuInfo, GpuProcess, MigDevice


class ParseError(ValueError):
    """Output that is not what the tool prints when it worked."""


def _json_object(text: str, tool: str) -> dict[str, Any]:
    """fio and iperf3 may print warnings before the JSON document; skip to its first brace."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{tool}: no JSON in output: {text.strip()[:200]!r}")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as e:
        raise ParseError(f"{tool}: bad JSON: {e.msg} at {e.pos}") from None
    if not isinstance(data, dict):
        raise ParseError(f"{tool}: JSON is not an object")
    return data


# --- fio ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FioJob:
    """One fio job's result (group_reporting folds numjobs into one)."""

    name: str  # jobname
    read_bytes_per_s: float  # read bandwidth
    read_iops: float  # read operations per second
    write_bytes_per_s: float  # write bandwidth
    write_iops: float  # write operations per second
    error: int  # fio's per-job error code; 0 when the job ran


def fio_jobs(text: str) -> dict[str, FioJob]:
    """Jobs of a fio JSON report, by job name."""
    data = _json_object(text, "fio")
    jobs = data.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ParseError("fio: report has no jobs")
    out = {}
    for job in jobs:
        read, write = job.get("read", {}), job.get("write", {})
        out[job["jobname"]] = FioJob(
            job["jobname"],
            float(_bytes_per_s(read)),
            float(read.get("iops", 0.0)),
            float(_bytes_per_s(write)),
            float(write.get("iops", 0.0)),
            int(job.get("error", 0)),
        )
    return out


def _bytes_per_s(side: dict[str, Any]) -> float:
    # bw_bytes appeared in fio 3.x; older reports only have bw in KiB/s.
    if "bw_bytes" in side:
        return float(side["bw_bytes"])
    return float(side.get("bw", 0)) * 1024


# --- iperf3 ------------------------------------------------------------------------


@dataclass(frozen=True)
class IperfResult:
    """One iperf3 client run."""

    bits_per_second: float  # received at the server (what actually crossed the link)
    streams: int  # parallel streams
    seconds: float  # measured duration
    retransmits: int | None  # TCP retransmits at the sender, when reported


def iperf3(text: str) -> IperfResult:
    """An iperf3 -J client report; raises ParseError for iperf3's own error reports."""
    data = _json_object(text, "iperf3")
    if data.get("error"):
        raise ParseError(f"iperf3: {data['error']}")
    end = data.get("end", {})
    received = end.get("sum_received") or end.get("sum")
    if not received:
        raise ParseError("iperf3: report has no end.sum_received")
    sent = end.get("sum_sent", {})
    streams = data.get("start", {}).get("test_start", {}).get("num_streams", len(end.get("streams", [])))
    return IperfResult(
        float(received["bits_per_second"]),
        int(streams or 1),
        float(received.get("seconds", 0.0)),
        sent.get("retransmits"),
    )


# --- nvidia-smi -q -x ---------------------------------------------------------------


def _int(text: str | None) -> int | None:
    """'16x' -> 16, '4' -> 4, '81920 MiB' -> 81920, 'N/A' -> None."""
    if text is None:
        return None
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _yes(text: str | None) -> bool | None:
    if text is None or text.strip() in ("N/A", ""):
        return None
    return text.strip() in ("Yes", "Enabled", "Active")


def _device_id(text: str | None) -> int | None:
    """'0x233010DE' or '20B210DE' (device id then vendor id) -> 0x2330."""
    if not text:
        return None
    digits = text.strip().lower().removeprefix("0x")
    return int(digits[:4], 16) if re.fullmatch(r"[0-9a-f]{8}", digits) else None


def _sum_known(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


_IGNORED_REASONS = {
    "gpu_idle",
    "idle",
    "applications_clocks_setting",
    "applications clocks setting",
    "display_clocks_setting",
    "display clock setting",
    "sync_boost",
    "sync boost",
}


def nvidia_smi_xml(text: str) -> list[GpuInfo]:
    """GPUs of an ``nvidia-smi -q -x`` report (DTD v11 to v13)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ParseError(f"nvidia-smi XML: {e}") from None
    driver, cuda = root.findtext("driver_version"), root.findtext("cuda_version")
    return [_xml_gpu(i, gpu, driver, cuda) for i, gpu in enumerate(root.findall("gpu"))]


def _xml_gpu(index: int, gpu: ET.Element, driver: str | None, cuda: str | None) -> GpuInfo:
    link = "pci/pci_gpu_link_info/"
    reasons = gpu.find("clocks_event_reasons")
    if reasons is None:  # DTD v11 and older name them throttle reasons
        reasons = gpu.find("clocks_throttle_reasons")
    active = tuple(
        re.sub(r"^clocks_(event|throttle)_reason_", "", r.tag)
        for r in (reasons if reasons is not None else [])
        if (r.text or "").strip() == "Active"
    )
    minor = _int(gpu.findtext("minor_number"))
    aggregate = _xml_ecc(gpu, "aggregate")
    return GpuInfo(
        index=minor if minor is not None else index,
        name=gpu.findtext("product_name", ""),
        pci_device_id=_device_id(gpu.findtext("pci/pci_device_id")),
        memory_mib=_int(gpu.findtext("fb_memory_usage/total")),
        driver_version=driver,
        cuda_version=cuda,
        pcie_gen_current=_int(gpu.findtext(link + "pcie_gen/current_link_gen")),
        pcie_gen_max=_int(gpu.findtext(link + "pcie_gen/max_link_gen")),
        pcie_gen_device_max=_int(gpu.findtext(link + "pcie_gen/max_device_link_gen")),
        pcie_width_current=_int(gpu.findtext(link + "link_widths/current_link_width")),
        pcie_width_max=_int(gpu.findtext(link + "link_widths/max_link_width")),
        ecc_uncorrected=aggregate[0],
        ecc_corrected=aggregate[1],
        retired_pages=_sum_known(
            _int(gpu.findtext("retired_pages/multiple_single_bit_retirement/retired_count")),
            _int(gpu.findtext("retired_pages/double_bit_retirement/retired_count")),
        ),
        remap_failure=_yes(gpu.findtext("remapped_rows/remapped_row_failure")),
        remap_pending=_yes(gpu.findtext("remapped_rows/remapped_row_pending")),
        throttle_active=tuple(r for r in active if r not in _IGNORED_REASONS),
        persistence_mode=_yes(gpu.findtext("persistence_mode")),
        bus_id=gpu.get("id", ""),
        numa_node=_int(gpu.findtext("numa_node")),
        remapped_rows_correctable=_int(gpu.findtext("remapped_rows/remapped_row_corr")),
        remapped_rows_uncorrectable=_int(gpu.findtext("remapped_rows/remapped_row_unc")),
        **_xml_modes(gpu),
    )


def _xml_ecc(gpu: ET.Element, counter: str) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) ECC errors of the ``volatile`` or ``aggregate`` counter."""
    # DTD v11 has one sram_uncorrectable; v12+ splits it into parity and SEC-DED.
    unc = ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
    cor = ("dram_correctable", "sram_correctable")

    def total(keys: tuple[str, ...]) -> int | None:
        return _sum_known(*(_int(gpu.findtext(f"ecc_errors/{counter}/{k}")) for k in keys))

    return total(unc), total(cor)


def _xml_modes(gpu: ET.Element) -> dict[str, Any]:
    """ECC mode and volatile counts, the SRAM threshold flag, MIG and compute mode."""
    volatile, memory = _xml_ecc(gpu, "volatile"), "fb_memory_usage/total"
    mig = [
        MigDevice(_int(d.findtext("index")) or 0, _int(d.findtext("gpu_instance_id")), _int(d.findtext(memory)))
        for d in gpu.findall("mig_devices/mig_device")
    ]
    return {
        "ecc_mode": _mode(gpu.findtext("ecc_mode/current_ecc")),
        "ecc_mode_pending": _mode(gpu.findtext("ecc_mode/pending_ecc")),
        "ecc_uncorrected_volatile": volatile[0],
        "ecc_corrected_volatile": volatile[1],
        "sram_threshold_exceeded": _yes(gpu.findtext("ecc_errors/aggregate/sram_threshold_exceeded")),
        "mig_mode": _mode(gpu.findtext("mig_mode/current_mig")),
        "mig_mode_pending": _mode(gpu.findtext("mig_mode/pending_mig")),
        "mig_devices": tuple(mig),
        "compute_mode": _mode(gpu.findtext("compute_mode")),
    }


def _mode(text: str | None) -> str | None:
    """'Enabled' -> 'enabled', 'Exclusive_Process' -> 'exclusive_process', 'N/A' -> None."""
    if text is None or text.strip() in ("N/A", ""):
        return None
    return text.strip().lower().replace(" ", "_")


# --- nvidia-smi -q (text) -------------------------------------------------------------


def _text_tree(text: str) -> list[tuple[int, str, str | None]]:
    """(indent, key, value) per line; value None for a section heading."""
    rows: list[tuple[int, str, str | None]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0 and re.fullmatch(r"GPU [0-9A-Fa-f:.]+", line.strip()):
            rows.append((0, line.strip(), None))  # "GPU 00000000:03:00.0" heads a GPU block
            continue
        key, sep, value = line.strip().partition(":")
        rows.append((indent, key.strip(), value.strip() if sep else None))
    return rows


def _text_gpu_blocks(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Top-level key/values, and per GPU a dict of 'Section/Sub/Key' -> value."""
    top: dict[str, str] = {}
    gpus: list[dict[str, str]] = []
    path: list[tuple[int, str]] = []
    for indent, key, value in _text_tree(text):
        if indent == 0 and key.startswith("GPU ") and value is None:
            gpus.append({"bus_id": key[4:].strip()})
            path = []
            continue
        if not gpus:
            if value is not None:
                top[key] = value
            continue
        while path and path[-1][0] >= indent:
            path.pop()
        if value is None:
            path.append((indent, key))
        else:
            gpus[-1]["/".join([p for _, p in path] + [key])] = value
    return top, gpus


def nvidia_smi_text(text: str) -> list[GpuInfo]:
    """GPUs of an ``nvidia-smi -q`` (or ``-a``) text report."""
    top, blocks = _text_gpu_blocks(text)
    if not blocks:
        raise ParseError("nvidia-smi -q: no 'GPU <bus id>' section found")
    return [_text_gpu(i, g, top) for i, g in enumerate(blocks)]


def _text_gpu(index: int, g: dict[str, str], top: dict[str, str]) -> GpuInfo:
    pcie = "PCI/GPU Link Info/PCIe Generation/"
    width = "PCI/GPU Link Info/Link Width/"
    agg = "ECC Errors/Aggregate/"
    reasons = [
        k for k, v in g.items() if k.startswith(("Clocks Event Reasons/", "Clocks Throttle Reasons/")) and v == "Active"
    ]
    active = tuple(k.split("/")[-1].lower().replace(" ", "_") for k in reasons)
    minor = _int(g.get("Minor Number"))
    return GpuInfo(
        index=minor if minor is not None else index,
        name=g.get("Product Name", ""),
        pci_device_id=_device_id(g.get("PCI/Device Id")),
        memory_mib=_int(g.get("FB Memory Usage/Total")),
        driver_version=top.get("Driver Version"),
        cuda_version=top.get("CUDA Version"),
        pcie_gen_current=_int(g.get(pcie + "Current")),
        pcie_gen_max=_int(g.get(pcie + "Max")),
        pcie_gen_device_max=_int(g.get(pcie + "Device Max")),
        pcie_width_current=_int(g.get(width + "Current")),
        pcie_width_max=_int(g.get(width + "Max")),
        ecc_uncorrected=_sum_known(
            _int(g.get(agg + "DRAM Uncorrectable")),
            _int(g.get(agg + "SRAM Uncorrectable")),
            _int(g.get(agg + "SRAM Uncorrectable Parity")),
            _int(g.get(agg + "SRAM Uncorrectable SEC-DED")),
        ),
        ecc_corrected=_sum_known(_int(g.get(agg + "DRAM Correctable")), _int(g.get(agg + "SRAM Correctable"))),
        retired_pages=_sum_known(
            _int(g.get("Retired Pages/Single Bit ECC")), _int(g.get("Retired Pages/Double Bit ECC"))
        ),
        remapped_rows_correctable=_int(g.get("Remapped Rows/Correctable Error")),
        remapped_rows_uncorrectable=_int(g.get("Remapped Rows/Uncorrectable Error")),
        remap_failure=_yes(g.get("Remapped Rows/Remapping Failure Occurred")),
        remap_pending=_yes(g.get("Remapped Rows/Pending")),
        throttle_active=tuple(r for r in active if r not in _IGNORED_REASONS),
        persistence_mode=_yes(g.get("Persistence Mode")),
        bus_id=g.get("bus_id", ""),
    )


# --- NVML values (as the agent prints them) ------------------------------------------------


def gpu_from_nvml(d: dict[str, Any]) -> GpuInfo:
    """A GpuInfo from the agent's NVML dict (keys are GpuInfo field names; missing -> None)."""
    values = {f.name: d.get(f.name, None if f.default is MISSING else f.default) for f in fields(GpuInfo)}
    processes = d.get("processes")
    kwargs: dict[str, Any] = {
        **values,
        "index": int(d["index"]),
        "name": str(d.get("name", "")),
        "bus_id": str(d.get("bus_id", "")),
        "throttle_active": tuple(d.get("throttle_active") or ()),
        "mig_devices": tuple(
            MigDevice(int(m["index"]), m.get("gpu_instance_id"), m.get("memory_mib"), str(m.get("uuid", "")))
            for m in d.get("mig_devices") or []
        ),
        "processes": None
        if processes is None
        else tuple(GpuProcess(int(p["pid"]), str(p.get("name", "")), p.get("used_mib")) for p in processes),
    }
    return GpuInfo(**kwargs)


def nvml_device_id(pci_device_id_field: int) -> int:
    """NVML's pciDeviceId packs device (high 16 bits) and vendor (low 16): 0x233010DE -> 0x2330."""
    return (pci_device_id_field >> 16) & 0xFFFF
