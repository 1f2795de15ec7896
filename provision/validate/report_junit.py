"""JUnit XML for CI systems: one testsuite per node, one testcase per node and metric.

- fail -> ``<failure type="fail">``;
- warn -> ``<failure type="warn">`` (the run exits 1 on warnings), or ``<skipped
  type="warn">`` when warnings are allowed (--warn-ok), so CI and the exit code agree;
- not run -> ``<skipped type="not_run" message="NOT RUN: ...">``: never a bare pass;
- an unreachable node -> one ``<error>`` testcase.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from provision.validate.records import Finding, NodeResult


def _case_name(f: Finding) -> str:
    return f"{f.metric}[{f.device}]" if f.device else f.metric


def _value(f: Finding) -> str:
    if f.value is None:
        return "not run"
    exp = f" (expect {f.expectation:.4g})" if f.expectation is not None else ""
    return f"{f.value:.4g} {f.unit}{exp}"


def _testcase(suite: ET.Element, f: Finding, warn_ok: bool) -> tuple[int, int]:
    """Add one testcase; returns (failures, skipped) it counts for."""
    case = ET.SubElement(suite, "testcase", classname=f"validate.{f.node}", name=_case_name(f))
    message = f"{_value(f)}: {f.reason}"
    if f.verdict == "fail":
        ET.SubElement(case, "failure", type="fail", message=f"FAIL: {message}").text = message
        return 1, 0
    if f.verdict == "warn":
        tag = "skipped" if warn_ok else "failure"
        ET.SubElement(case, tag, type="warn", message=f"WARN: {message}").text = message
        return (0, 1) if warn_ok else (1, 0)
    if f.verdict == "not_run":
        ET.SubElement(case, "skipped", type="not_run", message=f"NOT RUN: {f.reason}")
        return 0, 1
    ET.SubElement(case, "system-out").text = message
    return 0, 0


def document(results: list[NodeResult], warn_ok: bool = False) -> ET.Element:
    root = ET.Element("testsuites", name="provision validate")
    totals = [0, 0, 0, 0]  # tests, failures, errors, skipped
    for r in results:
        suite = ET.SubElement(root, "testsuite", name=f"validate.{r.node}")
        failures = skipped = errors = 0
        for f in r.findings:
            fa, sk = _testcase(suite, f, warn_ok)
            failures, skipped = failures + fa, skipped + sk
        for e in r.errors:
            case = ET.SubElement(suite, "testcase", classname=f"validate.{r.node}", name="reachable")
            ET.SubElement(case, "error", type="error", message=e).text = e
            errors += 1
        tests = len(r.findings) + len(r.errors)
        suite.attrib.update(tests=str(tests), failures=str(failures), errors=str(errors), skipped=str(skipped))
        for k, v in enumerate((tests, failures, errors, skipped)):
            totals[k] += v
    root.attrib.update(tests=str(totals[0]), failures=str(totals[1]), errors=str(totals[2]), skipped=str(totals[3]))
    return root


def write(path: str | Path, results: list[NodeResult], warn_ok: bool = False) -> None:
    tree = ET.ElementTree(document(results, warn_ok))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
