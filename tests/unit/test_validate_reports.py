"""JSON, JUnit and HTML reports from judged synthetic fleets."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from provision.validate import agent_stream, judge, report_html, report_json, report_junit
from provision.validate.records import Measurement
from tests.helpers.validate_records import h100_fleet


def fleet():
    nodes = []
    for name, disk in (("a", 900.0), ("b", 910.0), ("c", 90.0)):
        nodes.append(
            judge.NodeInput(
                name,
                [
                    Measurement(name, "disk_seq_read_mibs", disk),
                    Measurement(name, "ram_triad_gbs", 20.0),
                    Measurement(name, "gpu_bf16_tflops", None, not_run=judge.NO_GPU),
                ],
            )
        )
    nodes.append(
        judge.NodeInput(
            "d", [Measurement("d", "disk_seq_read_mibs", None, not_run="not run: fio missing (run the `up` step base)")]
        )
    )
    nodes.append(judge.NodeInput("e", [], errors=["ssh: connection refused"]))
    return judge.judge(nodes)


def test_json_report_has_schema_summary_and_a_record_per_node_and_metric():
    results = fleet()
    run = report_json.RunInfo("inv.py", "quick", ["disk", "ram", "gpu"], judge.exit_code(results))
    doc = report_json.document(results, run)
    assert doc["schema"] == "provision.validate/1"
    assert doc["summary"] == {"pass": 2, "warn": 1, "fail": 2, "exit_code": 1}
    keys = {(r["node"], r["metric"]) for r in doc["records"]}
    assert ("c", "disk_seq_read_mibs") in keys
    assert ("a", "gpu_bf16_tflops") in keys
    rec = next(r for r in doc["records"] if (r["node"], r["metric"]) == ("c", "disk_seq_read_mibs"))
    assert rec["verdict"] == "fail"
    assert rec["unit"] == "MiB/s"
    assert rec["value"] == 90.0
    assert set(rec) == {"node", "metric", "device", "value", "unit", "expectation", "verdict", "reason"}
    json.dumps(doc)  # serialisable as is


def cases(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    return {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}


def test_junit_marks_fail_warn_and_not_run_distinctly():
    root = report_junit.document(fleet())
    c = cases(root)
    assert c[("validate.c", "disk_seq_read_mibs")].find("failure").get("type") == "fail"
    not_run = c[("validate.d", "disk_seq_read_mibs")].find("skipped")
    assert not_run.get("type") == "not_run"
    assert not_run.get("message").startswith("NOT RUN:")
    no_gpu = c[("validate.a", "gpu_bf16_tflops")]
    assert no_gpu.find("skipped") is not None  # a GPU that was not measured never reads as a pass
    assert c[("validate.e", "reachable")].find("error") is not None
    passed = c[("validate.a", "disk_seq_read_mibs")]
    assert passed.find("failure") is None
    assert passed.find("skipped") is None
    assert root.get("failures") == "1"
    assert root.get("errors") == "1"


def test_junit_warning_is_a_failure_unless_warnings_are_allowed():
    results = judge.judge([judge.NodeInput("n", [Measurement("n", "cpu_gemm_peak_fraction", 0.05)])])
    strict = cases(report_junit.document(results))[("validate.n", "cpu_gemm_peak_fraction")]
    assert strict.find("failure").get("type") == "warn"
    lenient = cases(report_junit.document(results, warn_ok=True))[("validate.n", "cpu_gemm_peak_fraction")]
    assert lenient.find("failure") is None
    assert lenient.find("skipped").get("type") == "warn"


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_html_has_one_svg_chart_per_measured_metric_and_nothing_external():
    text = report_html.document(fleet(), "validate test")
    p = _Collect()
    p.feed(text)
    svgs = [a for t, a in p.tags if t == "svg"]
    assert sorted(a["data-metric"] for a in svgs) == ["disk_seq_read_mibs", "ram_triad_gbs"]
    bars = [a for t, a in p.tags if t == "rect" and "bar" in a.get("class", "")]
    assert {a["class"] for a in bars} >= {"bar pass", "bar fail", "bar not_run"}
    assert any(t == "rect" and a.get("class") == "band" for t, a in p.tags)
    assert not any(t in ("script", "link", "img") for t, _ in p.tags)
    assert not re.search(r"(src|href)=\"https?:", text)


def test_html_table_says_why_a_node_failed():
    text = report_html.document(fleet(), "t")
    assert "ssh: connection refused" in text
    assert "below the fleet median" in text


def test_each_gpus_full_nvml_record_reaches_the_json_inventory_and_the_html():
    # The acceptance record keeps what NVML said about every GPU, not only its name.
    from provision.inventory import Node, SshTarget
    from provision.settings import Settings
    from provision.validate import controller, parsers

    gpu = {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_device_id": 0x2330,
        "memory_mib": 81559,
        "driver_version": "580.95.05",
        "cuda_version": "13.0",
        "pcie_gen_current": 5,
        "pcie_gen_max": 5,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
        "ecc_uncorrected": 0,
        "retired_pages": 0,
        "throttle_active": ["sw_power_cap"],
        "persistence_mode": True,
        "bus_id": "00000000:18:00.0",
        "clocks_mhz": {"sm": 1980, "sm_max": 1980},
        "nvlink_up": 18,
    }
    report = agent_stream.AgentReport("g1", "g1", {"cpu": {}}, (parsers.gpu_from_nvml(gpu),), (), ())
    node = Node("g1", SshTarget("192.0.2.1", 22, None, None, None, "yes"), ("gpu_nodes",), Settings())
    record = controller._input(node, controller.AgentRun(report, "", True), controller.Plan()).inventory["gpus"][0]
    assert record["driver_version"] == "580.95.05"
    assert record["memory_mib"] == 81559
    assert record["clocks_mhz"] == {"sm": 1980, "sm_max": 1980}
    assert record["nvlink_up"] == 18
    assert record["persistence_mode"] is True
    assert record["pcie_width_current"] == 16
    json.dumps(record)  # JSON-ready
    (result,) = judge.judge([judge.NodeInput("g1", [], inventory={"gpus": [record]})])
    html = report_html.document([result], "t")
    assert "GPU inventory" in html
    assert "580.95.05" in html
    assert "gen5 x16 / gen5 x16" in html
    assert "sw_power_cap" in html


def _chart(text: str, metric: str) -> list[tuple[str, dict]]:
    """The tags inside one metric's <svg>."""
    p = _Collect()
    p.feed(text)
    start = next(k for k, (t, a) in enumerate(p.tags) if t == "svg" and a.get("data-metric") == metric)
    end = next((k for k in range(start + 1, len(p.tags)) if p.tags[k][0] == "svg"), len(p.tags))
    return p.tags[start:end]


def test_past_bars_max_values_a_chart_is_a_histogram_that_still_shows_one_failing_gpu():
    results = h100_fleet(30)
    text = report_html.document(results, "t")
    tags = _chart(text, "gpu_bf16_tflops")
    assert tags[0][1].get("data-kind") == "histogram"
    assert not [a for t, a in tags if t == "rect" and "bar" in a.get("class", "")]  # no per-GPU bars
    bins = [a for t, a in tags if t == "rect" and a.get("class", "").startswith("bin ")]
    assert 0 < len(bins) <= report_html.BINS * 2
    (fail,) = [a for a in bins if a["class"] == "bin fail"]
    assert float(fail["height"]) >= report_html.MIN_PX  # 1 of 240 values, still visible
    assert any(t == "line" and a.get("class") == "expect" for t, a in tags)  # the H100 datasheet floor
    # The values that did not pass are named under the chart.
    assert re.search(r"240 values: 1 fail, 239 pass\. node07/gpu3 fail 450\.0<", text)


def test_a_small_fleet_keeps_a_bar_per_value_and_no_folds():
    text = report_html.document(fleet(), "t")
    assert "data-kind" not in text
    assert "<details>" not in text


def test_a_large_report_opens_on_the_summary_and_the_nodes_needing_attention():
    results = h100_fleet(30)
    text = report_html.document(results, "t")
    summary = text.index('class="summary"')
    assert "30 nodes: 1 fail, 29 pass." in text
    attention = text.index("Needs attention (1)")
    # The attention table holds the failing node and no passing one.
    attention_table = text[attention : text.index("</table>", attention)]
    assert "node07" in attention_table
    assert "node08" not in attention_table
    # The per-node tables are folded behind it, not laid out until opened.
    every = text.index("<details><summary><b>Every node (30)</b>")
    inventory = text.index("<details><summary><b>GPU inventory</b>")
    assert summary < attention < every < inventory
    assert text.index('<div class="charts">') < inventory


def test_the_attention_table_lists_the_worst_first():
    text = report_html.document(fleet(), "t")
    attention = text[text.index("Needs attention") :]
    rows = re.findall(r"<tr><td>([a-e])</td><td class=\"v-(\w+)\"", attention[: attention.index("</table>")])
    verdicts = [v for _, v in rows]
    assert verdicts == sorted(verdicts, key=("fail", "warn", "not_run", "pass").index)
    assert {n for n, _ in rows} == {r.node for r in fleet() if r.verdict != "pass"}
