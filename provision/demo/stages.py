"""`provision demo`: the whole pipeline against the local testbed, as a newcomer meets it.

Each stage is the real `provision` command a user would type, run as a child process, so
the demo exercises exactly what the README documents and shows each command's own
progress display. The demo only orders the stages, remembers which finished, and sums up.

Resuming: the stages that finished are recorded in ``runs/demo/state.json`` together with
the identity of the testbed they ran on. Running the demo again skips them, as long as it
is the same testbed; a new testbed starts the pipeline over.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provision.errors import EXIT_FAILED, EXIT_OK
from provision.state import write_atomic


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps its state and what it produces."""

    root: Path  # runs/demo under the working directory
    inventory: Path  # the inventory `provision testbed up` writes

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, stage: str) -> Path:
        return self.logs / f"{stage}.log"

    @property
    def restore_target(self) -> Path:
        return Path("/tmp/provision-demo-restore")  # on the storage node, not here


@dataclass(frozen=True)
class Stage:
    """One step of the demo: a provision command line and what it leaves behind."""

    name: str  # short name shown in the summary
    what: str  # one line for people
    argv: list[str]  # arguments after `provision`
    artifacts: list[str] = field(default_factory=list)  # paths worth opening afterwards


@dataclass
class StageResult:
    """How a stage went in this run (or an earlier one, when resumed)."""

    name: str  # the stage's name
    status: str  # "done", "done earlier", "failed", "not run"
    seconds: float  # wall time in this run; 0 when skipped
    exit_code: int | None = None  # the command's exit code when it ran
    artifacts: list[str] = field(default_factory=list)  # paths to reports and logs
    outcome: str = ""  # the command's own last line (its summary), when it ran


def stages(paths: DemoPaths, nodes: int) -> list[Stage]:
    """The pipeline, in order. The testbed stage is handled separately (it always runs)."""
    inv, rep = str(paths.inventory), paths.reports
    return [
        Stage("up", "provision every node (NVIDIA skipped: the VMs have no GPU)", ["up", inv]),
        Stage(
            "verify",
            "check the promised state with testinfra",
            ["verify", inv, "--workdir", str(paths.root / "verify")],
            [str(paths.root / "verify" / "verify.xml")],
        ),
        # Emulated VMs reach a fraction of their CPU's ISA peak, which validate rightly
        # reports as a warning; the demo accepts warnings (the report shows them) but not fails.
        Stage(
            "validate",
            "quick acceptance gate, with JSON, HTML and JUnit reports",
            [
                "validate",
                inv,
                "--quick",
                "--warn-ok",
                "--json",
                str(rep / "validate.json"),
                "--html",
                str(rep / "validate.html"),
                "--junit",
                str(rep / "validate.xml"),
            ],
            [str(rep / "validate.html"), str(rep / "validate.json"), str(rep / "validate.xml")],
        ),
        Stage(
            "monitor",
            "the fleet from Prometheus on the head (the monitoring step), once",
            ["monitor", inv, "--once"],
        ),
        Stage(
            "train",
            f"the reference DDP trainer across {nodes} nodes, checkpoints on NFS",
            ["train", inv, "--steps", "40"],
            ["runs/ (per-run logs and plots)"],
        ),
        Stage("backup", "back up the checkpoints now", ["backup", "run", inv]),
        Stage("restore", "restore the latest snapshot and compare checksums", ["backup", "restore", inv, "--check"]),
    ]


def testbed_identity(inventory: Path) -> str:
    """Changes whenever a new testbed is brought up (new ports, keys, pids)."""
    if not inventory.is_file():
        return ""
    return hashlib.sha256(inventory.read_bytes()).hexdigest()[:16]


def load_done(paths: DemoPaths, identity: str) -> dict[str, float]:
    """Stages finished earlier on this same testbed: name -> seconds they took."""
    if not paths.state.is_file():
        return {}
    try:
        state = json.loads(paths.state.read_text())
    except json.JSONDecodeError:
        return {}  # a torn write from an interrupted run: start over, nothing is lost
    return state.get("done", {}) if state.get("testbed") == identity else {}


def save_done(paths: DemoPaths, identity: str, done: dict[str, float]) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.state, json.dumps({"testbed": identity, "done": done}, indent=2))


Runner = Callable[[list[str], Path], int]  # (argv, log file) -> exit code


def run_provision(argv: list[str], log: Path) -> int:
    """Run one provision command as a child process and show its output live, as a user
    typing it would see it; a copy goes to ``log`` (the summary's last line comes from it).

    On a terminal the child gets a pseudo-terminal of its own, so its rich progress display
    stays live while being copied; elsewhere (CI, a pipe) its output is copied line by line.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "provision", *argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as copy:
        if sys.stdout.isatty():
            import pty

            def tee(fd: int) -> bytes:
                data = os.read(fd, 65536)
                copy.write(data)
                return data

            status = pty.spawn(command, tee)
            return os.waitstatus_to_exitcode(status)
        # Not a terminal: rich would wrap at 80 columns, splitting the summary line the
        # final table quotes; a wide virtual terminal keeps each line whole.
        process = subprocess.Popen(
            command, env={**env, "COLUMNS": env.get("COLUMNS", "200")}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            copy.write(line)
        return process.wait()


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\r")
_BORDER = set("─━┄┈╌═└┘┌┐├┤┬┴┼╭╮╰╯┏┓┗┛┡┩╇┳┻╋┃-= ")


def last_line(log: Path) -> str:
    """What a command said last, without colours: its last line of text, or when it ended
    with a table (most commands end with their summary table), that table's rows."""
    if not log.is_file():
        return ""
    text = _ANSI.sub("", log.read_bytes().decode(errors="replace"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rows: list[str] = []
    for line in reversed(lines):
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells and cells[0]:  # a row's first line; continuation lines have no key
                rows.append(" ".join(c for c in cells if c))
        elif set(line) <= _BORDER:
            if rows and line[0] in "┡╇┏┃":  # the header's rule: the table's rows are all read
                break
            continue
        else:
            return (line if not rows else "; ".join(reversed(rows)))[:160]
    return "; ".join(reversed(rows))[:160]


def run_demo(
    paths: DemoPaths,
    nodes: int,
    announce: Callable[[Stage, str], None],
    run: Runner = run_provision,
) -> tuple[list[StageResult], int]:
    """Bring the testbed up, then run every stage not yet done on it. Stops at the first
    failed stage (the later ones need it); the next demo run starts again there."""
    paths.reports.mkdir(parents=True, exist_ok=True)
    testbed = Stage(
        "testbed",
        f"{nodes} qemu VMs, 2 data disks each, node1 is storage",
        ["testbed", "up", "--nodes", str(nodes), "--disks", "2", "--inventory", str(paths.inventory)],
        [str(paths.inventory)],
    )
    results = [_run_stage(testbed, paths, announce, run)]
    if results[0].status == "failed":
        return results + _not_run(stages(paths, nodes)), EXIT_FAILED
    identity = testbed_identity(paths.inventory)
    done = load_done(paths, identity)
    pipeline = stages(paths, nodes)
    for index, stage in enumerate(pipeline):
        if stage.name in done:
            announce(stage, "done earlier, skipped")
            log = paths.log(stage.name)
            results.append(
                StageResult(stage.name, "done earlier", 0.0, None, [*stage.artifacts, str(log)], last_line(log))
            )
            continue
        result = _run_stage(stage, paths, announce, run)
        results.append(result)
        if result.status == "failed":
            return results + _not_run(pipeline[index + 1 :]), EXIT_FAILED
        done[stage.name] = result.seconds
        save_done(paths, identity, done)
    return results, EXIT_OK


def _run_stage(stage: Stage, paths: DemoPaths, announce: Callable[[Stage, str], None], run: Runner) -> StageResult:
    announce(stage, "starting")
    log = paths.log(stage.name)
    start = time.monotonic()
    code = run(stage.argv, log)
    seconds = time.monotonic() - start
    status = "done" if code == 0 else "failed"
    announce(stage, f"{status} in {seconds:.0f}s" + ("" if code == 0 else f" (exit code {code})"))
    return StageResult(stage.name, status, seconds, code, [*stage.artifacts, str(log)], last_line(log))


def _not_run(rest: list[Stage]) -> list[StageResult]:
    return [StageResult(s.name, "not run", 0.0, None, []) for s in rest]


def as_json(results: list[StageResult]) -> dict[str, object]:
    return {
        "schema": "provision.demo.stages/1",
        "stages": [asdict(r) for r in results],
        "ok": all(r.status in ("done", "done earlier") for r in results),
    }
