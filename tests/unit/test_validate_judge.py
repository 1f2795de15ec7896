"""The judge on synthetic fleets: pure values in, verdicts out."""

from __future__ import annotations

import json

import pytest

from provision.errors import InputError
from provision.validate import expectations, judge
from provision.validate.expectations import Overrides, find_sku, load_expect_file, parse_flat
from provision.validate.records import GpuInfo, Measurement
from tests.helpers.validate_records import h100


def gpu_node(name: str, bf16: list[float], gpus: list[GpuInfo] | None = None, **kw) -> judge.NodeInput:
    gpus = gpus or [h100(i) for i in range(len(bf16))]
    ms = [Measurement(name, "gpu_bf16_tflops", v, f"gpu{i}") for i, v in enumerate(bf16)]
    return judge.NodeInput(name, ms, gpus, **kw)


def cpu_node(name: str, **values: float) -> judge.NodeInput:
    return judge.NodeInput(name, [Measurement(name, k, v) for k, v in values.items()])


def by_node(results):
    return {r.node: r for r in results}


def findings(result, metric, device=None):
    return [f for f in result.findings if f.metric == metric and (device is None or f.device == device)]


# --- expectations ---


def test_sku_found_by_pci_device_id_before_name():
    assert find_sku("whatever", 0x2335).key == "H200-SXM"
    assert find_sku("NVIDIA A100-SXM4-80GB", None).key == "A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ],
)
def test_sku_found_by_longest_matching_name(name, key):
    assert find_sku(name, None).key == key


def test_unknown_gpu_has_no_sku():
    assert find_sku("NVIDIA RTX A5000", 0x2231) is None


def test_pcie_line_rate_per_generation():
    assert expectations.pcie_gbs(4, 16) == 31.5
    assert expectations.pcie_gbs(5, 8) == 31.5
    assert expectations.pcie_gbs(None, 16) is None


def test_flat_overrides_accept_floors_fractions_ceilings_and_fleet_rule():
    ov = parse_flat(
        {
            "disk_seq_read_mibs": 2000,
            "gpu_bf16_tflops.fraction": 0.8,
            "gpu_ecc_uncorrected.max": 2,
            "fleet.warn_drop": 0.05,
        },
        "x",
    )
    assert ov.floor("disk_seq_read_mibs") == 2000
    assert ov.fraction("gpu_bf16_tflops") == 0.8
    assert ov.ceiling("gpu_ecc_uncorrected") == 2
    assert ov.fleet.warn_drop == 0.05


def test_flat_overrides_refuse_unknown_metric_with_suggestion():
    with pytest.raises(InputError, match="did you mean 'disk_seq_read_mibs'"):
        parse_flat({"disk_seq_read_mbs": 1}, "expect.json")


def test_expect_file_with_bad_json_is_input_error(tmp_path):
    bad = tmp_path / "e.json"
    bad.write_text("{disk: 1}")
    with pytest.raises(InputError, match="not valid JSON"):
        load_expect_file(bad)


def test_expect_file_with_negative_value_is_input_error(tmp_path):
    bad = tmp_path / "e.json"
    bad.write_text(json.dumps({"ram_triad_gbs": -3}))
    with pytest.raises(InputError, match="not a number >= 0"):
        load_expect_file(bad)


# --- judge: synthetic fleets ---


def test_every_node_equal_gives_no_warning():
    nodes = [gpu_node(f"n{i}", [800.0 + i, 801.0, 799.0, 800.5]) for i in range(4)]
    nodes += [cpu_node(f"c{i}", ram_triad_gbs=20.0 + 0.2 * i, disk_seq_read_mibs=1500 - i) for i in range(4)]
    results = judge.judge(nodes)
    assert {r.verdict for r in results} == {"pass"}
    assert judge.exit_code(results) == 0


def test_one_slow_gpu_fails_its_node_and_only_its_node():
    nodes = [gpu_node(f"n{i}", [800.0] * 8) for i in range(3)]
    # 700 clears the datasheet floor (0.50 x 989.5 = 494.8) but sits 12% under its peers.
    nodes.append(gpu_node("slow", [800.0] * 7 + [700.0]))
    results = by_node(judge.judge(nodes))
    assert results["slow"].verdict == "warn"
    (f,) = findings(results["slow"], "gpu_bf16_tflops", "gpu7")
    assert f.verdict == "warn"
    assert "below the fleet median" in f.reason
    assert all(results[f"n{i}"].verdict == "pass" for i in range(3))


def test_gpu_below_datasheet_floor_fails_even_alone():
    results = judge.judge([gpu_node("n", [450.0])])
    (f,) = findings(results[0], "gpu_bf16_tflops")
    assert f.verdict == "fail"
    assert f.expectation == pytest.approx(0.50 * 989.5)
    assert "H100-SXM spec" in f.reason


def test_degraded_pcie_link_fails():
    gpus = [h100(0), h100(1, pcie_gen_max=4), h100(2, pcie_width_max=8)]
    (r,) = judge.judge([gpu_node("n", [800.0] * 3, gpus)])
    assert r.verdict == "fail"
    assert findings(r, "gpu_pcie_gen", "gpu1")[0].verdict == "fail"
    assert "degraded link" in findings(r, "gpu_pcie_width", "gpu2")[0].reason
    assert findings(r, "gpu_pcie_gen", "gpu0")[0].verdict == "pass"


def test_volatile_uncorrectable_errors_and_failed_remap_fail():
    gpus = [h100(0, ecc_uncorrected_volatile=3), h100(1, remap_failure=True)]
    (r,) = judge.judge([gpu_node("n", [800.0, 800.0], gpus)])
    assert findings(r, "gpu_ecc_uncorrected", "gpu0")[0].verdict == "fail"
    assert "volatile (since boot)" in findings(r, "gpu_ecc_uncorrected", "gpu0")[0].reason
    assert findings(r, "gpu_remap_failure", "gpu1")[0].verdict == "fail"
    assert r.verdict == "fail"


def test_ecc_ceiling_can_be_raised_per_group():
    ov = parse_flat({"gpu_ecc_uncorrected.max": 5}, "settings")
    (r,) = judge.judge([gpu_node("n", [800.0], [h100(0, ecc_uncorrected_volatile=3)], overrides=ov)])
    assert findings(r, "gpu_ecc_uncorrected")[0].verdict == "pass"


def test_unknown_sku_is_reported_and_judged_on_fleet():
    a5000 = dict(name="NVIDIA RTX A5000", pci_device_id=0x2231)
    nodes = [gpu_node(f"n{i}", [100.0], [h100(0, **a5000)]) for i in range(3)]
    nodes.append(gpu_node("slow", [60.0], [h100(0, **a5000)]))
    results = by_node(judge.judge(nodes))
    assert results["n0"].sku == "unknown SKU: NVIDIA RTX A5000"
    assert "unknown SKU" in findings(results["n0"], "gpu_bf16_tflops")[0].reason
    assert results["n0"].verdict == "pass"
    assert results["slow"].verdict == "fail"


def test_unknown_sku_alone_warns_instead_of_passing_silently():
    (r,) = judge.judge([gpu_node("n", [100.0], [h100(0, name="NVIDIA Foo", pci_device_id=0x9999)])])
    f = findings(r, "gpu_bf16_tflops")[0]
    assert f.verdict == "warn"
    assert "unknown SKU (NVIDIA Foo)" in f.reason


def test_gen5_gpu_in_gen4_slot_fails_for_unknown_sku():
    g = h100(0, name="NVIDIA Foo", pci_device_id=0x9999, pcie_gen_max=4, pcie_gen_device_max=5)
    (r,) = judge.judge([gpu_node("n", [100.0], [g])])
    assert findings(r, "gpu_pcie_gen")[0].verdict == "fail"


def test_slow_disk_on_one_of_two_nodes_fails_that_node():
    results = by_node(judge.judge([cpu_node("a", disk_seq_read_mibs=900.0), cpu_node("b", disk_seq_read_mibs=90.0)]))
    assert results["a"].verdict == "pass"
    assert results["b"].verdict == "fail"


def test_user_floor_fails_single_node():
    ov = parse_flat({"ram_triad_gbs": 50}, "expect")
    (r,) = judge.judge([judge.NodeInput("n", [Measurement("n", "ram_triad_gbs", 20.0)], overrides=ov)])
    assert r.verdict == "fail"
    assert findings(r, "ram_triad_gbs")[0].expectation == 50


def test_single_node_without_floor_says_it_was_not_compared():
    (r,) = judge.judge([cpu_node("n", ram_triad_gbs=20.0)])
    assert r.verdict == "pass"
    assert "no other node to compare" in findings(r, "ram_triad_gbs")[0].reason


def test_missing_tool_is_not_run_and_lowers_node_to_warn():
    m = Measurement("n", "disk_seq_read_mibs", None, not_run="not run: fio missing (`up` step base)")
    (r,) = judge.judge([judge.NodeInput("n", [m])])
    assert findings(r, "disk_seq_read_mibs")[0].verdict == "not_run"
    assert r.verdict == "warn"
    assert judge.exit_code([r]) == 1
    assert judge.exit_code([r], warn_ok=True) == 0


def test_no_gpu_is_benign_unless_host_is_in_gpu_nodes():
    m = Measurement("n", "gpu_bf16_tflops", None, not_run=judge.NO_GPU)
    (plain,) = judge.judge([judge.NodeInput("n", [m])])
    assert plain.verdict == "pass"
    assert findings(plain, "gpu_bf16_tflops")[0].verdict == "not_run"
    (gpu_host,) = judge.judge([judge.NodeInput("n", [m], wants_gpu=True)])
    assert gpu_host.verdict == "fail"


def test_unreachable_node_fails():
    (r,) = judge.judge([judge.NodeInput("n", [], errors=["ssh: connection refused"])])
    assert r.verdict == "fail"


def test_builtin_cpu_floor_only_warns():
    (r,) = judge.judge([cpu_node("n", cpu_gemm_peak_fraction=0.1)])
    assert r.verdict == "warn"


def test_exit_code_is_one_for_empty_fleet():
    assert judge.exit_code([]) == 1


def test_merged_overrides_prefer_the_run_file():
    base = parse_flat({"ram_triad_gbs": 10, "disk_seq_read_mibs": 5}, "settings")
    run = parse_flat({"ram_triad_gbs": 30}, "file")
    merged = base.merged(run)
    assert merged.floor("ram_triad_gbs") == 30
    assert merged.floor("disk_seq_read_mibs") == 5
    assert Overrides().merged(run).floor("ram_triad_gbs") == 30


def test_links_and_disks_get_a_wider_fleet_band_than_memory():
    nodes = [cpu_node(f"n{i}", net_gbits=30.0, ram_triad_gbs=20.0) for i in range(3)]
    nodes.append(cpu_node("x", net_gbits=25.5, ram_triad_gbs=17.0))  # both 15% below
    (x,) = [r for r in judge.judge(nodes) if r.node == "x"]
    assert findings(x, "net_gbits")[0].verdict == "pass"
    assert findings(x, "ram_triad_gbs")[0].verdict == "warn"


def test_noisy_links_pass_but_a_link_hundreds_of_times_slower_fails():
    # Healthy veth links on a loaded host spread 24..63 Gbit/s (a CI run saw this); in plain
    # units that spread made the MAD band reach below zero and a 0.05 Gbit/s node passed.
    healthy = {"n0": 62.9, "n1": 24.2, "n3": 40.0}
    nodes = [cpu_node(n, net_gbits=v) for n, v in healthy.items()] + [cpu_node("n2", net_gbits=0.05)]
    results = by_node(judge.judge(nodes))
    assert results["n2"].verdict == "fail"
    assert "below the fleet median" in findings(results["n2"], "net_gbits")[0].reason
    assert all(results[n].verdict == "pass" for n in healthy)


def test_a_measured_zero_is_an_outlier_not_a_math_error():
    nodes = [cpu_node(f"n{i}", disk_seq_read_mibs=v) for i, v in enumerate([900.0, 1500.0, 1200.0])]
    nodes.append(cpu_node("dead", disk_seq_read_mibs=0.0))
    results = by_node(judge.judge(nodes))
    assert results["dead"].verdict == "fail"
    assert all(results[f"n{i}"].verdict == "pass" for i in range(3))


def test_user_fleet_rule_applies_to_every_metric():
    ov = parse_flat({"fleet.warn_drop": 0.05, "fleet.fail_drop": 0.1}, "expect")
    nodes = [cpu_node(f"n{i}", net_gbits=30.0) for i in range(3)]
    nodes.append(judge.NodeInput("x", [Measurement("x", "net_gbits", 25.5)], overrides=ov))
    (x,) = [r for r in judge.judge(nodes) if r.node == "x"]
    assert x.verdict == "fail"


def test_hardware_slowdown_seen_in_the_one_idle_reading_only_warns():
    # No samples under load (the burn's telemetry did not run): one reading is not
    # "more than one sample", so it is reported and warns, never fails.
    gpus = [h100(0), h100(1, throttle_active=("sw_power_cap", "hw_thermal_slowdown"))]
    (r,) = judge.judge([gpu_node("n", [800.0, 800.0], gpus)])
    assert findings(r, "gpu_hw_slowdown", "gpu0")[0].verdict == "pass"
    seen_once = findings(r, "gpu_hw_slowdown", "gpu1")[0]
    assert seen_once.verdict == "not_run"
    assert seen_once.reason.startswith("not judged: seen once: hw_thermal_slowdown active in one idle reading")
    assert r.verdict == "warn"


def test_hardware_slowdown_seen_in_samples_under_load_fails_the_gpu():
    # The burn's telemetry row (two or more samples saw it) replaces the idle reading.
    gpus = [h100(0), h100(1, throttle_active=("hw_thermal_slowdown",))]
    node = gpu_node("n", [800.0, 800.0], gpus)
    node.measurements.append(
        Measurement("n", "gpu_hw_slowdown", 1.0, "gpu1", detail="under load: reasons seen: hw_thermal_slowdown")
    )
    (r,) = judge.judge([node])
    (bad,) = findings(r, "gpu_hw_slowdown", "gpu1")
    assert bad.verdict == "fail"
    assert "hw_thermal_slowdown" in bad.reason


def test_slow_gpu_in_a_single_node_is_caught_against_its_siblings():
    (r,) = judge.judge([gpu_node("only", [900.0] * 7 + [720.0])])
    slow = findings(r, "gpu_bf16_tflops", "gpu7")[0]
    assert slow.verdict == "warn"
    assert "below the fleet median" in slow.reason
    assert all(findings(r, "gpu_bf16_tflops", f"gpu{i}")[0].verdict == "pass" for i in range(7))


def test_a_two_node_fleet_fails_only_a_gap_beyond_3x():
    # Two values: no spread to judge noise by, and either node may be the odd one.
    pair = [cpu_node("a", ram_triad_gbs=2.7), cpu_node("b", ram_triad_gbs=5.4)]  # 2x apart
    (f,) = findings(by_node(judge.judge(pair))["a"], "ram_triad_gbs", "")
    assert f.verdict == "warn"
    assert "only 2 values" in f.reason
    far = [cpu_node("a", ram_triad_gbs=1.0), cpu_node("b", ram_triad_gbs=5.4)]  # 5.4x apart
    (f,) = findings(by_node(judge.judge(far))["a"], "ram_triad_gbs", "")
    assert f.verdict == "fail"
    # Three values: the usual rule (25% below the median fails) applies as before.
    three = [cpu_node("a", ram_triad_gbs=2.7), cpu_node("b", ram_triad_gbs=5.4), cpu_node("c", ram_triad_gbs=5.5)]
    (f,) = findings(by_node(judge.judge(three))["a"], "ram_triad_gbs", "")
    assert f.verdict == "fail"


# --- GPUs that could not be measured ---


def gpu_not_run(reason: str, device: str = "gpu0", metric: str = "gpu_bf16_tflops") -> Measurement:
    return Measurement("n", metric, None, device, reason)


def test_gpu_step_that_raised_fails_a_host_with_gpus():
    m = gpu_not_run("not run: gpu0 gpu_bf16_tflops: RuntimeError: CUDA error: an illegal memory access")
    (r,) = judge.judge([judge.NodeInput("n", [m], [h100(0)])])
    (f,) = findings(r, "gpu_bf16_tflops")
    assert f.verdict == "fail"
    assert "RuntimeError" in f.reason
    assert r.verdict == "fail"


def test_torch_seeing_no_cuda_device_fails_a_gpu_nodes_host():
    m = gpu_not_run("not run: torch sees no CUDA device (CPU-only torch build, ...)", device="")
    (r,) = judge.judge([judge.NodeInput("n", [m], wants_gpu=True)])
    assert r.verdict == "fail"


def test_gpu_nvml_lost_fails_the_node_even_when_it_was_the_only_gpu():
    m = gpu_not_run("not run: NVML cannot read gpu0: NVMLError_GpuIsLost: GPU is lost", device="gpu0")
    (r,) = judge.judge([judge.NodeInput("n", [m])])
    assert r.verdict == "fail"


def test_benign_not_runs_stay_benign_on_a_gpu_host():
    ms = [gpu_not_run("not run: one GPU", device="", metric="gpu_allreduce_busbw_gbs")]
    (r,) = judge.judge([judge.NodeInput("n", ms, [h100(0)], wants_gpu=True)])
    assert findings(r, "gpu_allreduce_busbw_gbs")[0].verdict == "not_run"
    assert r.verdict == "pass"
    disk = Measurement("c", "disk_seq_read_mibs", None, not_run="not run: fio missing (run the `up` step base)")
    (cpu_host,) = judge.judge([judge.NodeInput("c", [disk, gpu_not_run(judge.NO_GPU, device="")])])
    assert cpu_host.verdict == "warn"  # the missing tool, not the missing GPU


def test_cuda_seeing_fewer_gpus_than_nvml_fails_naming_both_counts():
    node = gpu_node("n", [700.0], inventory={"gpu_counts": {"nvml": 8, "cuda": 7}})
    (r,) = judge.judge([node])
    (f,) = findings(r, judge.GPU_COUNT)
    assert f.verdict == "fail"
    assert "CUDA sees 7 GPUs, NVML sees 8" in f.reason
    assert r.verdict == "fail"
    (ok,) = judge.judge([gpu_node("n", [700.0], inventory={"gpu_counts": {"nvml": 1, "cuda": 1}})])
    assert findings(ok, judge.GPU_COUNT)[0].verdict == "pass"


def test_each_fleet_pool_band_is_worked_out_once_however_many_values_ask_for_it(monkeypatch):
    # A band is a median of its whole pool; worked out per value, judging grew with the
    # square of the fleet (59 s for 300 simulated 8-GPU nodes, benchmarks/fleet_scale.py).
    calls = []
    real = judge.band
    monkeypatch.setattr(judge, "band", lambda values, k: calls.append(id(values)) or real(values, k))
    nodes = [gpu_node(f"n{i}", [900.0 + i, 905.0, 910.0, 899.0]) for i in range(30)]
    nodes += [cpu_node(f"c{i}", ram_triad_gbs=100.0 + i) for i in range(30)]
    results = judge.judge(nodes)
    values = sum(1 for r in results for f in r.findings if f.value is not None)
    assert values > 150  # 120 GEMM values, 30 RAM values, and the GPUs' health counters
    assert len(calls) == len(set(calls))  # no pool twice
    assert len(calls) < 20  # a handful of pools (GEMM, RAM, each health counter)
    assert all(r.verdict == "pass" for r in results)


@pytest.mark.parametrize(
    "text", ['{"gpu_ecc_uncorrected.max": NaN}', '{"fleet.fail_drop": Infinity}', '{"ram_triad_gbs": 1e999}']
)
def test_expect_file_with_a_threshold_that_is_not_finite_is_input_error(tmp_path, text):
    # Every comparison with NaN is false: a NaN ceiling passed 12 ECC errors, a NaN fail_drop
    # never failed a node. JSON's NaN and Infinity, and 1e999, all parse.
    bad = tmp_path / "e.json"
    bad.write_text(text)
    with pytest.raises(InputError, match="is not a finite number"):
        load_expect_file(bad)


def test_fleet_warn_drop_above_fail_drop_is_input_error():
    with pytest.raises(InputError, match=r"0\.5 is above fleet\.fail_drop 0\.25"):
        parse_flat({"fleet.warn_drop": 0.5}, "expect.json")


def test_an_expect_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "e.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        load_expect_file(fifo)
