"""Test stand-in for NVML's C library, fed from captured real ``nvidia-smi`` output.

nvidia-ml-py's own ``pynvml`` module stays as it is: its constants, structs, wrappers and
error classes run for real. Only the C library is replaced. pynvml loads
``libnvidia-ml.so.1`` into ``pynvml.nvmlLib`` and looks every function up by name
(``_nvmlGetFunctionPointer``, cached in ``_nvmlGetFunctionPointer_cache``); the stand-in is
put in ``nvmlLib``, and its attributes are Python callables that behave like the C
functions: they take the ctypes arguments pynvml passes (``byref(c_uint)``, pointers to
structs, string buffers), write through them and return an ``nvmlReturn_t`` code, so that
pynvml's ``_nvmlCheckReturn`` raises its real error classes.

- A function the real library exports but the capture has no value for returns
  ``NVML_ERROR_NOT_SUPPORTED`` (what NVML answers for a query a GPU does not support).
- A function the real library does not export raises ``AttributeError`` on lookup, which
  pynvml turns into ``NVMLError_FunctionNotFound``, as for a missing symbol. The exported
  names are the ``readelf --dyn-syms`` list of libnvidia-ml.so.1 590.48.01 in the H100
  capture (tests/fixtures/SOURCES.md).

Values come from ``nvidia-smi -q -x`` (XML, DTD v11 to v13) and from the ``nvidia-smi -q``
text sections of the nvidia_gpu_exporter captures. Both are read into the same element
tree (text keys lower-cased with ``_``), so one reader maps either to ``StandInGpu``.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SYMBOLS_CAPTURE = "nvidia-smi-capture_h100-80gb-hbm3_590.48.01_ubuntu22.04.txt"

# The captured models, by the name tests use: file, and for text captures the section.
CAPTURES: dict[str, tuple[str, str]] = {
    "h100-sxm": ("nvidia-smi-capture_h100-80gb-hbm3_590.48.01_ubuntu22.04.txt", "idle"),
    "h100-sxm-loaded": ("nvidia-smi-capture_h100-80gb-hbm3_590.48.01_ubuntu22.04.txt", "load"),
    "h100-sxm-mig": ("nvidia-smi-capture_h100-80gb-hbm3-mig_590.48.01_ubuntu22.04.txt", "idle"),
    "h200": ("nvidia-smi-capture_h200_590.48.01_ubuntu22.04.txt", "idle"),
    # Captured here on a lent H200 by benchmarks/gpu_check.sh: idle, and 10 s into a bf16 burn
    # (at its 700 W cap: sw_power_cap active, no hardware slowdown).
    "h200-580": ("nvidia-smi-q-x_h200_580.159.04_idle.xml", ""),
    "h200-580-burn": ("nvidia-smi-q-x_h200_580.159.04_burn.xml", ""),
    "a100-40gb-mig": ("nvidia-smi-q-x_a100-sxm4-40gb-mig_510.47.03.xml", ""),
    "a100-80gb-mig": ("nvidia-smi-q-x_a100-sxm4-80gb-mig_535.54.03.xml", ""),
    "rtx-a5000-x2": ("nvidia-smi-q-x_2x-rtx-a5000_590.44.01.xml", ""),
    "rtx-pro-6000": ("nvidia-smi-q-x_rtx-pro-6000-blackwell-maxq_590.44.01.xml", ""),
    "a10g": ("nvidia-smi-q-x_a10g.xml", ""),
    "t4": ("nvidia-smi-q-x_tesla-t4.xml", ""),
}

# The MIG user guide: A100 and H100 have at most 7 GPU instances. nvidia-smi does not print
# the maximum, so the stand-in answers this for every MIG-capable GPU.
STAND_IN_MAX_MIG_DEVICES = 7

_REASON_BITS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
_COMPUTE_MODES = {
    "default": pynvml.NVML_COMPUTEMODE_DEFAULT,
    "exclusive_thread": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
    "prohibited": pynvml.NVML_COMPUTEMODE_PROHIBITED,
    "exclusive_process": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
}


@dataclass(frozen=True)
class StandInMigDevice:
    """One MIG device of a captured GPU."""

    index: int  # MIG device index on its GPU
    gpu_instance_id: int  # GPU instance id
    memory_mib: int  # its framebuffer


@dataclass(frozen=True)
class StandInProcess:
    """A process nvidia-smi listed on a GPU."""

    pid: int  # process id on the captured host
    name: str  # process name as nvidia-smi printed it
    used_mib: int | None  # GPU memory it holds


@dataclass(frozen=True)
class StandInGpu:
    """What NVML would answer for one captured GPU; None: the capture says N/A."""

    name: str  # product name
    pci_device_id: int  # device id (high 16 bits) and vendor 0x10de (low 16 bits)
    bus_id: str  # "00000000:00:09.0"
    uuid: str  # GPU-... (masked in some captures)
    memory_mib: int | None  # framebuffer total
    pcie: dict[str, int | None]  # gen_current, gen_max, gen_device_max, width_current, width_max
    persistence: int | None  # 1 enabled, 0 disabled
    sm_clock: int | None  # SM clock now, MHz
    sm_clock_max: int | None  # SM clock maximum, MHz
    ecc_mode: tuple[int, int] | None  # (current, pending) NVML_FEATURE_*; None: no ECC
    ecc: dict[tuple[int, int], int]  # (error type, counter type) -> count, for known counts
    sram_threshold_exceeded: int | None  # 1 when the SRAM error threshold was exceeded
    remapped_rows: tuple[int, int, int, int] | None  # (correctable, uncorrectable, pending, failure)
    retired_pages: dict[int, int] | None  # page retirement cause -> pages retired
    retired_pending: int | None  # a page waits to be retired (needs a reset)
    mig_mode: tuple[int, int] | None  # (current, pending); None: not MIG capable
    mig_devices: tuple[StandInMigDevice, ...]  # MIG devices that exist
    compute_mode: int | None  # NVML_COMPUTEMODE_*
    processes: tuple[StandInProcess, ...]  # compute processes on the GPU
    clock_reasons: int | None  # clocks event reason bits
    nvlinks: tuple[int, ...] | None  # state per link (1 up); None: no NVLink
    temperature_c: int | None = None  # GPU core temperature, C
    power_mw: int | None = None  # power draw (instant, else average), mW
    utilization: tuple[int, int] | None = None  # (gpu %, memory %)
    memory_used_mib: int | None = None  # framebuffer used
    lost: bool = False  # every query answers NVML_ERROR_GPU_IS_LOST (fell off the bus)


@dataclass
class StandInCapture:
    """A captured host: its driver and GPUs."""

    driver: str  # driver version
    cuda: str  # CUDA version the driver supports, "13.1"
    gpus: list[StandInGpu] = field(default_factory=list)  # in NVML index order


# --- reading captures -----------------------------------------------------------------------


def _text_to_tree(text: str) -> ET.Element:
    """An ``nvidia-smi -q`` text report as an element tree shaped like the XML one."""
    root = ET.Element("nvidia_smi_log")
    stack: list[tuple[int, ET.Element]] = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        head = re.fullmatch(r"GPU ([0-9A-Fa-f:.]+)", line.strip())
        key, sep, value = line.strip().partition(":")
        if head:
            key, sep, value = "gpu", "", ""
        while stack[-1][0] >= indent:
            stack.pop()
        tag = re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")
        node = ET.SubElement(stack[-1][1], tag.replace("sec_ded", "secded"))
        node.text = value.strip() if sep else None
        if head:
            node.set("id", head.group(1))
        stack.append((indent, node))
    return root


def _section(text: str, title: str) -> str:
    """The body of one ``# <title>`` section of an nvidia_gpu_exporter capture."""
    start = text.index(f"# {title}\n")
    body = text[start:].split("#" * 80 + "\n", 2)[1]
    return body.split("#" * 80)[0]


def _nvlinks(text: str) -> tuple[int, ...] | None:
    body = _section(text, "capabilities :: nvlink -s")
    states = [0 if "inactive" in rate else 1 for rate in re.findall(r"Link \d+: (.*)", body)]
    return tuple(states) or None


def _int(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _pick(g: ET.Element, *paths: str) -> str | None:
    for path in paths:
        value = g.findtext(path)
        if value is not None and value.strip() not in ("N/A", ""):
            return value.strip()
    return None


def _mode(g: ET.Element, section: str, current: str, pending: str) -> tuple[int, int] | None:
    cur = _pick(g, f"{section}/{current}", f"{section}/current")
    pend = _pick(g, f"{section}/{pending}", f"{section}/pending")
    if cur is None:
        return None
    return int(cur == "Enabled"), int((pend or cur) == "Enabled")


def _ecc(g: ET.Element) -> dict[tuple[int, int], int]:
    unc = ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
    cor = ("dram_correctable", "sram_correctable")
    counts = {}
    for counter, where in ((pynvml.NVML_VOLATILE_ECC, "volatile"), (pynvml.NVML_AGGREGATE_ECC, "aggregate")):
        for etype, keys in (
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, unc),
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, cor),
        ):
            known = [v for v in (_int(_pick(g, f"ecc_errors/{where}/{k}")) for k in keys) if v is not None]
            if known:
                counts[(etype, counter)] = sum(known)
    return counts


def _remapped_rows(g: ET.Element) -> tuple[int, int, int, int] | None:
    r = "remapped_rows/"
    corr = _int(_pick(g, r + "remapped_row_corr", r + "correctable_error"))
    unc = _int(_pick(g, r + "remapped_row_unc", r + "uncorrectable_error"))
    if corr is None or unc is None:
        return None
    pending = _pick(g, r + "remapped_row_pending", r + "pending") == "Yes"
    failure = _pick(g, r + "remapped_row_failure", r + "remapping_failure_occurred") == "Yes"
    return corr, unc, int(pending), int(failure)


def _retired(g: ET.Element) -> dict[int, int] | None:
    sbe = _int(_pick(g, "retired_pages/multiple_single_bit_retirement/retired_count", "retired_pages/single_bit_ecc"))
    dbe = _int(_pick(g, "retired_pages/double_bit_retirement/retired_count", "retired_pages/double_bit_ecc"))
    if sbe is None or dbe is None:
        return None
    return {
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: sbe,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: dbe,
    }


def _mig_devices(g: ET.Element) -> tuple[StandInMigDevice, ...]:
    devices = g.findall("mig_devices/mig_device") + g.findall("mig_device")
    return tuple(
        StandInMigDevice(
            _int(d.findtext("index")) or 0,
            _int(d.findtext("gpu_instance_id")) or 0,
            _int(_pick(d, "fb_memory_usage/total", "shared_fb_memory_usage/total")) or 0,
        )
        for d in devices
    )


def _processes(g: ET.Element) -> tuple[StandInProcess, ...]:
    xml = [
        StandInProcess(int(p.findtext("pid", "0")), p.findtext("process_name", ""), _int(p.findtext("used_memory")))
        for p in g.findall("processes/process_info")
    ]
    text = [
        StandInProcess(int(p.text or 0), p.findtext("name", ""), _int(p.findtext("used_gpu_memory")))
        for p in g.findall("processes/process_id")
    ]
    return tuple(xml + text)


def _clock_reasons(g: ET.Element) -> int | None:
    section = next(
        (s for s in (g.find("clocks_event_reasons"), g.find("clocks_throttle_reasons")) if s is not None), None
    )
    if section is None:
        return None
    bits = 0
    for r in section.iter():
        name = re.sub(r"^clocks_(event|throttle)_reason_", "", r.tag)
        if (r.text or "").strip() == "Active":
            bits |= _REASON_BITS.get(name, 0)
    return bits


def _pcie(g: ET.Element) -> dict[str, int | None]:
    link = "pci/pci_gpu_link_info/"
    text = "pci/gpu_link_info/"
    return {
        "gen_current": _int(_pick(g, link + "pcie_gen/current_link_gen", text + "pcie_generation/current")),
        "gen_max": _int(_pick(g, link + "pcie_gen/max_link_gen", text + "pcie_generation/max")),
        "gen_device_max": _int(_pick(g, link + "pcie_gen/max_device_link_gen", text + "pcie_generation/device_max")),
        "width_current": _int(_pick(g, link + "link_widths/current_link_width", text + "link_width/current")),
        "width_max": _int(_pick(g, link + "link_widths/max_link_width", text + "link_width/max")),
    }


def _gpu(g: ET.Element, nvlinks: tuple[int, ...] | None) -> StandInGpu:
    pci_id = _pick(g, "pci/pci_device_id", "pci/device_id") or "0"
    compute = (_pick(g, "compute_mode") or "").lower()
    persistence = _pick(g, "persistence_mode")
    sram = _pick(g, "ecc_errors/aggregate/sram_threshold_exceeded")
    return StandInGpu(
        name=_pick(g, "product_name") or "",
        pci_device_id=int(pci_id.lower().removeprefix("0x"), 16),
        bus_id=g.get("id", ""),
        uuid=_pick(g, "uuid", "gpu_uuid") or "",
        memory_mib=_int(_pick(g, "fb_memory_usage/total")),
        pcie=_pcie(g),
        persistence=None if persistence is None else int(persistence == "Enabled"),
        sm_clock=_int(_pick(g, "clocks/sm_clock", "clocks/sm")),
        sm_clock_max=_int(_pick(g, "max_clocks/sm_clock", "max_clocks/sm")),
        ecc_mode=_mode(g, "ecc_mode", "current_ecc", "pending_ecc"),
        ecc=_ecc(g),
        sram_threshold_exceeded=None if sram is None else int(sram == "Yes"),
        remapped_rows=_remapped_rows(g),
        retired_pages=_retired(g),
        retired_pending=None if _pick(g, "retired_pages/pending_retirement") is None else 0,
        mig_mode=_mode(g, "mig_mode", "current_mig", "pending_mig"),
        mig_devices=_mig_devices(g),
        compute_mode=_COMPUTE_MODES.get(compute),
        processes=_processes(g),
        clock_reasons=_clock_reasons(g),
        nvlinks=nvlinks,
        temperature_c=_int(_pick(g, "temperature/gpu_temp", "temperature/gpu_current_temp")),
        power_mw=_milli(
            _pick(
                g,
                "gpu_power_readings/instant_power_draw",
                "gpu_power_readings/instantaneous_power_draw",
                "gpu_power_readings/power_draw",
                "gpu_power_readings/average_power_draw",
                "power_readings/power_draw",
            )
        ),
        utilization=_utilization(g),
        memory_used_mib=_int(_pick(g, "fb_memory_usage/used")),
    )


def _milli(text: str | None) -> int | None:
    """ "714.43 W" -> 714430 (mW); N/A and missing -> None."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*W", text or "")
    return round(float(m.group(1)) * 1000) if m else None


def _utilization(g: ET.Element) -> tuple[int, int] | None:
    gpu, memory = (
        _int(_pick(g, "utilization/gpu_util", "utilization/gpu")),
        _int(_pick(g, "utilization/memory_util", "utilization/memory")),
    )
    return None if gpu is None or memory is None else (gpu, memory)


def load_capture(model: str) -> StandInCapture:
    """The captured host named ``model`` (a key of CAPTURES)."""
    filename, phase = CAPTURES[model]
    text = (FIXTURES / filename).read_text()
    if filename.endswith(".xml"):
        root, nvlinks = ET.fromstring(text), None
    else:
        root, nvlinks = _text_to_tree(_section(text, f"{phase} :: query (-q)")), _nvlinks(text)
    return StandInCapture(
        driver=root.findtext("driver_version", ""),
        cuda=root.findtext("cuda_version", ""),
        gpus=[_gpu(g, nvlinks) for g in root.findall("gpu")],
    )


def real_library_symbols() -> frozenset[str]:
    """The functions libnvidia-ml.so.1 590.48.01 exports (readelf in the H100 capture)."""
    body = _section((FIXTURES / SYMBOLS_CAPTURE).read_text(), "capabilities :: nvml-symbols")
    return frozenset(line.strip() for line in body.splitlines() if line.strip().startswith("nvml"))


# --- the C library ------------------------------------------------------------------------

S = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
MIG_HANDLE_BITS = 8  # handle = (gpu index + 1) << 8 | (MIG device index + 1)


def _out(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)`` (or x itself when passed directly)."""
    return getattr(ref, "_obj", ref)


def _set(ref: Any, value: int) -> int:
    _out(ref).value = value
    return S


def _value(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


class StandInCFunction:
    """One C function: callable, and with the ``restype`` attribute pynvml may set."""

    def __init__(self, name: str, impl: Callable[..., Any]) -> None:
        self.__name__, self.impl, self.restype = name, impl, ctypes.c_int
        self.calls = 0  # how often pynvml called it

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.impl(*args)


class StandInNvmlLibrary:
    """libnvidia-ml.so.1 for pynvml, answering from a StandInCapture.

    ``init_error``: the code nvmlInitWithFlags returns (a driver/library version mismatch,
    the driver not loaded); ``calls`` counts each function pynvml looked up and called."""

    def __init__(self, capture: StandInCapture, init_error: int = S) -> None:
        self.capture, self.init_error = capture, init_error
        self.symbols = real_library_symbols()
        self.functions: dict[str, StandInCFunction] = {}
        self.started = 0  # nvmlInit minus nvmlShutdown calls

    def __getattr__(self, name: str) -> StandInCFunction:
        if name.startswith("_") or name not in self.symbols:
            raise AttributeError(name)  # pynvml: NVMLError_FunctionNotFound
        if name not in self.functions:
            impl = getattr(self, "c_" + name, None)
            self.functions[name] = StandInCFunction(name, impl or (lambda *args: NOT_SUPPORTED))
        return self.functions[name]

    def called(self, name: str) -> int:
        return self.functions[name].calls if name in self.functions else 0

    # system ----------------------------------------------------------------------------

    def c_nvmlInitWithFlags(self, flags: Any) -> int:
        if self.init_error == S:
            self.started += 1
        return self.init_error

    def c_nvmlShutdown(self) -> int:
        self.started -= 1
        return S

    def c_nvmlErrorString(self, code: Any) -> bytes:
        return f"NVML error {code}".encode()

    def c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.capture.driver.encode()
        return S

    def c_nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        major, _, minor = self.capture.cuda.partition(".")
        return _set(ref, int(major) * 1000 + int(minor or 0) * 10) if major else NOT_SUPPORTED

    def c_nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        for g in self.capture.gpus:
            for p in g.processes:
                if p.pid == _value(pid):
                    buf.value = p.name.encode()
                    return S
        return pynvml.NVML_ERROR_NOT_FOUND

    def c_nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        return _set(ref, len(self.capture.gpus))

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = _value(index)
        if i >= len(self.capture.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if self.capture.gpus[i].lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        ctypes.c_void_p.from_buffer(_out(ref)).value = (i + 1) << MIG_HANDLE_BITS
        return S

    # per device: every query goes through _device --------------------------------------

    def _device(self, handle: Any) -> tuple[StandInGpu | None, StandInMigDevice | None, int]:
        """(GPU, MIG device or None, error code) for a handle."""
        value = ctypes.cast(handle, ctypes.c_void_p).value or 0
        gpu = self.capture.gpus[(value >> MIG_HANDLE_BITS) - 1]
        mig_index = (value & ((1 << MIG_HANDLE_BITS) - 1)) - 1
        mig = next((d for d in gpu.mig_devices if d.index == mig_index), None) if mig_index >= 0 else None
        return gpu, mig, pynvml.NVML_ERROR_GPU_IS_LOST if gpu.lost else S

    def _answer(self, handle: Any, value: Callable[[StandInGpu], int | None], ref: Any) -> int:
        gpu, _, err = self._device(handle)
        if err != S or gpu is None:
            return err
        v = value(gpu)
        return NOT_SUPPORTED if v is None else _set(ref, v)

    def c_nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is not None and err == S:
            buf.value = gpu.name.encode()
        return err

    def c_nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        gpu, mig, err = self._device(h)
        if gpu is not None and err == S:
            buf.value = (f"MIG-{gpu.uuid[4:]}/{mig.gpu_instance_id}" if mig else gpu.uuid).encode()
        return err

    def c_nvmlDeviceGetPciInfo_v3(self, h: Any, ref: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        info = _out(ref)
        info.busId = info.busIdLegacy = gpu.bus_id.encode()
        info.pciDeviceId = gpu.pci_device_id
        domain, bus, dev = (int(p, 16) for p in re.split(r"[:.]", gpu.bus_id)[:3])
        info.domain, info.bus, info.device = domain, bus, dev
        return S

    def c_nvmlDeviceGetMemoryInfo(self, h: Any, ref: Any) -> int:
        gpu, mig, err = self._device(h)
        if gpu is None or err != S:
            return err
        mib = mig.memory_mib if mig else gpu.memory_mib
        if mib is None:
            return NOT_SUPPORTED
        used = 0 if mig or gpu.memory_used_mib is None else gpu.memory_used_mib
        mem = _out(ref)
        mem.total, mem.used, mem.free = mib << 20, used << 20, (mib - used) << 20
        return S

    def c_nvmlDeviceGetTemperature(self, h: Any, sensor: Any, ref: Any) -> int:
        core = _value(sensor) == pynvml.NVML_TEMPERATURE_GPU
        return self._answer(h, lambda g: g.temperature_c if core else None, ref)

    def c_nvmlDeviceGetPowerUsage(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: g.power_mw, ref)

    def c_nvmlDeviceGetUtilizationRates(self, h: Any, ref: Any) -> int:
        gpu, mig, err = self._device(h)
        if gpu is None or err != S:
            return err
        if mig or gpu.utilization is None:
            return NOT_SUPPORTED
        rates = _out(ref)
        rates.gpu, rates.memory = gpu.utilization
        return S

    def _pcie(key: str) -> Callable[..., int]:  # builds the five PCIe link queries below
        def query(self: StandInNvmlLibrary, h: Any, ref: Any) -> int:
            return self._answer(h, lambda g: g.pcie[key], ref)

        return query

    c_nvmlDeviceGetCurrPcieLinkGeneration = _pcie("gen_current")
    c_nvmlDeviceGetMaxPcieLinkGeneration = _pcie("gen_max")
    c_nvmlDeviceGetGpuMaxPcieLinkGeneration = _pcie("gen_device_max")
    c_nvmlDeviceGetCurrPcieLinkWidth = _pcie("width_current")
    c_nvmlDeviceGetMaxPcieLinkWidth = _pcie("width_max")

    def c_nvmlDeviceGetPersistenceMode(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: g.persistence, ref)

    def c_nvmlDeviceGetClockInfo(self, h: Any, kind: Any, ref: Any) -> int:
        sm = _value(kind) == pynvml.NVML_CLOCK_SM
        return self._answer(h, lambda g: g.sm_clock if sm else None, ref)

    def c_nvmlDeviceGetMaxClockInfo(self, h: Any, kind: Any, ref: Any) -> int:
        sm = _value(kind) == pynvml.NVML_CLOCK_SM
        return self._answer(h, lambda g: g.sm_clock_max if sm else None, ref)

    def c_nvmlDeviceGetCurrentClocksEventReasons(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: g.clock_reasons, ref)

    c_nvmlDeviceGetCurrentClocksThrottleReasons = c_nvmlDeviceGetCurrentClocksEventReasons

    def c_nvmlDeviceGetComputeMode(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: g.compute_mode, ref)

    # memory errors -----------------------------------------------------------------------

    def _pair(self, h: Any, pair: Callable[[StandInGpu], tuple[int, int] | None], a: Any, b: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        values = pair(gpu)
        if values is None:
            return NOT_SUPPORTED
        _set(a, values[0])
        return _set(b, values[1])

    def c_nvmlDeviceGetEccMode(self, h: Any, current: Any, pending: Any) -> int:
        return self._pair(h, lambda g: g.ecc_mode, current, pending)

    def c_nvmlDeviceGetTotalEccErrors(self, h: Any, etype: Any, counter: Any, ref: Any) -> int:
        key = (_value(etype), _value(counter))
        return self._answer(h, lambda g: g.ecc.get(key), ref)

    def c_nvmlDeviceGetRemappedRows(self, h: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        if gpu.remapped_rows is None:
            return NOT_SUPPORTED
        for ref, value in zip((corr, unc, pending, failure), gpu.remapped_rows, strict=True):
            _set(ref, value)
        return S

    def c_nvmlDeviceGetRetiredPages(self, h: Any, cause: Any, count: Any, pages: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        if gpu.retired_pages is None:
            return NOT_SUPPORTED
        n = gpu.retired_pages.get(_value(cause), 0)
        if pages is None or _out(count).value < n:
            _set(count, n)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if n else S
        for k in range(n):  # the captures list no addresses: number the pages
            pages[k] = 0x1000 * (k + 1)
        return _set(count, n)

    def c_nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: g.retired_pending, ref)

    def c_nvmlDeviceGetSramEccErrorStatus(self, h: Any, ref: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        status = _out(ref)
        if gpu.sram_threshold_exceeded is None:
            return NOT_SUPPORTED
        if status.version != pynvml.nvmlEccSramErrorStatus_v1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        status.bThresholdExceeded = gpu.sram_threshold_exceeded
        return S

    # links, MIG, processes ---------------------------------------------------------------

    def c_nvmlDeviceGetNvLinkState(self, h: Any, link: Any, ref: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        if gpu.nvlinks is None:
            return NOT_SUPPORTED
        i = _value(link)
        return _set(ref, gpu.nvlinks[i]) if i < len(gpu.nvlinks) else pynvml.NVML_ERROR_INVALID_ARGUMENT

    def c_nvmlDeviceGetMigMode(self, h: Any, current: Any, pending: Any) -> int:
        return self._pair(h, lambda g: g.mig_mode, current, pending)

    def c_nvmlDeviceGetMaxMigDeviceCount(self, h: Any, ref: Any) -> int:
        return self._answer(h, lambda g: None if g.mig_mode is None else STAND_IN_MAX_MIG_DEVICES, ref)

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: Any, ref: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        if gpu.mig_mode is None or not gpu.mig_mode[0]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        i = _value(index)
        if not any(d.index == i for d in gpu.mig_devices):
            return pynvml.NVML_ERROR_NOT_FOUND
        parent = ctypes.cast(h, ctypes.c_void_p).value or 0
        ctypes.c_void_p.from_buffer(_out(ref)).value = parent | (i + 1)
        return S

    def c_nvmlDeviceGetGpuInstanceId(self, h: Any, ref: Any) -> int:
        _, mig, err = self._device(h)
        if err != S:
            return err
        return _set(ref, mig.gpu_instance_id) if mig else pynvml.NVML_ERROR_INVALID_ARGUMENT

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count: Any, infos: Any) -> int:
        gpu, _, err = self._device(h)
        if gpu is None or err != S:
            return err
        procs = gpu.processes
        if infos is None or _out(count).value < len(procs):
            _set(count, len(procs))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else S
        for k, p in enumerate(procs):
            infos[k].pid = p.pid
            infos[k].usedGpuMemory = (p.used_mib or 0) << 20
            infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFF
        return _set(count, len(procs))


# --- install into the real pynvml module ----------------------------------------------------


def stand_in_library(model: str, init_error: int = S, **changes: Any) -> StandInNvmlLibrary:
    """The stand-in for a captured model; ``changes`` alter every GPU (``lost=True``,
    ``nvlinks=(1,) * 12``...); change one GPU through ``library.capture.gpus``."""
    capture = load_capture(model)
    capture.gpus = [replace(g, **changes) for g in capture.gpus]
    return StandInNvmlLibrary(capture, init_error)


@contextlib.contextmanager
def installed(library: StandInNvmlLibrary | None) -> Iterator[StandInNvmlLibrary | None]:
    """pynvml with ``library`` as its C library (None: libnvidia-ml.so.1 is not found);
    the module's own state is restored afterwards."""
    saved = (pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache, pynvml._nvmlLib_refcount)
    pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache = library, {}
    real_cdll = pynvml.CDLL
    if library is None:  # no driver installed: loading the library fails as it would here
        pynvml.CDLL = _no_library
    try:
        yield library
    finally:
        pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache, pynvml._nvmlLib_refcount = saved
        pynvml.CDLL = real_cdll


def _no_library(name: str) -> Any:
    raise OSError(f"{name}: cannot open shared object file: No such file or directory")
