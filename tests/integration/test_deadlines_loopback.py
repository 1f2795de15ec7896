"""Deadlines on `up` and `plan` against a real sshd on loopback: one host whose commands
hang is stopped at its deadline and named; the other host finishes and is reported in full.

Both hosts are the same sshd ("local" as 127.0.0.1, "hung" as localhost); host data's _env
makes the stand-in step's command hang on "hung" only.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import loopback_sshd
from tests.integration.test_facts_loopback import write_inventory

HANG = 'if [ -n "$PROVISION_TEST_HANG" ]; then sleep 120; fi; echo fine'


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def _inventory(sshd, tmp_path, **deadlines):
    """Hosts "local" and "hung" on the same sshd, with these deadline knobs; "local" keeps a
    step deadline a loaded machine cannot miss, since it must finish in full."""
    known = tmp_path / "known_hosts"
    lines = sshd.known_hosts.read_text()
    known.write_text(lines + lines.replace("127.0.0.1", "localhost"))
    local = {**sshd.host_data(), **deadlines, "step_timeout_s": max(deadlines.get("step_timeout_s", 0), 300)}
    hung = dict(
        sshd.host_data(),
        ssh_hostname="localhost",
        ssh_known_hosts_file=str(known),
        cluster_address="127.0.0.2",
        _env={"PROVISION_TEST_HANG": "1"},
        **deadlines,
    )
    return write_inventory(tmp_path / "inv.py", [("local", local), ("hung", hung)])


def _stand_in_step(name: str, in_fact: bool):
    """A step whose operation (or, with in_fact, a fact read while preparing it) hangs on
    the host told to, and changes something on the others."""
    from pyinfra.api import FactBase, deploy
    from pyinfra.operations import server

    from provision import engine

    class TestStandInHangingFact(FactBase):
        def command(self) -> str:
            return HANG

        def process(self, output):
            return output[0]

    @deploy("Stand-in")
    def stand_in() -> None:
        from pyinfra import host

        if in_fact:
            host.get_fact(TestStandInHangingFact)
        server.shell(name="stand-in command", commands=[HANG])

    return engine.Step(name, stand_in, "a step that hangs on one host")


@pytest.mark.parametrize("in_fact", [False, True], ids=["operation", "fact"])
def test_up_stops_a_hung_host_at_its_step_deadline_and_reports_the_other_in_full(sshd, tmp_path, in_fact):
    from provision import engine, inventory

    cluster = inventory.load(_inventory(sshd, tmp_path, step_timeout_s=4))
    start = time.monotonic()
    report = engine.run_steps(cluster, [_stand_in_step("standin", in_fact)])
    took = time.monotonic() - start
    assert took < 4 + 20, f"the run took {took:.0f} s past a 4 s deadline"
    hung, local = report.hosts["hung"], report.hosts["local"]
    assert [str(f) for f in hung.failures] == ["timed out in standin after 4 s"]
    assert isinstance(hung.failures[0], engine.TimedOut)
    assert local.ok
    assert local.steps == ["standin"]
    assert local.changed_by_step == {"standin": 1}
    assert report.exit_code == 1


def test_a_command_past_its_own_deadline_fails_the_host_and_not_the_run(sshd, tmp_path):
    from provision import engine, inventory

    cluster = inventory.load(_inventory(sshd, tmp_path, command_timeout_s=3, step_timeout_s=600))
    start = time.monotonic()
    report = engine.run_steps(cluster, [_stand_in_step("standin", in_fact=False)])
    assert time.monotonic() - start < 3 + 20
    assert report.hosts["local"].ok
    assert not report.hosts["hung"].ok
    assert report.hosts["hung"].failures[0].step == "standin"


def test_a_fact_past_its_command_deadline_fails_the_host_with_the_fact_named_in_up_and_plan(sshd, tmp_path):
    # pyinfra answers a fact stopped at its _timeout with the fact's default and drops the
    # host quietly; the host must be reported with the fact, never "done, 0 changed".
    from provision import engine, inventory

    cluster = inventory.load(_inventory(sshd, tmp_path, command_timeout_s=3, step_timeout_s=600))
    report = engine.run_steps(cluster, [_stand_in_step("standin", in_fact=True)])
    assert [str(f) for f in report.hosts["hung"].failures] == [
        "standin: timed out in fact TestStandInHangingFact after 3 s"
    ]
    assert report.hosts["hung"].steps == []
    assert report.hosts["local"].steps == ["standin"]
    plans = engine.plan_steps(cluster, [_stand_in_step("standin", in_fact=True)])
    assert plans["hung"].refused == ["standin: timed out in fact TestStandInHangingFact after 3 s"]
    assert "standin" not in plans["hung"].steps
    assert plans["local"].refused == []


def test_plan_stops_a_host_whose_facts_hang_and_plans_the_other(sshd, tmp_path):
    from provision import engine, inventory

    cluster = inventory.load(_inventory(sshd, tmp_path, step_timeout_s=4))
    start = time.monotonic()
    plans = engine.plan_steps(cluster, [_stand_in_step("standin", in_fact=True)])
    assert time.monotonic() - start < 4 + 20
    assert plans["hung"].refused == ["timed out in standin after 4 s"]
    assert [op.name for op in plans["local"].steps["standin"]] == ["Stand-in | stand-in command"]


def test_up_off_a_terminal_logs_a_line_per_host_and_step_event(sshd, tmp_path, monkeypatch):
    # As under CI or nohup: stderr is a pipe. Preflight on this machine either passes or
    # stops the host; either way its start and its end each get a line.
    import re
    import subprocess
    import sys

    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    inv = write_inventory(tmp_path / "inv.py", [("local", sshd.host_data())])
    done = subprocess.run(
        [sys.executable, "-m", "provision", "up", str(inv), "--only", "preflight"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    events = [line for line in done.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d local: ", line)]
    assert events[0].endswith("local: preflight: started"), done.stderr
    assert re.search(r"local: preflight: (done, \d+ changed|FAILED)$", events[-1]), done.stderr
    assert len(events) <= 3, "one line per step event, not per operation"


def _hung_shell(tmp_path):
    """A shell for pyinfra (its _shell_executable) that never answers: every command of a
    host given it hangs, as on a host whose disk is wedged."""
    shell = tmp_path / "hung-sh"
    shell.write_text("#!/bin/sh\nsleep 120\n")
    shell.chmod(0o755)
    return str(shell)


class _Stderr:
    """A process's stderr, read line by line by a thread. (select() on the pipe under a
    buffered readline() misses a second line that arrived in the same read as the first:
    it sits in Python's buffer while select waits on the fd. That once looked like a
    progress line the CLI never printed.)"""

    def __init__(self, process) -> None:
        import queue
        import threading

        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def pump() -> None:
            for line in process.stderr:
                self.lines.put(line)
            self.lines.put(None)  # end of the stream

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()
        # stdout drained too: a full pipe would hold the CLI at exit.
        self.stdout: list[str] = []
        threading.Thread(target=lambda: self.stdout.extend(process.stdout), daemon=True).start()

    def wait_for(self, text: str, within_s: float) -> None:
        import queue

        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} on stderr within {within_s} s: {''.join(self.seen)[-2000:]}")

    def all(self, within_s: float) -> str:
        """Everything, once the stream ends."""
        self.thread.join(timeout=within_s)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


def _provision_up(inv, tmp_path, as_json: bool = True):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PROVISION_STATE_DIR=str(tmp_path / "state"))
    command = [sys.executable, "-m", "provision", "up", str(inv), "--only", "preflight"]
    command += ["--json"] if as_json else []
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=foreground_sigint,
    )


def foreground_sigint() -> None:
    """SIGINT as a command typed at a terminal gets it. A suite started in the background
    (`.ci/run &`, setsid) hands its children SIGINT ignored, and a process started so never
    sees Ctrl-C at all: the Ctrl-C test then waited 120 s for nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_up_names_the_hung_host_reports_the_other_in_full_and_exits_1(sshd, tmp_path):
    import json

    inv = _inventory(sshd, tmp_path, step_timeout_s=5)
    text = inv.read_text().replace(
        "'_env': {'PROVISION_TEST_HANG': '1'}", f"'_shell_executable': {_hung_shell(tmp_path)!r}"
    )
    inv.write_text(text)
    start = time.monotonic()
    process = _provision_up(inv, tmp_path)
    out, err = process.communicate(timeout=120)
    assert time.monotonic() - start < 5 + 30
    assert process.returncode == 1, err
    hosts = {h["name"]: h for h in json.loads(out)["hosts"]}
    assert hosts["hung"]["failures"] == ["timed out in preflight after 5 s"]
    assert hosts["local"]["steps"] == ["preflight"]


def test_ctrl_c_names_the_hosts_mid_step_and_exits_130_without_a_traceback(sshd, tmp_path):
    import signal
    import subprocess

    inv = _inventory(sshd, tmp_path, step_timeout_s=600)
    text = inv.read_text().replace(
        "'_env': {'PROVISION_TEST_HANG': '1'}", f"'_shell_executable': {_hung_shell(tmp_path)!r}"
    )
    inv.write_text(text)
    process = _provision_up(inv, tmp_path, as_json=False)  # progress lines on stderr
    # Ctrl-C once the hung host's own progress line says its preflight started (the CLI's
    # handler is in place; on a loaded machine the imports alone can outlast a fixed
    # sleep), then a moment for it to wait on its first fact.
    stderr = _Stderr(process)
    stderr.wait_for("hung: preflight: started", within_s=120)
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    try:
        # Stopping waits for the hung host's disconnect (at most 30 s); the rest is margin
        # for a loaded machine.
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"still running 120 s after Ctrl-C; stderr: {stderr.all(within_s=5)[-3000:]}") from None
    err = stderr.all(within_s=10)
    assert process.returncode == 130, err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted; hosts mid-step: ")]
    assert "hung (preflight: started)" in line
    assert "Traceback" not in err
