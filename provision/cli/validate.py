"""`provision validate`: benchmark every node and give each a verdict (the acceptance gate)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from provision.cli.console import err, host_progress, out, print_json, safe
from provision.cli.options import LimitOpt
from provision.errors import EXIT_BAD_INPUT, InputError, Problem
from provision.validate.rounds import FULL_PEERS

VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "not_run": "dim"}


def validate(
    inventory: Path | None = typer.Argument(None, help="pyinfra inventory file, e.g. inventories/testbed.py"),
    quick: bool = typer.Option(
        True,
        "--quick/--full",
        help="quick: seconds per benchmark, ring of links; full: GEMM shape sweep, longer runs, every pair of links",
    ),
    only: str = typer.Option(
        "cpu,ram,disk,net,gpu,allreduce", "--only", help="comma-separated groups: cpu,ram,disk,net,gpu,allreduce"
    ),
    expect: Path | None = typer.Option(
        None, "--expect", help='JSON thresholds, e.g. {"disk_seq_read_mibs": 2000, "gpu_bf16_tflops.fraction": 0.8}'
    ),
    json_out: str | None = typer.Option(None, "--json", help="write the JSON report here ('-': stdout)"),
    html_out: Path | None = typer.Option(None, "--html", help="write the HTML report with charts here"),
    junit_out: Path | None = typer.Option(None, "--junit", help="write JUnit XML here"),
    history_host: str | None = typer.Option(None, "--history", help="show the trend of HOST's past results and exit"),
    warn_ok: bool = typer.Option(False, "--warn-ok", help="exit 0 when nodes only warned"),
    limit: str | None = LimitOpt,
    link_peers: int = typer.Option(
        FULL_PEERS,
        "--link-peers",
        min=1,
        max=256,
        help="full mode on fleets too large for every pair: random link partners per node beyond the ring",
    ),
    drain: bool = typer.Option(
        False,
        "--drain",
        help="Slurm: drain failed nodes with their evidence, resume nodes validate drained that now pass, "
        "give warning nodes their slurm_warn_weight",
    ),
) -> None:
    """Benchmark every node (CPU, RAM, disk, NICs, GPUs, all-reduce) and judge it: pass,
    warn or fail, with reasons. Results are kept per host (see --history).

    Exit code: 0 every node passed; 1 a node warned (unless --warn-ok) or failed, or was
    unreachable, or --drain could not change a node; 2 bad input (nothing contacted).

    With --drain, on a cluster running Slurm, the verdicts drive the scheduler: a failed node
    is drained (reason "provision: validate: <evidence> (validate run <time>)"), a node that
    validate drained and that now passes is resumed, and drains by anyone else stay.

    Example: provision validate inventories/testbed.py --quick --html report.html --junit v.xml
    """
    from provision.validate import history

    if history_host:
        _print_history(history_host, history.read(history_host), json_out)
        return
    if inventory is None:
        raise InputError(
            Problem("provision validate", "missing INVENTORY", "e.g. provision validate inventories/testbed.py")
        )
    code = _run(
        inventory,
        "quick" if quick else "full",
        only,
        expect,
        json_out,
        html_out,
        junit_out,
        warn_ok,
        limit,
        link_peers,
        drain,
    )
    raise typer.Exit(code)


def _groups(only: str) -> frozenset[str]:
    from provision.metrics import GROUPS

    groups = frozenset(g.strip() for g in only.split(",") if g.strip())
    unknown = sorted(groups - set(GROUPS))
    if unknown or not groups:
        raise InputError(
            Problem(
                f"--only {only}", f"unknown group {', '.join(unknown) or '(none)'}", "choose from " + ",".join(GROUPS)
            )
        )
    return groups


def _check_outputs(outputs: dict[str, str | Path | None]) -> None:
    """Report files must be writable before the run, not found unwritable after it."""
    problems = []
    for flag, path in outputs.items():
        if path is None:
            continue
        p = Path(path)
        parent = p.parent
        if p.is_dir():
            problems.append(Problem(f"{flag} {p}", "is a directory", "give a file name"))
        elif p.exists() and not p.is_file():  # a FIFO would block the write, /dev/full fail it, after the run
            problems.append(Problem(f"{flag} {p}", "is not a regular file", "give a file name"))
        elif not parent.is_dir():
            problems.append(Problem(f"{flag} {p}", f"directory {parent} does not exist", "create it first"))
        elif not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            problems.append(Problem(f"{flag} {p}", "not writable", "choose a path you can write"))
    if problems:
        raise InputError(problems)


def _run(
    inventory: Path,
    mode: str,
    only: str,
    expect: Path | None,
    json_out: str | None,
    html_out: Path | None,
    junit_out: Path | None,
    warn_ok: bool,
    limit: str | None = None,
    link_peers: int = FULL_PEERS,
    drain: bool = False,
) -> int:
    from provision import inventory as inventory_lib
    from provision import limit as host_limit
    from provision import state
    from provision.validate import controller, history, judge, report_html, report_json, report_junit
    from provision.validate.expectations import Overrides, load_expect_file, parse_flat

    # Every input is checked before the first host is contacted: the state directory too,
    # where the results are kept once every benchmark has run.
    state.state_dir()
    groups = _groups(only)
    _check_outputs({"--json": None if json_out == "-" else json_out, "--html": html_out, "--junit": junit_out})
    overrides = load_expect_file(expect) if expect else Overrides()
    # A limited run judges its hosts against each other: the fleet band is theirs.
    whole = inventory_lib.load(inventory)
    cluster = host_limit.apply(whole, limit)
    for node in cluster.nodes:
        parse_flat(node.settings.validate_expect, f"{inventory}: host {node.name}: validate_expect")
    if drain and not whole.compute_nodes():
        raise InputError(
            Problem(f"{inventory}", "--drain: no host runs Slurm (slurm = skip on every host)", "drop --drain")
        )
    plan = controller.Plan(mode, groups, overrides, link_peers=link_peers)
    with host_progress([n.name for n in cluster.nodes], enabled=json_out != "-") as progress:
        outcome = controller.run(cluster, plan, progress)
    code = judge.exit_code(outcome.results, warn_ok)
    info = report_json.RunInfo(str(inventory), mode, sorted(groups), code, network=outcome.network)
    if json_out == "-":
        print_json(report_json.document(outcome.results, info))
    else:
        _print_table(outcome.results)  # first: what the run measured is shown whatever fails next
    history.append(outcome.results, info.created, mode)
    _publish(cluster, outcome.results)
    if json_out and json_out != "-":
        report_json.write(json_out, outcome.results, info)
    if html_out:
        report_html.write(html_out, outcome.results, f"provision validate: {inventory}")
    if junit_out:
        report_junit.write(junit_out, outcome.results, warn_ok)
    if drain:
        reports = [str(p) for p in (html_out, json_out if json_out != "-" else None) if p]
        code = max(code, _drain(whole, outcome.results, info.created, reports))
    return code


def _publish(cluster: Any, results: list[Any]) -> None:
    """The verdicts as series on each node for Prometheus (the monitoring step's textfile
    directory); a host that could not take them is named, and changes no verdict."""
    import time

    from provision.validate import textfile

    for host, why in textfile.publish(cluster, results, time.time()).items():
        err.print(f"[yellow]monitoring:[/] {safe(host)}: the verdicts were not written for Prometheus: {safe(why)}")


def _drain(whole: Any, results: list[Any], run: str, reports: list[str]) -> int:
    """Apply the verdicts to Slurm through the head (the whole inventory's, also under
    --limit); 1 when the head could not say or a node could not be changed."""
    from provision import scheduler
    from provision.validate import drain as slurm_nodes

    seen = scheduler.view(whole)
    head = seen.controller
    if seen.error:
        err.print(
            f"[bold red]--drain:[/] nothing drained or resumed: Slurm's controller did not answer: {safe(seen.error)}"
        )
        return 1
    weights = {n.name: n.settings.slurm_warn_weight for n in whole.nodes}
    actions = slurm_nodes.plan(results, seen.nodes, run, weights)
    problems = slurm_nodes.apply(whole, actions)
    where = f" (report: {', '.join(reports)})" if reports else ""
    for a in actions:
        verb = {"drain": "drained", "resume": "resumed", "weight": "weight set to", "leave": "left alone:"}[a.kind]
        err.print(f"slurm ({safe(head)}): {safe(a.node)} {verb} {safe(a.detail)}{where if a.kind == 'drain' else ''}")
    for p in problems:
        err.print(f"[bold red]--drain:[/] {safe(p)}")
    return 1 if problems else 0


def _print_table(results: list[Any]) -> None:
    table = Table(title="validate")
    for column in ("node", "metric", "value", "expect", "verdict", "reason"):
        table.add_column(column, overflow="fold")
    for r in results:
        for e in r.errors:
            table.add_row(safe(r.node), "-", "-", "-", "[bold red]FAIL[/]", safe(e))
        for f in r.findings:
            name = f"{f.metric}[{f.device}]" if f.device else f.metric
            value = "-" if f.value is None else f"{f.value:.4g} {f.unit}"
            exp = "-" if f.expectation is None else f"{f.expectation:.4g}"
            style = VERDICT_STYLE.get(f.verdict, "")
            table.add_row(safe(r.node), safe(name), value, exp, f"[{style}]{f.verdict.upper()}[/]", safe(f.reason))
    out.print(table)
    summary = Table(title="verdict per node")
    for column in ("node", "verdict", "GPU SKU"):
        summary.add_column(column)
    for r in results:
        style = VERDICT_STYLE.get(r.verdict, "")
        summary.add_row(safe(r.node), f"[{style}]{r.verdict.upper()}[/]", safe(r.sku or "-"))
    out.print(summary)


def _print_history(host: str, lines: list[dict[str, Any]], json_out: str | None) -> None:
    from provision.validate.history import trend

    rows = trend(lines)
    if json_out == "-":
        print_json({"host": host, "runs": lines})
        return
    if json_out:
        raise typer.Exit(_bad("--history writes JSON to stdout only: use --json -"))
    out.print(
        f"[bold]{safe(host)}[/]: {len(lines)} runs, verdicts "
        + safe(" ".join(str(line.get("verdict", "?")) for line in lines[-10:]))
    )
    table = Table(title=f"trend for {host}")
    for column in ("metric", "runs", "first", "previous", "latest", "change"):
        table.add_column(column)
    for row in rows:
        change = "-" if row.change is None else f"{row.change:+.1%}"
        style = "red" if row.change is not None and row.change < -0.1 else ""
        table.add_row(
            safe(row.key),
            str(row.runs),
            f"{row.first:.4g}",
            "-" if row.previous is None else f"{row.previous:.4g}",
            f"{row.latest:.4g}",
            f"[{style}]{change}[/]" if style else change,
        )
    out.print(table)


def _bad(message: str) -> int:
    err.print(f"[bold red]error:[/] {safe(message)}")
    return EXIT_BAD_INPUT


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
