"""The host lock's answers (up/host_lock.py): the script's first line read as taken, held
by another run (named), held by this same run under another name, or broken."""

from __future__ import annotations

from provision.up import host_lock


def test_the_first_line_says_taken_held_by_another_run_ours_or_broken():
    ours = "0123abcd"
    assert host_lock.refusal(host_lock.OK_LINE, ours) is None
    other = (
        f"{host_lock.HELD_LINE} provision up of /inv/a.py from ctl (pid 7, started 2026-12-03 10:00:00 UTC) [run ffff]"
    )
    assert host_lock.refusal(other, ours) == (
        "another run holds this host: provision up of /inv/a.py from ctl (pid 7, started 2026-12-03 10:00:00 UTC) "
        "[run ffff]"
    )
    assert host_lock.refusal(f"{host_lock.HELD_LINE} provision up of /x [run {ours}]", ours) is None
    assert host_lock.refusal(host_lock.HELD_LINE, ours) == (
        "another run holds this host: a run that has not said who it is yet"
    )
    assert host_lock.refusal("", ours) == "could not take the host's lock: no answer"
    assert host_lock.refusal("/run/provision is not root's own (mode 700)", ours) == (
        "could not take the host's lock: /run/provision is not root's own (mode 700)"
    )


def test_the_script_takes_the_lock_without_waiting_and_holds_it_on_stdin():
    script = host_lock.lock_script("someone", "0123abcd")
    assert "flock -n 9" in script  # a held lock is said at once, never waited for
    assert script.endswith("exec cat >/dev/null")  # held until the session's stdin ends
    assert f"exit {host_lock.HELD}" in script
