"""DCGM's fields in provision's names (provision.rules.dcgm): the exporter collects
every field the recording rules read, and the rules cover the NVML collector's series."""

from __future__ import annotations

import json

from provision.monitoring import gpu_collector
from provision.rules import dcgm


def _fields(csv: str) -> list[str]:
    return [line.split(",")[0].strip() for line in csv.splitlines() if line and not line.startswith("#")]


def test_the_exporter_collects_every_field_the_rules_read() -> None:
    collected = _fields(dcgm.counters_csv())
    assert dcgm.fields_read() <= set(collected)
    assert len(collected) == len(set(collected))
    for line in dcgm.counters_csv().splitlines()[1:]:
        _name, kind, help_text = (part.strip() for part in line.split(",", 2))
        assert kind in ("gauge", "counter"), line
        assert help_text
        assert "\n" not in help_text


def test_every_nvml_series_but_xid_has_a_dcgm_record() -> None:
    nvml = set(gpu_collector.HELP) - {"provision_gpu_xid_events"}  # DCGM has the last Xid only
    assert nvml <= set(dcgm.RECORDS)


def test_the_rule_file_records_each_series_once_with_a_uuid_label() -> None:
    text = dcgm.recording_rules()
    (group,) = json.loads(text.split("\n", 1)[1])["groups"]
    records = [r["record"] for r in group["rules"]]
    assert len(records) == len(set(records))
    assert "provision_gpu_nvml_up" in records
    for rule in group["rules"]:
        if rule["record"] != "provision_gpu_nvml_up":
            assert rule["expr"].startswith("label_replace(")
            assert '"uuid", "$1", "UUID"' in rule["expr"]
