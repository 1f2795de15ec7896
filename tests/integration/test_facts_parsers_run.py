"""Fact commands run for real against a synthetic sysfs tree."""

from __future__ import annotations

from provision.facts.gpus import (
    parse_sysfs_pci,
    sysfs_pci_command,
)
from tests.unit.test_facts_parsers import make_synthetic_sysfs


def test_sysfs_command_and_parser_on_a_synthetic_tree_with_a_gpu_and_an_nvswitch(tmp_path):
    import subprocess

    synthetic = tmp_path / "synthetic-sysfs-pci-devices"
    make_synthetic_sysfs(synthetic)
    out = subprocess.run(
        ["sh", "-c", sysfs_pci_command(str(synthetic))], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    devices = parse_sysfs_pci(out)
    assert [(d.slot, d.class_id, d.device_id, d.is_gpu, d.is_nvswitch) for d in devices] == [
        ("0000:05:00.0", "0680", "22a3", False, True),
        ("0000:18:00.0", "0302", "2330", True, False),
    ]
