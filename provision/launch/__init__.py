"""Launch the reference trainer on every node: torchrun with a c10d rendezvous on the first
node's cluster address, started over SSH, logs streamed and saved, the whole run torn
down on the first failure, and a report with throughput, scaling and resource use. An
elastic run (``--min-nodes``) keeps its rendezvous store beside the launcher instead
(``store``) and goes on without a lost node while enough are left.

    report = launch.train(cluster, Options(...), on_line=print_line, say=progress)

Modules: ``plan`` (pure: commands, run id), ``session`` (SSH: prepare, stream, teardown),
``slurm_job`` (--scheduler slurm: the same run as one Slurm job), ``store`` and
``store_server`` (an elastic run's rendezvous store, on the controller),
``reaper`` (runs on the node: stop a run by pgid/pid), ``logs`` and ``monitor`` (pure
parsers), ``report`` (verdicts, records), ``plots`` (PNG).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from provision import remote
from provision.inventory import Cluster, Node
from provision.launch import plan, report, session, slurm_job, store
from provision.launch.session import LaunchError, Options

__all__ = ["LaunchError", "Options", "train"]


def train(
    cluster: Cluster,
    nodes: list[Node],
    opts: Options,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
) -> report.TrainReport:
    """Run the trainer on ``nodes``; raises LaunchError when a node cannot be prepared
    (nothing was started then). A failed run is a report with ok=False, never an
    exception: the report says who failed first and how the run was stopped."""
    run_id = plan.new_run_id()
    if opts.min_nodes is not None and opts.scheduler == "slurm":
        raise LaunchError("--min-nodes runs over SSH (--scheduler ssh); under Slurm, --requeue resumes a run")
    conns = {n.name: remote.connection(n) for n in nodes}
    rendezvous: store.Store | None = None
    try:
        run_plan = session.prepare(nodes, conns, opts, run_id, say, nfs_server=cluster.storage_node() is not None)
        if run_plan.elastic is not None:
            rendezvous, run_plan = _elastic_start(cluster, nodes, conns, run_plan, opts, say)
        for p in run_plan.nodes:
            say(p.name, f"starting {p.nproc} rank(s) on {p.interface}")
        if opts.scheduler == "slurm" and opts.chosen and not opts.requeue:
            # --scheduler auto took Slurm before the plan was known; a plan one job cannot
            # run (ranks differ per node) runs over SSH, as before auto, and says so.
            why = slurm_job.unfit(run_plan)
            if why:
                say(run_plan.nodes[0].name, f"scheduler: ssh after all (a Slurm job {why})")
                opts = replace(opts, scheduler="ssh")
        outcome = _run(cluster, nodes, conns, run_plan, opts, on_line, say, rendezvous)
        board, board_notes = _copy_events(outcome, conns, say)
    finally:
        if rendezvous is not None:
            rendezvous.stop()
        for c in conns.values():
            c.close()
    records = opts.runs_dir / "records" / f"{cluster.path.stem}.json"
    records.parent.mkdir(parents=True, exist_ok=True)
    result = report.build(outcome, records, report.signature(run_plan, opts))
    if outcome.slurm_job:
        result.notes.append(f"ran as Slurm job {outcome.slurm_job}")
    result.tensorboard = board
    result.notes += board_notes
    _write(outcome, result)
    return result


def _run(
    cluster: Cluster,
    nodes: list[Node],
    conns: dict[str, object],
    run_plan: plan.RunPlan,
    opts: Options,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
    rendezvous: store.Store | None,
) -> session.Outcome:
    """The run itself, by its scheduler: a Slurm job, or torchrun over SSH (elastic with a
    store: lost nodes admitted again, the store watched)."""
    if opts.scheduler == "slurm":
        return slurm_job.run(nodes, conns, run_plan, opts, on_line, say)
    if rendezvous is None:
        return session.Supervisor(nodes, conns, run_plan, opts, on_line).run()
    admit = _admitter(nodes, opts, run_plan, rendezvous, cluster.storage_node() is not None, say)
    return session.Supervisor(nodes, conns, run_plan, opts, on_line, admit=admit, store_alive=rendezvous.alive).run()


def _elastic_start(
    cluster: Cluster,
    nodes: list[Node],
    conns: dict[str, object],
    run_plan: plan.RunPlan,
    opts: Options,
    say: Callable[[str, str], None],
) -> tuple[store.Store, plan.RunPlan]:
    """The store started here and forwarded onto every node's loopback; the plan with
    each node's port to it."""
    assert run_plan.elastic is not None
    for note in _elastic_notes(cluster, nodes, run_plan):
        say(run_plan.nodes[0].name, f"note: {note}")
    rendezvous = store.Store.start(opts.runs_dir / run_plan.run_id / "store.log")
    try:
        ports = rendezvous.expose(nodes, conns)
    except BaseException:
        rendezvous.stop()
        raise
    elastic = replace(run_plan.elastic, store_ports=tuple(ports.items()))
    say(
        run_plan.nodes[0].name,
        f"elastic: goes on with at least {elastic.min_nodes} of {len(nodes)} nodes, the rendezvous "
        f"store on this machine (127.0.0.1:{rendezvous.port}), reached from each node over its SSH connection",
    )
    return rendezvous, replace(run_plan, elastic=elastic)


def _elastic_notes(cluster: Cluster, nodes: list[Node], run_plan: plan.RunPlan) -> list[str]:
    """Where an elastic run's checkpoints are, when a restart could not find them: each
    start of the workers loads the newest checkpoint rank 0 wrote, wherever rank 0 was."""
    notes = []
    if "--ckpt-dir" not in run_plan.trainer_args:
        notes.append(
            "checkpoints stay on each node's local disk (no NFS checkpoints share every node can write): "
            "after a loss, the workers restart from a checkpoint only if the new rank 0 is where the old "
            "one wrote it, else from step 0; give the cluster the nfs step or -- --ckpt-dir on shared storage"
        )
    storage = cluster.storage_node()
    if storage is not None and any(n.name == storage.name for n in nodes) and "--ckpt-dir" in run_plan.trainer_args:
        notes.append(f"the checkpoints share is served by {storage.name}, which trains too: losing it ends the run")
    return notes


def _admitter(
    nodes: list[Node],
    opts: Options,
    run_plan: plan.RunPlan,
    rendezvous: store.Store,
    has_nfs: bool,
    say: Callable[[str, str], None],
) -> Callable[[str, int], tuple[object, plan.NodePlan, int]]:
    """How an elastic run takes a lost node back: a fresh connection (the old one died with
    it), the node prepared again, able to write the shares the run's checkpoints are on
    (a rebooted node may not have mounted them yet: it would start afresh elsewhere), and
    the store forwarded onto its loopback."""
    by_name = {n.name: n for n in nodes}
    wanted = plan.shares(nodes[0].settings, has_nfs, opts.extra_args)
    used = [s for s in wanted if s.flag in run_plan.trainer_args]

    def admit(name: str, admission: int) -> tuple[object, plan.NodePlan, int]:
        node = by_name[name]
        conn = remote.connection(node)
        try:
            answer = remote.run(node, "true", timeout=node.settings.connect_timeout_s + 30, conn=conn)
            if not answer.ok:
                raise LaunchError(f"does not answer ({answer.stderr.strip()[-200:] or answer.exited})")
            node_plan = session.prepare_again(node, conn, opts, run_plan.run_id, admission, say, tuple(used))
            missing = [s.share for s in used if s.share not in node_plan.writable]
            if missing:
                raise LaunchError(f"cannot write {', '.join(missing)} yet (not mounted?)")
            return conn, node_plan, rendezvous.expose_one(node, conn)
        except BaseException:
            conn.close()
            raise

    return admit


def _copy_events(
    outcome: session.Outcome, conns: dict[str, object], say: Callable[[str, str], None]
) -> tuple[str | None, list[str]]:
    """Rank 0's TensorBoard events, from the node it ran on into the run's directory here:
    (the local events directory or None, notes). A run whose rank 0 was never heard from,
    or whose node is gone, has none; Ctrl-C here keeps the run's report."""
    from provision.launch import events

    host = outcome.rank0_host
    node_plan = next((p for p in outcome.plan.nodes if p.name == host), None)
    where = plan.events_dir(outcome.plan, node_plan) if node_plan else None
    if host is None or node_plan is None or where is None:
        return None, []
    if host in {e.host for e in outcome.losses} and host not in {j.host for j in outcome.joins}:
        return None, [f"TensorBoard events: {host} (rank 0's node) was lost; they stay in {where} there"]
    dest = Path(outcome.out_dir) / plan.EVENTS_DIR
    say(host, f"copying TensorBoard events from {where}")
    try:
        files, note = events.fetch(conns[host], host, where, node_plan.run_as, dest)
    except KeyboardInterrupt:
        return None, ["TensorBoard events: the copy was interrupted (Ctrl-C)"]
    except Exception as e:  # a copy must never hide the run's result (a full disk here)
        return None, [f"TensorBoard events: the copy failed ({type(e).__name__}: {e})"]
    notes = [note] if note else []
    if not files:
        return None, notes
    if where.startswith("/") and not where.startswith(node_plan.work_dir):
        notes.append(f"TensorBoard events on the cluster: {where} (on the shared runs share)")
    return str(dest), notes


def _write(outcome: session.Outcome, result: report.TrainReport) -> None:
    from provision.launch import plots

    out_dir = Path(outcome.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result.plot = str(plots.plot(outcome, result, out_dir / "train.png"))
    except Exception as e:  # a plot must never hide the run's result
        result.notes.append(f"plot failed: {type(e).__name__}: {e}")
    (out_dir / "report.json").write_text(json.dumps(report.to_json(result), indent=1, default=str))
