"""One training run across the cluster: prepare every node, start torchrun everywhere,
stream the logs, watch for the first failure, and tear the whole run down.

All SSH goes through ``provision.remote.connection()``: one connection per node carries
the log stream, the monitor's samples and the teardown.
"""

from __future__ import annotations

import contextlib
import queue
import re
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from provision import remote
from provision.inventory import Node
from provision.launch import live, logs, monitor, plan
from provision.resources import training_script

REAPER = Path(__file__).with_name("reaper.py")
REJOIN_POLL_S = 10  # an elastic run asks a lost node this often whether it is back
# An elastic run counts a node lost once it has not answered the monitor this long (or
# four sampling intervals, if longer): a node that lost power or its network sends
# nothing, and TCP alone would take some 15 minutes to give up on its SSH connection.
SILENT_S = 60
JOIN_S = 60  # joining a loss's reaper threads before the end's own check
_STRAGGLER = re.compile(r"^straggler: dropping (\S+): ")  # the trainer's StragglerWatch line
STREAM_JOIN_S = 30  # how long to wait for log streams to end after teardown
TEARDOWN_TIMEOUT_S = 40  # per host: reaper grace (5 s) + SIGKILL wait + SSH slack
# The node check: python started, nvidia-smi -L, a write test on each share (an automount
# mounts it). Each can be slow on a node just booted or overloaded; a hung driver or NFS
# server holds it until this deadline.
PROBE_TIMEOUT_S = 300


class LaunchError(Exception):
    """A node could not be prepared (no python, no interface, upload failed)."""


@dataclass
class Options:
    """What `provision train` was asked to do."""

    steps: int  # optimizer steps
    model: str  # size preset of train_ddp.py
    nproc_per_node: int | None  # None: one per GPU, 1 without GPUs
    batch_per_rank: int  # sequences per rank per step
    resume: bool  # continue from the checkpoint
    extra_args: tuple[str, ...]  # more train_ddp.py flags, after `--`
    python: str | None  # interpreter on every node; default <venv_path>/bin/python
    runs_dir: Path  # controller directory; this run's files go to runs_dir/<run-id>/
    monitor_interval: float  # seconds between node samples
    timeout_s: float | None  # stop the run after this long; None: no limit
    ckpt_name: str  # checkpoint file name on the nodes
    scheduler: str = "ssh"  # ssh: torchrun started over SSH; slurm: one Slurm job (launch.slurm_job)
    requeue: bool = False  # slurm only: the job may be requeued; each start resumes the run's checkpoint
    chosen: bool = False  # the scheduler was --scheduler auto's choice: Slurm may still give way to SSH
    # Import torch on each node before starting (a broken venv is named then, not by a rank).
    # A sweep's later trials on a node that already ran one skip it: on an emulated node the
    # import alone takes tens of seconds, and torchrun imports torch again anyway.
    check_torch: bool = True
    solo: bool = False  # one node, one rank, the trainer alone without torchrun (plan.RunPlan.solo)
    # Elastic (--min-nodes): the run goes on while this many nodes are left, each restart
    # from the newest checkpoint (launch.store, plan.Elastic). None: every node, and the
    # first failure ends the run on all of them.
    min_nodes: int | None = None
    ckpt_every: int = 0  # steps between checkpoints; 0: the trainer's own (at the end only)
    drop_stragglers: float | None = None  # elastic: take out a node this many times slower (StragglerWatch)


@dataclass
class NodeEvent:
    """A node an elastic run went on without (a loss), or took back (an admission)."""

    host: str  # inventory name
    at: float  # controller monotonic clock, when the launcher saw it
    wall: float  # the same moment, unix time
    why: str  # a loss: how its part ended; an admission: "admitted again"


@dataclass
class HostEnd:
    """How one node's torchrun command ended."""

    exited: int  # exit status; -1: the SSH command did not finish (connection lost)
    at: float  # controller monotonic clock
    reason: str  # "" or why it could not run


@dataclass
class Outcome:
    """Everything the report is built from."""

    run_id: str  # the run's id
    plan: plan.RunPlan  # what ran where
    out_dir: Path  # runs/<run-id>
    ends: dict[str, HostEnd] = field(default_factory=dict)  # per host, when it ended
    failure: str | None = None  # first failure, said for people; None when all went well
    failed_host: str | None = None  # host of the first failure
    failed_rank: int | None = None  # rank of the first failure, when torchrun named it
    teardown: dict[str, dict[str, Any]] = field(default_factory=dict[str, Any])  # per host: reaper's JSON
    teardown_s: float | None = None  # failure seen -> every host clean
    curves: logs.Curves = field(default_factory=logs.Curves)  # rank 0's loss and speed
    samples: dict[str, list[monitor.Sample]] = field(default_factory=dict)  # per host
    slurm_job: str | None = None  # the Slurm job id of a --scheduler slurm run
    requeues: int | None = None  # --requeue: times the job was requeued and started again; else None
    losses: list[NodeEvent] = field(default_factory=list)  # an elastic run's lost nodes, in order
    joins: list[NodeEvent] = field(default_factory=list)  # lost nodes admitted again (why: "admitted again")
    rank0_host: str | None = None  # where rank 0's lines came from last (its events are there)


def prepare(
    nodes: list[Node],
    conns: dict[str, Any],
    opts: Options,
    run_id: str,
    say: Callable[[str, str], None],
    nfs_server: bool = False,
) -> plan.RunPlan:
    """Check every node, find its interface and GPU count, upload trainer and reaper.
    With an NFS server in the cluster, checkpoints and the token cache go to its shares
    when every node can write them."""
    first = nodes[0]
    wanted = plan.shares(first.settings, nfs_server, opts.extra_args)
    if opts.solo:  # a sweep's one-rank trial keeps no events (its study keeps its figures)
        wanted = tuple(s for s in wanted if s.flag != "--tensorboard")

    def one(node: Node) -> plan.NodePlan:
        return _prepare_node(node, conns[node.name], opts, run_id, node is first, say, wanted)

    results: dict[str, Any] = {}
    for name, value in remote.on_all(nodes, lambda n: _capture(one, n)).items():
        results[name] = value
    problems = [f"{name}: {v}" for name, v in results.items() if isinstance(v, Exception)]
    if problems:
        raise LaunchError("; ".join(problems))
    node_plans = tuple(results[n.name] for n in nodes)
    world = sum(p.nproc for p in node_plans)
    if opts.solo and world != 1:
        raise LaunchError(f"a run without torchrun has one rank on one node, not {world}")
    elastic = None
    if opts.min_nodes is not None:
        if not 1 <= opts.min_nodes <= len(nodes):
            raise LaunchError(f"--min-nodes {opts.min_nodes}: the run has {len(nodes)} node(s)")
        elastic = plan.Elastic(opts.min_nodes, first.settings.train_max_restarts)
    shared, notes = plan.share_args(wanted, node_plans, run_id)
    if not opts.solo:
        shared = (*shared, *plan.events_args(first.settings, shared, opts.extra_args, run_id))
    for note in notes:
        say("nfs", f"note: {note}")
    args = plan.trainer_args(
        steps=opts.steps,
        model=opts.model,
        world=world,
        batch_per_rank=opts.batch_per_rank,
        resume=opts.resume,
        run_id=run_id,
        ckpt_name=opts.ckpt_name,
        summary="summary.json",
        shared=shared,
        extra=opts.extra_args,
        requeue=opts.requeue,
        elastic=elastic is not None,
        ckpt_every=opts.ckpt_every,
        drop_stragglers=opts.drop_stragglers,
    )
    return plan.RunPlan(
        run_id,
        first.cluster_address,
        first.settings.train_master_port,
        node_plans,
        args,
        solo=opts.solo,
        elastic=elastic,
    )


def prepare_again(
    node: Node,
    conn: Any,
    opts: Options,
    run_id: str,
    admission: int,
    say: Callable[[str, str], None],
    shares: tuple[plan.Share, ...] = (),
) -> plan.NodePlan:
    """A lost node of an elastic run, prepared to be admitted again: checked and given the
    trainer and reaper as at the start, in a run directory of its own for this admission
    (``<node>.<admission>``), since the old one may hold what the lost start left."""
    return _prepare_node(node, conn, opts, run_id, False, say, shares, admission)


def _capture(func: Callable[[Node], plan.NodePlan], node: Node) -> plan.NodePlan | Exception:
    try:
        return func(node)
    except Exception as e:  # reported per host, all together
        return e


def _prepare_node(
    node: Node,
    conn: Any,
    opts: Options,
    run_id: str,
    is_first: bool,
    say: Callable[[str, str], None],
    shares: tuple[plan.Share, ...] = (),
    admission: int = 0,
) -> plan.NodePlan:
    s = node.settings
    python = opts.python or f"{s.venv_path}/bin/python"
    run_dir = plan.run_dir(s.train_dir, run_id, node.name if not admission else f"{node.name}.{admission}")
    say(node.name, "checking python, interface and GPUs")
    # test -w asks the NFS server (root_squash), and touching an automount point mounts it;
    # it is asked as the user the trainer will run as.
    user = shlex.quote(s.training_user)
    as_runner = f'if [ -n "$RUN_AS" ]; then runuser -u {user} -- test -w "$1"; else test -w "$1"; fi'
    writable = "".join(
        f"sh -c {shlex.quote(as_runner)} - {shlex.quote(x.share)} && echo {shlex.quote(x.share)}; " for x in shares
    )
    probe_s = min(s.command_timeout_s, PROBE_TIMEOUT_S)
    probe = remote.run(
        node,
        (
            f"{shlex.quote(python)} -c {shlex.quote(_python_check(opts.check_torch))} && echo PY_OK; ip -j addr; "
            "echo '--gpus--'; "
            f"nvidia-smi -L 2>/dev/null; echo '--run-as--'; RUN_AS=$({plan.run_as_probe(s.training_user)}); "
            f"export RUN_AS; echo \"$RUN_AS\"; echo '--writable--'; {writable}echo '--dirs--'; "
            f"{plan.node_dirs_command(s.train_dir, run_dir, s.training_user)}"
        ),
        timeout=probe_s,
        conn=conn,
    )
    if probe.exited == -1:
        raise LaunchError(f"unreachable: {probe.stderr}")
    if probe.exited == remote.TIMED_OUT:
        raise LaunchError(
            f"checking python, interface and GPUs timed out after {probe_s} s "
            "(an overloaded node, or a GPU driver or NFS share that does not answer)"
        )
    head, _, rest = probe.stdout.partition("--gpus--")
    gpus, _, rest = rest.partition("--run-as--")
    run_as_out, _, rest = rest.partition("--writable--")
    can_write, _, dirs = rest.partition("--dirs--")
    run_as = s.training_user if f"RUN_AS={s.training_user}" in run_as_out else None
    if "PY_OK" not in head:
        raise LaunchError(
            f"{python} cannot be run or has no torch; run `provision up` (frameworks) or set venv_path / --python"
        )
    ip_json = head.split("PY_OK", 1)[1].strip()
    interface = s.cluster_interface or plan.interface_for(node.cluster_address, ip_json)
    if not interface:
        raise LaunchError(
            f"no interface holds cluster address {node.cluster_address}; set cluster_address or cluster_interface"
        )
    if "DIRS_OK" not in dirs:
        raise LaunchError(
            f"train_dir {s.train_dir} cannot be used: {dirs.strip() or probe.stderr.strip()[-300:]}; "
            "it and every directory above it must belong to root (or the SSH user) and be writable by "
            "no one else: remove it if another user made it, or set train_dir"
        )
    mig = plan.mig_gpus(gpus)
    if mig:
        raise LaunchError(
            f"MIG is enabled on GPU {', '.join(map(str, mig))}: the reference trainer runs one rank per whole "
            "GPU (a CUDA process sees one MIG device at most); disable MIG (`nvidia-smi -mig 0`, then reset "
            "the GPU) or leave this node out of the inventory"
        )
    nproc = opts.nproc_per_node or max(1, plan.gpu_count(gpus))
    say(node.name, "uploading trainer")
    conn.put(str(training_script()), f"{run_dir}/train_ddp.py")
    conn.put(str(REAPER), f"{run_dir}/reaper.py")
    return plan.NodePlan(
        node.name,
        node.cluster_address,
        interface,
        python,
        nproc,
        run_dir,
        plan.work_dir(s.train_dir),
        is_first,
        tuple(x.strip() for x in can_write.splitlines() if x.strip()),
        run_as,
        plan.gpu_count(gpus),
    )


def _python_check(torch: bool) -> str:
    """Whether the node's python has torch, found without importing it: the import (libtorch
    loaded and initialised) costs seconds on a GPU server and a minute or more on a busy or
    emulated one, and torchrun imports it moments later anyway, where a torch that is there
    but broken fails in the node's log."""
    return "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" if torch else "pass"


class Supervisor:
    """Runs the plan: a log stream per node, the monitor, and teardown on first failure."""

    def __init__(
        self,
        nodes: list[Node],
        conns: dict[str, Any],
        run: plan.RunPlan,
        opts: Options,
        on_line: Callable[[str, str, str], None],
        command_for: Callable[[plan.NodePlan], str] | None = None,
        on_stop: Callable[[], None] = lambda: None,
        admit: Callable[[str, int], tuple[Any, plan.NodePlan, int]] | None = None,
        store_alive: Callable[[], bool] | None = None,
    ):
        """``command_for``: the command whose output is a node's log and whose exit status
        is its end (default: torchrun over SSH, plan.node_command); ``on_stop``: what stops
        the run before the reapers do (a Slurm run's scancel). ``admit(host, admission)``:
        for an elastic run, a lost node prepared again once it answers, as (connection, its
        plan, its port to the rendezvous store); raises when it cannot be. ``store_alive``:
        whether an elastic run's rendezvous store still runs (it ends the run when not)."""
        self.nodes = {n.name: n for n in nodes}
        self.conns, self.plan, self.opts = conns, run, opts
        self._command_for = command_for or (lambda p: plan.node_command(self.plan, p))
        self._on_stop = on_stop
        self.out = Outcome(run.run_id, run, opts.runs_dir / run.run_id)
        self._on_line = on_line
        # Each node's end, and (host, None) when a lost node was started again: one queue, so
        # the watch loop sees an admission before that admission's end.
        self._ended: queue.Queue[tuple[str, HostEnd | None]] = queue.Queue()
        self._texts: dict[str, list[str]] = {n: [] for n in self.nodes}
        self._failed_at = 0.0  # controller clock when the first failure was seen
        self._requested: str | None = None  # request_stop's reason
        self.done = threading.Event()  # set when run() has returned
        self._admit = admit
        self._streams: list[threading.Thread] = []
        self._closing = threading.Lock()  # held while a node is started again, and once the watch ends
        self._watching = True
        self._dropped: dict[str, str] = {}  # stragglers taken out of an elastic run: host -> why
        self._kept: set[str] = set()  # stragglers that could not be dropped (said once)
        self._answered: dict[str, float] = {}  # host -> when it last answered the monitor
        self._silent: dict[str, str] = {}  # hosts whose connection was closed for silence -> why
        self._loss_work: dict[str, threading.Thread] = {}  # host -> its loss's reaper thread
        self._store_alive = store_alive
        self.live = live.LiveSeries(run.run_id, conns, self.out.curves)  # the figures for Prometheus

    def request_stop(self, why: str) -> None:
        """Stop the run from another thread (a sweep's Ctrl-C, whose trials run off the
        main thread, where no signal reaches the watch loop): torn down as on a failure."""
        self._requested = why

    def run(self) -> Outcome:
        try:
            return self._run()
        finally:
            self.done.set()

    def _run(self) -> Outcome:
        mon = monitor.Monitor(self._sample, list(self.nodes), self.opts.monitor_interval)
        for p in self.plan.nodes:
            self._start_stream(p)
        mon.start()
        self.live.start()
        if self.plan.elastic is not None and self._admit is not None:
            threading.Thread(target=self._rejoin_loop, daemon=True).start()
        try:
            with stop_signals() as stop:
                self._watch(stop)
        except KeyboardInterrupt:  # off the main thread, where no handler of ours is installed
            self._fail(None, "interrupted (Ctrl-C)")
        finally:
            with self._closing:  # no node is started again from here on
                self._watching = False
            mon.stop()
            self.live.halt()  # no new write; the file goes once the hosts are clean (below)
        for work in self._loss_work.values():  # a late loss reaper must not race the end's own
            work.join(timeout=JOIN_S)
        if self.out.failure:
            self._teardown_all()
        for t in self._streams:
            t.join(timeout=STREAM_JOIN_S)
        while not self._ended.empty():  # hosts that ended during or after teardown
            host, end = self._ended.get()
            if end is not None:
                self.out.ends.setdefault(host, end)
        if not self.out.failure:
            self._check_clean()
        # After the teardown, never before it: a write in flight to a lost host may take
        # its whole deadline, and the others' teardown must not wait for it.
        self.live.stop(unreachable=set(self._silent) | {e.host for e in self.out.losses})
        self._blame()
        self.out.samples = mon.series
        return self.out

    # -- the watch loop ------------------------------------------------------------

    def _watch(self, stop: StopRequest) -> None:
        pending = set(self.nodes)
        deadline = time.monotonic() + self.opts.timeout_s if self.opts.timeout_s else None
        while pending:
            if self._stopped(stop, pending):
                return
            try:
                host, got = self._ended.get(timeout=0.2)
            except queue.Empty:
                if deadline and time.monotonic() > deadline:
                    self._fail(None, f"timed out after {self.opts.timeout_s:.0f}s")
                    return
                continue
            if got is None:  # started again (an elastic run's admission)
                pending.add(host)
                self._answered[host] = time.monotonic()
                continue
            self.out.ends[host] = got
            pending.discard(host)
            if got.exited != 0 and not self._went_on(host, got, pending):
                return

    def _stopped(self, stop: StopRequest, pending: set[str]) -> bool:
        """Asked to stop, or the store is gone: the run fails. Also where a silent node of
        an elastic run has its connection closed."""
        if stop.why or self._requested:
            self._fail(None, stop.why or self._requested or "")
            return True
        if self._store_alive is not None and not self._store_alive():
            self._fail(None, "the rendezvous store on this machine ended")
            return True
        if self.plan.elastic is not None:
            self._close_silent(pending)
        return False

    def _went_on(self, host: str, end: HostEnd, pending: set[str]) -> bool:
        """A node ended badly: False when that fails the run (said), True when the run goes
        on (an elastic run without it, or a node admitted after the run had finished)."""
        if self._joined_late(host, pending):
            self._on_line(host, "provision", "admitted again too late: the run had finished without it")
            return True
        why = end.reason or f"{'the trainer' if self.plan.solo else 'torchrun'} exited {end.exited}"
        why = self._dropped.get(host) or self._silent.get(host) or why
        e = self.plan.elastic
        if e is not None and self._gone(host, end) and len(pending) >= e.min_nodes and not self._finished(pending):
            self._lose(host, why, pending)
            return True
        if e is not None and not self._gone(host, end):
            why += " (its workers failed and torchrun's restarts ran out: that ends the rendezvous for every node)"
        if e is not None and self.out.losses:
            why += f"; {len(pending)} node(s) left, --min-nodes {e.min_nodes}"
        self._fail(host, f"{host}: {why}")
        return False

    def _gone(self, host: str, end: HostEnd) -> bool:
        """The node itself went (its connection, a signal: power, the OOM killer, a drop),
        not its torchrun failing on its own: torchrun that exits with an error after its
        restarts ran out closes the rendezvous for every node (torch's launcher shuts it
        down on any exit but a signal), so the others cannot go on without it."""
        return end.exited == -1 or end.exited > 128 or host in self._dropped or host in self._silent

    def _close_silent(self, pending: set[str]) -> None:
        """Close the connection of a node that has not answered the monitor for SILENT_S:
        its stream then ends, and the node is lost like one whose connection dropped."""
        limit = max(SILENT_S, 4 * self.opts.monitor_interval)
        now = time.monotonic()
        for host in pending:
            quiet = now - self._answered.setdefault(host, now)
            if quiet > limit and host not in self._silent:
                self._silent[host] = f"silent for {quiet:.0f} s (no answer to the monitor)"
                self._on_line(host, "provision", f"{self._silent[host]}: closing its connection")
                threading.Thread(target=_close_quietly, args=(self.conns[host],), daemon=True).start()

    def _finished(self, pending: set[str]) -> bool:
        """Some node already ended well: the run trained to its end, and this node failed
        after it (its torchrun failing on the way out is a failure, not a node to go on
        without)."""
        return any(self.out.ends[h].exited == 0 for h in self.out.ends if h not in pending)

    def _joined_late(self, host: str, pending: set[str]) -> bool:
        """A node admitted again whose torchrun ended badly after the run had finished
        without it (it waited at a rendezvous that was over)."""
        again = any(j.host == host for j in self.out.joins)
        return again and self._finished(pending | {host}) and not pending

    def _rejoin_loop(self) -> None:
        """An elastic run's lost nodes are tried every REJOIN_POLL_S; one that answers is
        prepared again and started: its torchrun joins the rendezvous, and the others'
        restart their workers with it, up to every node of the run."""
        tried: dict[str, float] = {}
        admissions: dict[str, int] = {}
        said: set[str] = set()
        while not self.done.is_set() and self.out.failure is None:
            time.sleep(1)
            back = {x.host for x in self.out.losses} - self._running() - set(self._dropped)
            for host in sorted(back):
                if time.monotonic() - tried.get(host, 0.0) < REJOIN_POLL_S:
                    continue
                work = self._loss_work.get(host)
                if work is not None and work.is_alive():  # its loss's reaper may still be at work there
                    continue
                tried[host] = time.monotonic()
                # Every try takes a fresh number: a try that failed half way may have made
                # its run directory, which a later try must not need to make again.
                admissions[host] = admissions.get(host, 0) + 1
                try:
                    conn, node_plan, port = self._admit(host, admissions[host])  # type: ignore[misc]
                except Exception as e:  # not back yet: tried again later, said once
                    if host not in said:
                        said.add(host)
                        self._on_line(host, "provision", f"not back yet (asked every {REJOIN_POLL_S} s): {e}"[:300])
                    continue
                self._reaper(host, False)  # what the lost start left there, if any of it still runs
                with self._closing:
                    if not self._watching:
                        conn.close()
                        return
                    self._restart_node(host, conn, node_plan, port)

    def _running(self) -> set[str]:
        """Hosts whose latest start has not ended."""
        started = {h: 1 for h in self.nodes}
        for j in self.out.joins:
            started[j.host] += 1
        ended = {h: 0 for h in self.nodes}
        for x in self.out.losses:
            ended[x.host] += 1
        return {h for h in self.nodes if started[h] > ended[h]}

    def _restart_node(self, host: str, conn: Any, node_plan: plan.NodePlan, port: int) -> None:
        e = self.plan.elastic
        assert e is not None
        old = self.conns.get(host)
        self.conns[host] = conn
        ports = {**dict(e.store_ports), host: port}
        nodes = tuple(node_plan if p.name == host else p for p in self.plan.nodes)
        self.plan = replace(self.plan, nodes=nodes, elastic=replace(e, store_ports=tuple(ports.items())))
        self.out.plan = self.plan
        self.out.joins.append(NodeEvent(host, time.monotonic(), time.time(), "admitted again"))
        self._silent.pop(host, None)
        self._on_line(host, "provision", "answers again: admitted at the next rendezvous")
        self._ended.put((host, None))  # before its stream starts: the watch loop sees it first
        self._start_stream(node_plan)
        if old is not None:
            _close_quietly(old)

    def _start_stream(self, node_plan: plan.NodePlan) -> None:
        t = threading.Thread(target=self._stream, args=(node_plan,), daemon=True)
        self._streams.append(t)
        t.start()

    def _drop(self, host: str, why: str) -> None:
        """--drop-stragglers: rank 0 named ``host`` after a checkpoint; its run there is
        stopped, and its end is then a loss like any other (the others resume from that
        checkpoint without it), except that it is not admitted again. Kept when fewer than
        --min-nodes would be left. A name that is not a node of this run is ignored."""
        e = self.plan.elastic
        if e is None or host not in self.nodes or host in self._dropped or host in self._kept:
            return
        left = self._running() - {host}
        if len(left) < e.min_nodes:
            self._kept.add(host)
            self._on_line(
                host, "provision", f"a straggler, kept: without it {len(left)} node(s), --min-nodes {e.min_nodes}"
            )
            return
        self._dropped[host] = f"dropped as a straggler: {why}"
        self._on_line(host, "provision", "a straggler: stopping its part of the run; the others go on without it")
        threading.Thread(target=self._reaper, args=(host, False), daemon=True).start()

    def _lose(self, host: str, why: str, left: set[str]) -> None:
        """An elastic run goes on without ``host``: said, recorded, and the survivors'
        workers stopped at once (in a thread: the watch loop keeps watching). Their
        torchrun then restarts them from the newest checkpoint at the next rendezvous;
        left alone, they would first wait in a collective with the lost node's ranks until
        the process group's timeout. What is left of the run on the lost node is stopped
        too, if it can still be reached."""
        loss = NodeEvent(host, time.monotonic(), time.time(), why)
        self.out.losses.append(loss)
        self._on_line(
            host, "provision", f"lost ({why}); the run goes on with {len(left)} node(s): {', '.join(sorted(left))}"
        )

        # The group the lost node was in: its workers were started for this many ranks. A
        # survivor's workers that torchrun already restarted without it have fewer, and
        # are spared.
        world = sum(p.nproc for p in self.plan.nodes if p.name in left or p.name == host)
        work = threading.Thread(target=self._stop_after_loss, args=(host, sorted(left), world), daemon=True)
        self._loss_work[host] = work
        work.start()

    def _stop_after_loss(self, host: str, left: list[str], world: int) -> None:
        """The survivors' workers of a world of ``world`` ranks, and all of the run on the
        lost ``host`` if it answers (its reaper's JSON is that node's teardown record)."""

        def one(n: Node) -> dict[str, Any]:
            if n.name == host:
                return self._reaper(n.name, False)
            return self._reaper(n.name, False, workers_of_world=world)

        nodes = [self.nodes[h] for h in left] + [self.nodes[host]]
        for name, result in remote.on_all(nodes, one).items():
            if name == host:
                self.out.teardown[name] = result

    def _fail(self, host: str | None, why: str) -> None:
        if self.out.failure is None:
            self.out.failure, self.out.failed_host = why, host
            self._failed_at = time.monotonic()

    # -- per-node work ---------------------------------------------------------------

    def _stream(self, node_plan: plan.NodePlan) -> None:
        """A thread per node. Whatever goes wrong in it ends the node's run with a reason
        for the watcher: an exception that ended the thread alone would leave the other
        nodes waiting in the rendezvous until its timeout."""
        try:
            end = self._run_logged(node_plan)
        except Exception as e:  # e.g. the log file cannot be written
            end = HostEnd(-1, time.monotonic(), f"log stream failed ({type(e).__name__}: {e})")
        self._ended.put((node_plan.name, end))

    def _run_logged(self, node_plan: plan.NodePlan) -> HostEnd:
        name = node_plan.name
        again = any(j.host == name for j in self.out.joins)  # an admission after a loss: its log goes on
        with logs.open_log(self.out.out_dir, name, append=again) as log:
            sink = logs.LineSink(name, log, self._line, unprefixed=self.plan.unprefixed)
            try:
                result = self.conns[name].run(
                    self._command_for(node_plan),
                    hide=True,
                    warn=True,
                    pty=False,
                    in_stream=False,
                    out_stream=sink,
                    err_stream=sink,
                )
                end = HostEnd(result.exited if result.exited is not None else -1, time.monotonic(), "")
                if end.exited == -1:
                    end.reason = "SSH connection lost"
            except Exception as e:  # the connection died under the command
                end = HostEnd(-1, time.monotonic(), f"SSH connection lost ({type(e).__name__}: {e})")
            finally:
                sink.close()
        return end

    def _line(self, host: str, who: str, text: str) -> None:
        if who == "torchrun":  # torchrun's own lines hold its failure report
            self._texts[host].append(text)
        if who == "rank0":
            self.live.rank0_on = self.out.rank0_host = host
            self.out.curves.feed(text)
            if m := _STRAGGLER.match(text):
                self._drop(m.group(1), text[len("straggler: ") :])
        self._on_line(host, who, text)

    def _sample(self, host: str) -> str | None:
        r = remote.run_beside(self.conns[host], host, monitor.SAMPLE_COMMAND, timeout=15)
        if r.ok:
            self._answered[host] = time.monotonic()
        return r.stdout if r.ok else None

    def _reaper(self, name: str, check: bool, workers_of_world: int | None = None) -> dict[str, Any]:
        p = next(n for n in self.plan.nodes if n.name == name)
        # -I: the reaper runs as root; no PYTHON* variable, user site or script directory
        # on its import path.
        cmd = shlex.join(
            [
                p.python,
                "-I",
                f"{p.run_dir}/reaper.py",
                p.run_dir,
                self.plan.run_id,
                name,
                *(["--check"] if check else []),
                *([] if workers_of_world is None else ["--workers-of-world", str(workers_of_world)]),
            ]
        )
        r = remote.run_beside(self.conns[name], name, cmd, timeout=TEARDOWN_TIMEOUT_S)
        if r.exited == -1:  # the run's connection is gone: a fresh one
            r = remote.run(self.nodes[name], cmd, timeout=TEARDOWN_TIMEOUT_S)
        return reaper_json(r)

    def _teardown_all(self) -> None:
        with shielded_from_ctrl_c():
            try:
                self._on_stop()
            except Exception as e:  # the reapers below still stop the run's processes
                self.out.failure = f"{self.out.failure}; stopping it: {type(e).__name__}: {e}"
            results = remote.on_all(list(self.nodes.values()), lambda n: self._reaper(n.name, False))
        self.out.teardown = results
        self.out.teardown_s = time.monotonic() - self._failed_at

    def _check_clean(self) -> None:
        self.out.teardown = remote.on_all(list(self.nodes.values()), lambda n: self._reaper(n.name, True))

    def _blame(self) -> None:
        """Name the rank that failed first, from torchrun's reports on every host."""
        texts = {h: "\n".join(t) for h, t in self._texts.items()}
        self.out.failure, self.out.failed_host, self.out.failed_rank = logs.blame(
            self.out.failure, self.out.failed_host, texts
        )


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


@dataclass
class StopRequest:
    """Why the run was asked to stop (Ctrl-C, SIGTERM); None until it is."""

    why: str | None = None


@contextlib.contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """While the run is watched, Ctrl-C (SIGINT) and SIGTERM stop it on every host.

    Installed here rather than inherited: a shell that starts a command in the background
    hands it SIGINT ignored (Python then never raises KeyboardInterrupt), and a scheduler or
    `kill` stops a job with SIGTERM, which would otherwise end this process and leave the
    ranks running under their own sessions on the nodes.

    The handler only notes the request; the watch loop acts on it within 0.2 s. It must not
    raise: threads are gevent greenlets here, and a handler runs in whichever greenlet holds
    the interpreter when the signal lands (a paramiko reader, the hub), so an exception
    would end that greenlet, or be printed by the hub and dropped, and the run went on."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def stop(signum: int, frame: Any) -> None:
        if request.why is None:
            request.why = (
                "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
            )

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def shielded_from_ctrl_c() -> Iterator[None]:
    """A second Ctrl-C must not abandon a teardown half done (it is bounded in time)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def reaper_json(r: remote.CommandResult) -> dict[str, Any]:
    import json

    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return cast("dict[str, Any]", json.loads(line))
            except json.JSONDecodeError:
                break
    return {"error": (r.stderr or r.stdout or f"exit {r.exited}").strip()[-300:], "left": None}
