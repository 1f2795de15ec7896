"""What a sweep leaves: a row per trial, the best trial's checkpoint kept as the study's
``best`` (copied on its node, evaluated again from the copy), tune.json, and an HTML
report with Optuna's matplotlib plots.

The best trial's checkpoint path comes from the trainer's summary line, which the
training user's process printed: it is held to the name the trial was given, and the
copy runs as that user (as the trainer did), so a forged path can reach nothing the
trainer could not read itself.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shlex
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.launch import plan
from provision.tune import trial as trial_lib
from provision.tune.slots import Slot

BEST_NAME = "best"  # the copy: <ckpt dir>/tune-<study>/best-step<N>.pt, beside best.json
COPY_TIMEOUT_S = 600


@dataclass
class Row:
    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None  # complete: final val loss; pruned: last reported
    params: dict[str, Any]
    slot: str | None
    seconds: float | None
    default: bool  # the enqueued trainer defaults
    retry_of: int | None
    reason: str | None
    slurm_job: str | None = None  # the attempt's Slurm job (--scheduler slurm)


@dataclass
class Best:
    number: int
    value: float
    params: dict[str, Any]
    slot: str
    checkpoint: str | None = None  # the copy, on the node (or the share)
    json_file: str | None = None
    evaluated: float | None = None  # the copy's validation loss, evaluated again
    problem: str | None = None  # why it could not be kept or evaluated


@dataclass
class Summary:
    study: str
    study_dir: str
    rows: list[Row]
    best: Best | None
    default_value: float | None  # the enqueued defaults' final val loss
    counts: dict[str, int]
    dashboard: str
    report_html: str | None = None
    notes: list[str] = field(default_factory=list)
    removed_checkpoints: int | None = None  # the trials' own checkpoints removed once the best was kept


def rows(st: Any) -> list[Row]:
    out = []
    for t in st.get_trials(deepcopy=False):
        value = t.value
        if value is None and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        attrs = t.user_attrs
        out.append(
            Row(
                t.number,
                t.state.name,
                value,
                dict(t.params),
                attrs.get("slot"),
                attrs.get("seconds"),
                bool(attrs.get("default")),
                attrs.get("retry_of"),
                attrs.get("reason"),
                attrs.get("slurm_job"),
            )
        )
    return out


def default_value(st: Any) -> float | None:
    """The defaults' final loss: the enqueued trial, or its retry, that completed."""
    from optuna.trial import TrialState

    firsts = [t.number for t in st.get_trials(deepcopy=False) if t.user_attrs.get("default")]
    for t in st.get_trials(deepcopy=False):
        root = t.user_attrs.get("retry_of", t.number)
        if root in firsts and t.state == TrialState.COMPLETE:
            return float(t.value)
    return None


def keep_best(
    st: Any,
    study: str,
    nodes: dict[str, Node],
    settings: trial_lib.TrialSettings,
    *,
    nfs_server: bool,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
) -> Best | None:
    """Copy the best complete trial's checkpoint to <its dir>/tune-<study>/best-step<N>.pt
    with best.json, then evaluate the copy; None when no trial completed."""
    from optuna.trial import TrialState

    complete = [t for t in st.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    t = min(complete, key=lambda x: x.value)
    slot_text = str(t.user_attrs.get("slot", ""))
    best = Best(t.number, float(t.value), dict(t.params), slot_text)
    source = t.user_attrs.get("checkpoint")
    node = nodes.get(slot_text.split(":", 1)[0])
    if node is None:
        best.problem = f"its node ({slot_text or 'unknown'}) was lost or is not in this sweep"
        return best
    name = trial_lib.ckpt_name(study, t.number)
    if not isinstance(source, str) or not checkpoint_ok(source, name):
        best.problem = f"the trainer reported no checkpoint of {name} ({source!r})"
        return best
    directory = f"{source.rsplit('/', 1)[0]}/tune-{study}"
    step = int(source.rsplit("-step", 1)[1].removesuffix(".pt"))
    doc = {"study": study, "trial": t.number, "val_loss": t.value, "flags": t.params, "source": source}
    say(node.name, f"keeping trial {t.number} as the study's best: {directory}/{BEST_NAME}-step{step:08d}.pt")
    r = remote.run(node, copy_command(node, source, directory, step, json.dumps(doc)), timeout=COPY_TIMEOUT_S)
    if not r.ok:
        best.problem = f"copying it failed: {(r.stderr or r.stdout).strip()[-300:]}"
        return best
    best.checkpoint = f"{directory}/{BEST_NAME}-step{step:08d}.pt"
    best.json_file = f"{directory}/{BEST_NAME}.json"
    slot = Slot(node.name)
    value, why = trial_lib.evaluate(
        node, slot, best.params, settings, directory, BEST_NAME, nfs_server=nfs_server, on_line=on_line, say=say
    )
    best.evaluated = value
    if value is None:
        best.problem = f"evaluating the copy failed: {why}"
    return best


def checkpoint_ok(path: str, name: str) -> bool:
    """A checkpoint the trial named ``name`` wrote: absolute, no '..', the trainer's file name."""
    pattern = rf"/(?:[A-Za-z0-9._-]+/)*{re.escape(name)}-step\d{{8}}\.pt"
    return len(path) < 1024 and "/../" not in f"{path}/" and re.fullmatch(pattern, path) is not None


def copy_command(node: Node, source: str, directory: str, step: int, doc: str) -> str:
    """Shell that copies the checkpoint (temporary name, then renamed: a reader never sees
    half a file), drops earlier bests and writes best.json, as the training user where the
    trainer ran as that user."""
    dest = f"{directory}/{BEST_NAME}-step{step:08d}.pt"
    tmp = f"{directory}/.{BEST_NAME}.tmp"
    inner = (
        f"set -e; mkdir -p -- {shlex.quote(directory)}; cp -- {shlex.quote(source)} {shlex.quote(tmp)}; "
        f"for old in {shlex.quote(directory)}/{BEST_NAME}-step*.pt; do "
        f'[ "$old" = {shlex.quote(dest)} ] || rm -f -- "$old"; done; '
        f"mv -f -- {shlex.quote(tmp)} {shlex.quote(dest)}; "
        f"printf '%s\\n' {shlex.quote(doc)} > {shlex.quote(directory)}/{BEST_NAME}.json"
    )
    return _as_training_user(node, inner)


def _as_training_user(node: Node, inner: str) -> str:
    """``inner`` as the training user where the trainer runs as that user (the SSH user is
    root), else as the SSH user."""
    user = shlex.quote(node.settings.training_user)
    return (
        f"RUN_AS=$({plan.run_as_probe(node.settings.training_user)}); "
        f'if [ -n "$RUN_AS" ]; then runuser -u {user} -- sh -c {shlex.quote(inner)}; '
        f"else sh -c {shlex.quote(inner)}; fi"
    )


def trial_files_regex(study: str) -> str:
    """A trial checkpoint of ``study`` and nothing else (POSIX ERE, the whole path): the
    trainer's <ckpt name>-step<8 digits>.pt for ckpt name tune-<study>-t<N>. A study name
    holds only letters, digits, '.', '_' and '-' (cli/tune.py): '.' is the one ERE meta."""
    return rf".*/tune-{study.replace('.', chr(92) + '.')}-t[0-9]+-step[0-9]{{8}}\.pt"


def remove_trials_command(node: Node, directories: list[str], study: str) -> str:
    """Shell that removes the study's trial checkpoints from ``directories`` (each one's own
    files, no subdirectory, no link followed: the kept best is in tune-<study>/), as the
    training user, printing each file it removed."""
    regex = shlex.quote(trial_files_regex(study))
    dirs = " ".join(shlex.quote(d) for d in directories)
    # From /: find goes back to where it started, and the SSH user's home (root's /root)
    # is not the training user's to enter: find removed the files, then failed.
    inner = (
        f'cd / && for d in {dirs}; do [ -d "$d" ] || continue; '
        f'find "$d" -maxdepth 1 -type f -regextype posix-extended -regex {regex} -print -delete; done'
    )
    return _as_training_user(node, inner)


def remove_trial_checkpoints(st: Any, study: str, nodes: dict[str, Node], say: Callable[[str, str], None]) -> int:
    """Once the best is kept: every trial's own checkpoints (complete and pruned ones alike)
    removed from the directories the trials reported, on each node that ran one, so a long
    study does not fill the disks or the share. Returns how many files went."""
    dirs: dict[str, set[str]] = {}
    for t in st.get_trials(deepcopy=False):
        source, where = t.user_attrs.get("checkpoint"), str(t.user_attrs.get("slot", "")).split(":", 1)[0]
        if isinstance(source, str) and where in nodes and checkpoint_ok(source, trial_lib.ckpt_name(study, t.number)):
            dirs.setdefault(where, set()).add(source.rsplit("/", 1)[0])
    removed = 0
    for name, found in remote.on_all(
        [nodes[n] for n in dirs],
        lambda n: remote.run(n, remove_trials_command(n, sorted(dirs[n.name]), study), timeout=COPY_TIMEOUT_S),
    ).items():
        if found.exited != 0:
            say(name, f"warning: removing the trials' checkpoints: {(found.stderr or found.stdout).strip()[-200:]}")
        removed += sum(1 for line in found.stdout.splitlines() if line.strip())
    return removed


def counts(all_rows: list[Row]) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in all_rows:
        found[r.state] = found.get(r.state, 0) + 1
    return found


def write(summary: Summary, st: Any, out_dir: Path) -> None:
    """tune.json and report.html in the study's directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tune.json").write_text(json.dumps(asdict(summary), indent=1, default=str))
    report = out_dir / "report.html"
    report.write_text(html_report(summary, plots(st)))
    summary.report_html = str(report)


def plots(st: Any) -> dict[str, str]:
    """Optuna's matplotlib plots as base64 PNG; a plot that cannot be drawn (too few
    complete trials for importances) is a line of text instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vm

    drawn: dict[str, str] = {}
    for title, func in (
        ("optimisation history", vm.plot_optimization_history),
        ("intermediate values", vm.plot_intermediate_values),
        ("parameter importances", vm.plot_param_importances),
        ("parallel coordinates", vm.plot_parallel_coordinate),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's ExperimentalWarning on every matplotlib plot
                func(st)
            fig = plt.gcf()  # the figure the plot drew on
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
            plt.close(fig)
            drawn[title] = "png:" + base64.b64encode(buf.getvalue()).decode()
        except Exception as e:  # one plot must not cost the report
            drawn[title] = f"not drawn: {type(e).__name__}: {e}"
    return drawn


def html_report(summary: Summary, drawn: dict[str, str]) -> str:
    e = html.escape
    head = [
        f"<h1>Study {e(summary.study)}</h1>",
        f"<p>{', '.join(f'{e(k)}: {v}' for k, v in sorted(summary.counts.items()))}</p>",
    ]
    if summary.best:
        b = summary.best
        head.append(
            f"<p>Best: trial {b.number}, val loss {b.value:.4f} on {e(b.slot)}"
            + (f"; the enqueued defaults: {summary.default_value:.4f}" if summary.default_value is not None else "")
            + (f"; kept as {e(b.checkpoint)}" if b.checkpoint else "")
            + (f", evaluated again: {b.evaluated:.4f}" if b.evaluated is not None else "")
            + (f"; {e(b.problem)}" if b.problem else "")
            + "</p>"
        )
    head.append(f"<p>Live study: <code>{e(summary.dashboard)}</code></p>")
    table = ["<table border=1 cellpadding=3><tr><th>#</th><th>state</th><th>val loss</th><th>flags</th>"]
    table.append("<th>slot</th><th>seconds</th><th>note</th></tr>")
    for r in summary.rows:
        note = "defaults" if r.default else (f"retry of {r.retry_of}" if r.retry_of is not None else "")
        if r.reason:
            note = f"{note}; {r.reason}" if note else r.reason
        table.append(
            f"<tr><td>{r.number}</td><td>{e(r.state)}</td><td>{'' if r.value is None else f'{r.value:.4f}'}</td>"
            f"<td>{e(trial_lib.flags_text(r.params))}</td><td>{e(r.slot or '')}</td>"
            f"<td>{'' if r.seconds is None else r.seconds}</td><td>{e(note)}</td></tr>"
        )
    table.append("</table>")
    figures = []
    for title, data in drawn.items():
        if data.startswith("png:"):
            figures.append(f"<h2>{e(title)}</h2><img alt='{e(title)}' src='data:image/png;base64,{data[4:]}'>")
        else:
            figures.append(f"<h2>{e(title)}</h2><p>{e(data)}</p>")
    return (
        "<!doctype html><meta charset=utf-8><title>provision tune</title>"
        + "".join(head)
        + "".join(table)
        + "".join(figures)
    )
