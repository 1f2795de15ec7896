"""The steps of `provision up`, in order, and how --only/--skip pick among them.

preflight, base, nvidia, frameworks (this module's owners), then volumes, nfs and backups
(the storage deploys), slurm, and monitoring last (its node collector reports on what the
others set up). Hosts that need it reboot right after the nvidia step, so the
frameworks step can check that torch sees CUDA. After the slurm step the head alone runs
its second pass (deploys/slurm/controller.py): slurmctld's restart or reconfigure waits
until every host of the wave has written its Slurm files.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from provision import controller_files, engine
from provision.deploys import backups, base, frameworks, monitoring, nfs, nvidia, preflight, slurm, volumes
from provision.deploys.slurm import controller as slurm_controller
from provision.engine import HostResult, RunReport, Step
from provision.errors import InputError, Problem, hosts_label
from provision.inventory import Cluster, Node
from provision.rules import backups as backup_layout
from provision.rules import frameworks as framework_rules
from provision.up import host_lock, reboots
from provision.up import rollout as staging
from provision.up.rollout import Rollout

STEPS: list[Step] = [
    preflight.step,
    base.step,
    nvidia.step,
    frameworks.step,
    volumes.step,
    nfs.step,
    backups.step,
    slurm.step,
    monitoring.step,
]


def step_names() -> list[str]:
    return [s.name for s in STEPS]


def _parse(names: str | None, option: str) -> list[str]:
    wanted = [n.strip() for n in (names or "").split(",") if n.strip()]
    if names is not None and not wanted:  # given empty: --only "" would mean every step
        raise InputError(Problem(f"{option} {names!r}", "names no step", f"steps are: {', '.join(step_names())}"))
    unknown = [n for n in wanted if n not in step_names()]
    if unknown:
        raise InputError(
            [Problem(f"{option} {n}", "unknown step", f"steps are: {', '.join(step_names())}") for n in unknown]
        )
    return wanted


def select(only: str | None = None, skip: str | None = None) -> list[Step]:
    """The steps to run, in pipeline order. Preflight runs unless skipped by name:
    `--only nvidia` still checks the hosts first."""
    only_names, skip_names = _parse(only, "--only"), _parse(skip, "--skip")
    chosen = []
    for s in STEPS:
        if s.name in skip_names:
            continue
        if only_names and s.name not in only_names and s.name != "preflight":
            continue
        chosen.append(s)
    return chosen


def check_inputs(cluster: Cluster, steps: list[Step] | None = None) -> None:
    """Controller-side inputs the steps need (all of them by default), checked before any
    host is contacted. `inventory check` calls it too, so what `up` and `plan` would refuse
    here, `inventory check` refuses."""
    names = {s.name for s in (STEPS if steps is None else steps)}
    problems = []
    if "frameworks" in names:
        problems += _framework_problems(cluster)
    if "nfs" in names:
        problems += _export_problems(cluster)
    if "backups" in names:
        problems += _backup_problems(cluster)
    if problems:
        raise InputError(problems)


def _export_problems(cluster: Cluster) -> list[Problem]:
    """The storage host exports only to the cluster network: without one (or with one
    that means everyone) the nfs step would refuse on the host, after earlier steps."""
    storage = cluster.storage_node()
    if storage is None or nfs.applies(storage) is not None:
        return []
    where = f"{cluster.path}: host {storage.name}: key cluster_cidr"
    return [
        Problem(where, why.removeprefix(f"{storage.name}: "))
        for why in nfs.export_problems(storage.settings, storage.name)
    ]


def _framework_problems(cluster: Cluster) -> list[Problem]:
    """The frameworks step's controller-side inputs, one line per problem however many
    hosts share it: a thousand hosts missing the same lock is one line naming a few."""
    hosts: dict[tuple[str, str, str], list[str]] = {}
    # Checked once per distinct set of the settings the checks read: hosts sharing a
    # wheelhouse or a lock (the usual case) would otherwise hash every wheel, or read and
    # parse the lock, once per host.
    checked: dict[tuple[object, ...], list[tuple[str, str, str]]] = {}
    for node in cluster.nodes:
        s = node.settings
        inputs = (
            s.wheelhouse,
            s.pip_lock_file,
            s.pip_require_hashes,
            s.torch_version,
            s.numpy_version,
            s.nvml_version,
            s.tensorboard_version,
        )
        if inputs not in checked:
            checked[inputs] = _wheelhouse_problems(node) + _lock_problems(node)
        for problem in checked[inputs]:
            hosts.setdefault(problem, []).append(node.name)
    return [
        Problem(f"{cluster.path}: {hosts_label(names)}: key {key}", what, fix)
        for (key, what, fix), names in hosts.items()
    ]


def _wheelhouse_problems(node: Node) -> list[tuple[str, str, str]]:
    """A wheelhouse must hold a wheel for each pinned package: found here, a missing pin
    is one line on the controller instead of pip failing on every host. (key, what, fix)."""
    house = node.settings.wheelhouse
    if not house:
        return []
    names = [w.name for w in Path(house).expanduser().glob("*.whl")]
    if not names:
        return [
            ("wheelhouse", f"{house} holds no .whl files", "build it with pip download/pip wheel, or unset wheelhouse")
        ]
    gaps = framework_rules.wheelhouse_gaps(node.settings, names)
    unsure = framework_rules.sums_problem(house)
    if not gaps and unsure:
        return [
            ("wheelhouse", unsure, f"sha256sum *.whl > {framework_rules.SUMS_FILE} where the wheels were downloaded")
        ]
    if not gaps:
        return []
    wanted = " ".join(shlex.quote(g) for g in gaps)
    return [
        (
            "wheelhouse",
            f"{house} has no wheel for {', '.join(gaps)}",
            f"pip download {wanted} --only-binary=:all: --python-version <hosts' python3> "
            f"-d {shlex.quote(house)}, or change the pins",
        )
    ]


LOCK_MAX_BYTES = 8 * 2**20  # a universal lock of torch and CUDA is about 50 KB


def _lock_problems(node: Node) -> list[tuple[str, str, str]]:
    """An install from an index is checked against pip_lock_file's hashes: the lock must be
    readable, hold pinned and hashed lines only, and pin what the settings pin. Without a
    lock, the install is refused unless pip_require_hashes is false. (key, what, fix)."""
    s = node.settings
    if s.wheelhouse:
        return []
    if not s.pip_lock_file:
        if not s.pip_require_hashes:
            return []
        return [
            (
                "pip_lock_file",
                "pip would install from an index without checking any file's hash",
                "set pip_lock_file (uv pip compile --universal --generate-hashes -o pip-lock.txt, from the pins), "
                "or a wheelhouse; pip_require_hashes = false takes the index's files unchecked",
            )
        ]
    path = Path(s.pip_lock_file).expanduser()
    try:
        text = controller_files.read_small_text(path, LOCK_MAX_BYTES)
    except controller_files.Unreadable as e:
        return [("pip_lock_file", str(e), "write the lock, or unset pip_lock_file")]
    fix = "make it again from the pins (uv pip compile --universal --generate-hashes)"
    return [("pip_lock_file", f"{path}: {problem}", fix) for problem in framework_rules.lock_problems(s, text)]


def _backup_problems(cluster: Cluster) -> list[Problem]:
    """The backups step's controller-side inputs on each host that backs up: the password
    file and a repository, found here rather than after other steps changed the hosts."""
    problems = []
    for node in cluster.nodes:
        if backup_layout.skip_reason(node, cluster) is not None:
            continue
        problem = backup_layout.password_problem(node, cluster)
        problems += [problem] if problem else []
        try:
            backup_layout.repository(node, cluster)
        except InputError as e:
            problems += e.problems
    return problems


def up(
    cluster: Cluster,
    steps: list[Step],
    on_event: Callable[[str, str], None] = lambda host, text: None,
    reboot_batch: int | None = None,
    rollout: Rollout = Rollout(),
    locks: host_lock.HostLocks | None = None,
) -> RunReport:
    """Run the steps over every host, wave by wave when the rollout is staged (canary,
    waves; see up/rollout.py); reboot where needed after the nvidia step.

    With ``locks`` (taken by the command, up/host_lock.py), a host whose lock another run
    holds fails at once with that run named and the others go on; a host that reboots
    takes its lock again before the next step."""
    check_inputs(cluster, steps)
    refused = locks.refused if locks is not None else {}
    for name, why in refused.items():
        on_event(name, f"{host_lock.STEP}: {why}")
    free = cluster.part([n for n in cluster.nodes if n.name not in refused])
    report = staging.run(free, rollout, lambda wave: _up_wave(wave, steps, on_event, reboot_batch, locks), on_event)
    results = dict(report.hosts)
    for name, why in refused.items():
        results[name] = HostResult(name)
        results[name].reachable = locks is None or name not in locks.unreachable
        results[name].fail(host_lock.STEP, why)
    return RunReport({n.name: results[n.name] for n in cluster.nodes})


def _up_wave(
    cluster: Cluster,
    steps: list[Step],
    on_event: Callable[[str, str], None],
    reboot_batch: int | None,
    locks: host_lock.HostLocks | None,
) -> RunReport:
    """Every step over the cluster's hosts (one wave of a rollout)."""
    before: dict[str, int] = {}

    def after_step(step: Step, results: dict[str, HostResult]) -> None:
        if step.name == slurm.step.name:
            slurm_after(cluster, results, on_event)
        if step.name != "nvidia":  # the counts just before the nvidia step
            before.update({n: r.changed for n, r in results.items()})
            return
        changed = {n: r.changed > before.get(n, 0) and "nvidia" in r.steps for n, r in results.items()}
        reboots.reboot_where_needed(list(cluster.nodes), results, changed, reboot_batch, on_event)
        if locks is None:
            return
        # A reboot ended the lock's session on those hosts: taken again before the next step.
        for name, why in locks.renew([n for n in cluster.nodes if results[n.name].rebooted]).items():
            results[name].fail(host_lock.STEP, f"after the reboot: {why}")
            on_event(name, f"{host_lock.STEP}: after the reboot: {why}")

    return engine.run_steps(cluster, steps, on_event, after_step)


def slurm_after(cluster: Cluster, results: dict[str, HostResult], on_event: Callable[[str, str], None]) -> None:
    """After the slurm step on every host of the wave: the head's second pass (slurmctld
    restarted or reconfigured for the files the hosts wrote), where the head is in the wave
    and its slurm step ran to the end (not skipped, not failed). Its changes count as the
    slurm step's."""
    head, _ = cluster.head_node()
    here = [n for n in cluster.nodes if n.name == head.name]
    if not here or not results[head.name].ok or slurm.step.name not in results[head.name].steps:
        return
    run = engine.RunContext(cluster, (slurm_controller.CONTROLLER_STEP.name,))
    engine.run_step(slurm_controller.CONTROLLER_STEP, here, results, on_event, run=run)


def plan(
    cluster: Cluster, steps: list[Step], on_event: Callable[[str, str], None] = lambda host, text: None
) -> dict[str, engine.HostPlan]:
    """What `up` would change, per host and step; changes nothing.

    No after_step runs here: no reboots, and no head's second pass after the slurm step
    (slurm_after). The slurm step itself shows the head's reconfigure as "scontrol
    reconfigure due" where slurm.conf or cgroup.conf would change; slurmctld's restarts (a
    changed node list, accounting turned on or off) are not shown."""
    check_inputs(cluster, steps)
    return engine.plan_steps(cluster, steps, on_event)
