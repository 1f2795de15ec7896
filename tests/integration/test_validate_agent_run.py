"""The validator agent's nvidia-smi handling with a real child process."""

from __future__ import annotations

from provision.validate import agent


def test_nvidia_smi_output_that_is_not_xml_is_not_taken_for_a_report(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 565.57.01\n")  # test stand-in: prints a version, exits 0
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert agent._nvidia_smi_xml() == ""
