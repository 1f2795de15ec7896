"""The demo runs a real child process, shows it and logs it."""

from __future__ import annotations


def test_a_real_child_is_shown_and_logged(tmp_path, capfd):
    from provision.demo.stages import last_line, run_provision

    log = tmp_path / "logs" / "version.log"
    assert run_provision(["--help"], log) == 0
    assert "provision" in capfd.readouterr().out
    assert "Usage" in log.read_text()
    assert last_line(log)
