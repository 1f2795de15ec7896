"""A job's life on the nodes over SSH: every node prepared (the first one first, so a
shared workdir and env are made once), ``run`` started everywhere, each node's lines
streamed and saved, the whole job torn down on the first failing node or Ctrl-C (by the
recorded process group and the run's markers, never by name), and every node checked
clean. Through Slurm, the same job is one ``salloc`` on a node that submits it
(``jobs.slurm``): Slurm starts and ends it, and ``scancel`` tears it down."""

from __future__ import annotations

import queue
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.jobs import layout, slurm
from provision.jobs.layout import JobPlan, NodeJob
from provision.launch import logs
from provision.launch.session import TEARDOWN_TIMEOUT_S, reaper_json, shielded_from_ctrl_c, stop_signals

LAST_LINES = 20  # a failing node's lines named in the report
PREPARE_TIMEOUT_S = 3 * 3600  # a pip install of a large requirements file, on every node

OnLine = Callable[[str, str, str], None]  # (node, who: "setup"/"run"/"rankN", text)


@dataclass
class NodeEnd:
    """How one node's part ended."""

    exited: int  # exit status; -1: the SSH command did not finish
    reason: str = ""  # why, when it did not run to its end
    last: list[str] = field(default_factory=list)  # its last lines


@dataclass
class Ran:
    """What the nodes did."""

    ends: dict[str, NodeEnd] = field(default_factory=dict)
    failure: str | None = None  # the first failure, for people
    failed_node: str | None = None
    teardown: dict[str, dict[str, Any]] = field(default_factory=dict)  # per node: the reaper's JSON
    first_line_at: float | None = None  # monotonic: the first line of `run` from any node
    slurm_job: str | None = None


class _Sink(logs.LineSink):
    """A node's lines: into its log here, to the console, and its last ones kept."""

    def __init__(self, host: str, log: Any, on_line: OnLine, who: str, ran: Ran):
        self.last: deque[str] = deque(maxlen=LAST_LINES)
        self._ran, self._who = ran, who

        def line(host: str, who: str, text: str) -> None:
            self.last.append(text)
            if self._who == "run" and self._ran.first_line_at is None and not text.startswith(layout.MARK):
                self._ran.first_line_at = time.monotonic()
            on_line(host, self._who if who == "node" else who, text)

        super().__init__(host, log, line, unprefixed="node")


def _stream(conn: Any, host: str, command: str, sink: _Sink, timeout: float | None = None) -> NodeEnd:
    try:
        result = conn.run(
            command, hide=True, warn=True, pty=False, in_stream=False, out_stream=sink, err_stream=sink, timeout=timeout
        )
        exited = result.exited if result.exited is not None else -1
        end = NodeEnd(exited, "" if exited != -1 else "SSH connection lost")
    except Exception as e:  # the connection died under the command, or its deadline passed
        end = NodeEnd(-1, f"{type(e).__name__}: {e}")
    finally:
        sink.close()
    end.last = list(sink.last)
    return end


def prepare(
    p: JobPlan, nodes: dict[str, Node], conns: dict[str, Any], out_dir: Path, on_line: OnLine, ran: Ran, record: str
) -> bool:
    """Every node prepared: the first alone (it unpacks a shared workdir and builds a shared
    env once), then the others together. False, with the failure said, when one failed."""
    first, rest = p.nodes[0], p.nodes[1:]

    def one(job: NodeJob, is_first: bool) -> NodeEnd:
        # On a share the first node unpacks the workdir and builds the env for all.
        alone = is_first or not p.where.shared
        script = layout.prepare_script(p, job, extract=alone, build_env=alone, record=record if is_first else "")
        with logs.open_log(out_dir, job.name, append=True) as log:
            sink = _Sink(job.name, log, on_line, "setup", ran)
            return _stream(conns[job.name], job.name, layout.launcher(p, job, script), sink, PREPARE_TIMEOUT_S)

    try:
        ends = {first.name: one(first, True)}
        if ends[first.name].exited == 0 and rest:
            ends |= remote.on_all([nodes[j.name] for j in rest], lambda n: one(_job(p, n.name), False))
    except KeyboardInterrupt:  # a pip install or setup left running on a node would go on alone
        ran.failure = "interrupted (Ctrl-C) while preparing"
        teardown(p, nodes, conns, ran)
        return False
    ran.ends.update(ends)
    failed = [name for name, e in ends.items() if e.exited != 0]
    if failed:
        ran.failed_node = failed[0]
        e = ends[failed[0]]
        ran.failure = f"{failed[0]}: preparing the job failed (exit {e.exited}{'; ' + e.reason if e.reason else ''})"
        return False
    return True


def run_ssh(
    p: JobPlan,
    nodes: dict[str, Node],
    conns: dict[str, Any],
    out_dir: Path,
    on_line: OnLine,
    ran: Ran,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> None:
    """``run`` on every node together; the first node that fails, or Ctrl-C, or the time
    limit, stops the job on all of them."""
    ended: queue.Queue[tuple[str, NodeEnd]] = queue.Queue()

    def stream(job: NodeJob) -> None:
        try:
            with logs.open_log(out_dir, job.name, append=True) as log:
                sink = _Sink(job.name, log, on_line, "run", ran)
                command = layout.launcher(p, job, layout.run_script(p, job))
                ended.put((job.name, _stream(conns[job.name], job.name, command, sink)))
        except Exception as e:  # the log cannot be written: the node's part counts as failed
            ended.put((job.name, NodeEnd(-1, f"{type(e).__name__}: {e}")))

    threads = [threading.Thread(target=stream, args=(j,), daemon=True) for j in p.nodes]
    for t in threads:
        t.start()
    _watch(p, ran, ended, timeout_s, stop)
    if ran.failure is not None:
        teardown(p, nodes, conns, ran)
    for t in threads:
        t.join(timeout=30)
    while not ended.empty():
        name, end = ended.get()
        ran.ends.setdefault(name, end)


def _watch(
    p: JobPlan,
    ran: Ran,
    ended: queue.Queue[tuple[str, NodeEnd]],
    timeout_s: float | None,
    asked: threading.Event | None,
) -> None:
    """Until every node ended, or the first failure, Ctrl-C, the caller's stop or the time limit."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with stop_signals() as stop:
        while len(ran.ends) < len(p.nodes) and ran.failure is None:
            if stop.why:
                ran.failure = stop.why
            elif asked is not None and asked.is_set():
                ran.failure = "stopped by its caller"
            elif deadline is not None and time.monotonic() > deadline:
                ran.failure = f"the time limit ({timeout_s:.0f} s) passed"
            else:
                try:
                    _record(ran, *ended.get(timeout=0.2))
                except queue.Empty:
                    continue


def _record(ran: Ran, name: str, end: NodeEnd) -> None:
    ran.ends[name] = end
    if end.exited != 0 and ran.failure is None:
        ran.failed_node = name
        why = end.reason or f"exit {end.exited}"
        ran.failure = f"{name}: run failed ({why})"


def teardown(p: JobPlan, nodes: dict[str, Node], conns: dict[str, Any], ran: Ran, check: bool = False) -> None:
    """The job's processes stopped on every node (the reaper: the recorded group and what
    carries the run's markers), or with ``check`` only looked for."""

    def reap(node: Node) -> dict[str, Any]:
        job = _job(p, node.name)
        argv = [p.base_python, "-I", f"{job.run_dir}/reaper.py", job.run_dir, p.run_id, node.name]
        # As the SSH user, who started the job (root, or the non-root SSH user the job runs as).
        command = shlex.join([*argv, *(["--check"] if check else [])])
        r = remote.run_beside(conns[node.name], node.name, command, timeout=TEARDOWN_TIMEOUT_S)
        if r.exited == -1:  # the job's connection is gone: a fresh one
            r = remote.run(node, command, timeout=TEARDOWN_TIMEOUT_S)
        return reaper_json(r)

    with shielded_from_ctrl_c():
        ran.teardown = remote.on_all([nodes[j.name] for j in p.nodes], reap)


def run_slurm(
    p: JobPlan,
    submit: Node,
    conn: Any,
    addresses: dict[str, str],
    out_dir: Path,
    on_line: OnLine,
    ran: Ran,
    user: str | None,
    asked: threading.Event | None = None,
) -> None:
    """The job as one allocation: salloc on ``submit`` streams every node's lines (by srun's
    task labels, named from the script's node list); Ctrl-C or a lost connection cancels it."""
    names: list[str] = []
    sinks: dict[str, _Sink] = {}

    def line(host: str, who: str, text: str) -> None:
        found = slurm.nodes_of(text)
        if found is not None:
            names[:] = found
            on_line(host, "slurm", f"allocated {', '.join(found)}")
            return
        labelled = slurm.split_label(text)
        if labelled is None or labelled[0] >= len(names):
            on_line(host, "slurm", text)
            return
        node = names[labelled[0]]
        if node not in sinks:
            sinks[node] = _Sink(node, logs.open_log(out_dir, node, append=True), on_line, "run", ran)
        sinks[node].write(labelled[1] + "\n")

    with logs.open_log(out_dir, "slurm", append=True) as log:
        outer = logs.LineSink(submit.name, log, line, unprefixed="slurm")
        worker = threading.Thread(
            target=lambda: ran.ends.setdefault("slurm", _raw(conn, slurm.attached_command(p, user, addresses), outer)),
            daemon=True,
        )
        worker.start()
        with stop_signals() as stop:
            while worker.is_alive() and not stop.why and not (asked is not None and asked.is_set()):
                worker.join(timeout=0.2)
            if stop.why or (asked is not None and asked.is_set()):
                ran.failure = stop.why or "stopped by its caller"
                with shielded_from_ctrl_c():
                    remote.run(submit, slurm.cancel_command(p.run_id, user), timeout=60)
                worker.join(timeout=60)
    for s in sinks.values():
        s.close()


def _raw(conn: Any, command: str, sink: Any) -> NodeEnd:
    try:
        r = conn.run(command, hide=True, warn=True, pty=False, in_stream=False, out_stream=sink, err_stream=sink)
        return NodeEnd(r.exited if r.exited is not None else -1)
    except Exception as e:
        return NodeEnd(-1, f"{type(e).__name__}: {e}")
    finally:
        sink.close()


def _job(p: JobPlan, name: str) -> NodeJob:
    return next(j for j in p.nodes if j.name == name)
