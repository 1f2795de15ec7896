"""The run's summary: per-node throughput, scaling efficiency against a recorded
single-node run, resource use, stragglers, and how a failed run was torn down.

Verdicts are pure functions; records live in runs/records.json on the controller.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.launch import logs, monitor
from provision.launch.session import NodeEvent, Outcome
from provision.state import write_atomic

STRAGGLER_RATIO = 1.2  # a node whose own step time is this much longer than the median


@dataclass
class NodeReport:
    name: str  # inventory name
    ranks: list[int]  # global ranks it ran
    tokens_per_s: float | None  # its ranks' own tokens/s together (step time less the wait for slower ranks)
    forward_ms: float | None  # mean forward time of its ranks
    own_step_ms: float | None  # mean step time of its ranks less their wait at the all-reduce (the straggler signal)
    usage: monitor.Usage | None  # CPU/RAM/GPU mean and peak over the run
    exited: int | None  # torchrun's exit status; None when it was stopped before it ended
    clean: bool | None  # nothing of the run left on the node afterwards


@dataclass
class TrainReport:
    run_id: str  # the run's id, also runs/<run-id>
    ok: bool  # trained to the end on every node, and every node is clean
    nodes: list[NodeReport]  # in inventory order
    world_size: int  # ranks in the run
    tokens_per_s: float | None  # whole-cluster throughput
    scaling_efficiency: float | None  # tokens/s / (nodes x single-node tokens/s)
    scaling_reference: str | None  # run id of the single-node record compared against
    stragglers: list[str]  # nodes slower than STRAGGLER_RATIO x the median
    final_train_loss: float | None  # rank 0's last train loss
    final_val_loss: float | None  # last validation loss
    failure: str | None  # who failed first and how; None when ok
    failed_host: str | None  # host of the first failure
    failed_rank: int | None  # rank of the first failure, when torchrun named one
    teardown_s: float | None  # first failure seen -> every host clean
    out_dir: str  # controller directory with logs, report and plot
    plot: str | None = None  # PNG with loss curves and throughput
    tensorboard: str | None = None  # the run's TensorBoard events, copied here (tensorboard --logdir)
    mfu: float | None = None  # model FLOPs utilisation (GPU runs)
    notes: list[str] = field(default_factory=list)  # anything else worth saying
    requeues: int | None = None  # --requeue: times the Slurm job was requeued and started again; else None
    lost: list[dict[str, Any]] = field(default_factory=list)  # elastic: nodes the run went on without
    joined: list[dict[str, Any]] = field(default_factory=list)  # elastic: lost nodes admitted again
    restarts: list[Restart] = field(default_factory=list)  # every restart of the workers, in order


@dataclass
class Restart:
    """One restart of the workers (an elastic run's lost node, a requeue, a rank torchrun
    restarted): what it cost."""

    at: str  # when: the loss that caused it, else the restart itself (local time)
    why: str  # the lost node and how it ended, or what is known
    lost: list[str]  # nodes lost since the start before it
    joined: list[str]  # lost nodes admitted again since the start before it
    world_before: int  # ranks before
    world_after: int  # ranks after
    resumed_from_step: int  # the checkpoint step it continued from
    steps_recomputed: int  # steps done before it and again after it
    recovery_s: float | None  # the loss (or the restart) to its first training step


def restarts(starts: list[logs.Start], losses: list[NodeEvent], joins: list[NodeEvent] | None = None) -> list[Restart]:
    """Each start of the workers after the first, with the losses and admissions seen
    since the one before it. Pure: the clock values are the controller's monotonic ones."""
    out = []
    for before, start in itertools.pairwise(starts):
        seen = [x for x in losses if before.at <= x.at <= start.at]
        back = [x for x in joins or [] if before.at <= x.at <= start.at]
        cause = sorted(seen + back, key=lambda x: x.at)
        origin = cause[0].at if cause else start.at
        wall = cause[0].wall if cause else time.time() - (time.monotonic() - start.at)
        why = (
            "; ".join([f"{x.host} lost ({x.why})" for x in seen] + [f"{x.host} admitted again" for x in back])
            or "the workers were started again"
        )
        out.append(
            Restart(
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall)),
                why,
                [x.host for x in seen],
                [x.host for x in back],
                before.world,
                start.world,
                start.resumed_from,
                max(0, start.last_step - start.resumed_from),
                None if start.first_step_at is None else round(start.first_step_at - origin, 2),
            )
        )
    return out


def stragglers(own_step_ms: dict[str, float], ratio: float = STRAGGLER_RATIO) -> list[str]:
    """Nodes whose ranks' own step time (their step less their wait for the others at the
    gradient all-reduce) is ``ratio`` x the median. In DDP every rank waits for the slowest
    at each all-reduce, so step time alone cannot show who is slow. Forward time cannot
    either on CPU: a fast node's forward passes can absorb its wait for a slow one (measured
    3.7x on netns hosts with one node throttled), which names the wrong node."""
    if len(own_step_ms) < 2:
        return []
    median = statistics.median(own_step_ms.values())
    return sorted(n for n, ms in own_step_ms.items() if median > 0 and ms > ratio * median)


def scaling_efficiency(tokens_per_s: float, nodes: int, single_node_tps: float) -> float:
    return tokens_per_s / (nodes * single_node_tps)


@dataclass(frozen=True)
class Record:
    """One successful run, for later scaling comparisons."""

    run_id: str  # its id
    signature: str  # what must match to compare: model, ranks per node, batch, extra args
    nodes: int  # how many nodes it ran on
    tokens_per_s: float  # whole-cluster throughput
    at: float  # unix time


def signature(run_plan: Any, opts: Any) -> str:
    nproc = sorted({n.nproc for n in run_plan.nodes})
    return json.dumps(
        {"model": opts.model, "nproc": nproc, "batch_per_rank": opts.batch_per_rank, "extra": list(opts.extra_args)},
        sort_keys=True,
    )


def load_records(path: Path) -> list[Record]:
    try:
        return [Record(**r) for r in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []


def save_record(path: Path, record: Record) -> None:
    records = [*load_records(path), record]
    write_atomic(path, json.dumps([asdict(r) for r in records], indent=1))


def reference(records: list[Record], sig: str) -> Record | None:
    """The latest single-node record with the same signature."""
    same = [r for r in records if r.signature == sig and r.nodes == 1]
    return max(same, key=lambda r: r.at) if same else None


def build(out: Outcome, records_path: Path, sig: str) -> TrainReport:
    summary = out.curves.summary or {}
    ranks_by_node: dict[str, list[dict[str, Any]]] = {}
    for r in summary.get("ranks", []):
        ranks_by_node.setdefault(r["node"], []).append(r)
    nodes = [_node_report(out, p.name, ranks_by_node.get(p.name, [])) for p in out.plan.nodes]
    lost = {x.host for x in out.losses}
    # A lost node that cannot be reached cannot be checked (clean None); it does not fail a
    # run that finished on the others, and the note below names it.
    ok = out.failure is None and bool(summary) and all(n.clean or (n.name in lost and n.clean is None) for n in nodes)
    tps = summary.get("tokens_per_s")
    report = TrainReport(
        out.run_id,
        ok,
        nodes,
        out.plan.world_size,
        tps,
        None,
        None,
        stragglers({n.name: n.own_step_ms for n in nodes if n.own_step_ms is not None}),
        summary.get("final_train_loss"),
        summary.get("final_val_loss"),
        out.failure,
        out.failed_host,
        out.failed_rank,
        out.teardown_s,
        str(out.out_dir),
        mfu=summary.get("mfu"),
        requeues=out.requeues,
        lost=[
            {"host": x.host, "at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(x.wall)), "why": x.why}
            for x in out.losses
        ],
        restarts=restarts(out.curves.starts, out.losses, out.joins),
        joined=[{"host": x.host, "at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(x.wall))} for x in out.joins],
    )
    back = {x.host for x in out.joins}
    for n in nodes:
        if n.name in back:
            report.notes.append(f"{n.name} was lost and admitted again during the run")
        elif n.name in lost:
            gone = (
                " and could not be reached afterwards to check that nothing of the run is left"
                if n.clean is None
                else ""
            )
            report.notes.append(f"{n.name} was lost during the run{gone}; the run went on without it")
    if out.failure is None and not summary:
        report.notes.append("the trainer ended without its summary line")
    if ok and tps:
        _compare(report, records_path, sig, len(nodes), tps)
    return report


def _compare(report: TrainReport, path: Path, sig: str, n_nodes: int, tps: float) -> None:
    ref = reference(load_records(path), sig)
    if n_nodes > 1 and ref:
        report.scaling_efficiency = scaling_efficiency(tps, n_nodes, ref.tokens_per_s)
        report.scaling_reference = ref.run_id
    elif n_nodes > 1:
        report.notes.append(
            "no single-node run recorded with these settings; run with "
            "--limit FIRST_HOST once to get scaling efficiency"
        )
    save_record(path, Record(report.run_id, sig, n_nodes, tps, time.time()))


def _node_report(out: Outcome, name: str, ranks: list[dict[str, Any]]) -> NodeReport:
    end = out.ends.get(name)
    td = out.teardown.get(name)
    # None: not checked, or the check could not run (the host did not answer)
    clean = None if td is None or td.get("left") is None else td.get("left") == []
    return NodeReport(
        name,
        sorted(r["rank"] for r in ranks),
        sum(r["tokens_per_s"] for r in ranks) if ranks else None,
        statistics.mean(r["forward_ms"] for r in ranks) if ranks else None,
        _own_step_ms(ranks),
        monitor.usage(out.samples.get(name, [])),
        end.exited if end else None,
        clean,
    )


def _own_step_ms(ranks: list[dict[str, Any]]) -> float | None:
    """The mean of its ranks' step time less their wait; None for a trainer's summary
    without those times (one from before they were reported)."""
    try:
        return statistics.mean(float(r["step_ms"]) - float(r["wait_ms"]) for r in ranks) if ranks else None
    except (KeyError, TypeError, ValueError):
        return None


def to_json(report: TrainReport) -> dict[str, Any]:
    return asdict(report)
