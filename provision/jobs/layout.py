"""Where a job lives on the cluster and the shell text that runs it. Pure: nothing here
touches a host, so all of it is tested directly.

A job's directory (``PROVISION_RUN_DIR``) is the job user's, on a share every node mounts
when the cluster has one (``runs``, else ``scratch``), else on each node's own disk::

    <root>/jobs/<run id>/
        workdir/        the synced workdir; the job runs here
        outputs/        what the job keeps (the saved model): copied back when small
        tb/             TensorBoard events
        logs/<node>.log every node's lines
        exit/<node>     each node's exit status, once its part ended
        metrics.jsonl   JSON lines the job writes ({"step": 100, "val_loss": 2.31})
        job.json        what was started (id, name, user, nodes, scheduler, Slurm job)
    <root>/envs/<hash>/ the job's venv, layered on the validated torch venv, by requirements

What root runs on a node (the launcher, the pid file, the reaper) stays in the node's
root-owned run directory (``launch.plan.run_dir``); nothing in the job's directory is ever
run or trusted by root.
"""

from __future__ import annotations

import hashlib
import secrets
import shlex
import time
from dataclasses import dataclass

from provision.jobs.task import Task
from provision.launch import plan as launch_plan
from provision.settings import Settings

SHARES = ("runs", "scratch")  # nfs_exports that hold jobs, in order of preference
RUN_FILE = launch_plan.RUN_FILE  # the launcher's pid (= its pgid), read by the reaper
MARK = "[provision]"  # lines the node scripts print about themselves
ENV_DONE = ".provision-complete"  # in an env directory: pip finished there


def new_run_id(now: float | None = None) -> str:
    """job-YYYYmmdd-HHMMSS-xxxxxx: sortable, unique, and safe in a path and a Slurm name."""
    return f"job-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Where:
    """The cluster's place for jobs."""

    root: str  # <share>/provision, or <train_dir>/work/provision on each node
    shared: bool  # one directory every node sees (an NFS share), else one per node
    mount_root: str | None = None  # where every node sees the shares (nfs_mount_root); None: no shares

    def on_share(self, path: str) -> bool:
        """Whether a node path is on a share: one node's write is every node's."""
        root = self.mount_root
        return root is not None and (path + "/").startswith(root.rstrip("/") + "/")

    def job_dir(self, run_id: str) -> str:
        return f"{self.root}/jobs/{run_id}"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"


def where(settings: Settings, has_nfs_server: bool) -> Where:
    """The runs share (else scratch) when the cluster exports one, else each node's own
    work directory under train_dir (the training user's)."""
    mounts = settings.nfs_mount_root.rstrip("/") if has_nfs_server else None
    if mounts is not None:
        for share in SHARES:
            if share in settings.nfs_exports:
                return Where(f"{mounts}/{share}/provision", True, mounts)
    return Where(f"{launch_plan.work_dir(settings.train_dir)}/provision", False, mounts)


def requirements_text(task: Task, workdir_requirements: str | None) -> str:
    """What the job's venv installs: the workdir's requirements.txt, then the task's pip list."""
    parts = [workdir_requirements.strip()] if workdir_requirements and workdir_requirements.strip() else []
    parts += list(task.pip)
    return "\n".join(parts) + "\n" if parts else ""


def env_key(base_python: str, requirements: str, find_links: str | None) -> str:
    """The env's name: the hash of what it is built from, so the same requirements on the
    same base venv find the env built before, and a change builds a new one."""
    h = hashlib.sha256(f"{base_python}\0{find_links or ''}\0{requirements}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class NodeJob:
    """One node's part of a job."""

    name: str  # inventory name
    rank: int  # SKYPILOT_NODE_RANK / NODE_RANK
    address: str  # cluster address
    interface: str  # cluster NIC (NCCL/GLOO_SOCKET_IFNAME)
    gpus: int  # GPUs this node's part uses
    run_dir: str  # root's run directory on the node (launcher pid, reaper, uploads)
    run_as: str | None  # the training user when the SSH user is root; else the SSH user runs it


@dataclass(frozen=True)
class JobPlan:
    """The whole job, as every node runs it."""

    run_id: str
    task: Task
    where: Where
    nodes: tuple[NodeJob, ...]
    port: int  # MASTER_PORT
    base_python: str  # the validated venv's python on the nodes
    requirements: str  # "" when the job adds nothing to the base venv
    find_links: str | None  # the nodes' wheelhouse (air-gapped: --no-index), else pip's index
    index_url: str | None  # the inventory's pip index

    @property
    def job_dir(self) -> str:
        return self.where.job_dir(self.run_id)

    @property
    def env_dir(self) -> str | None:
        if not self.requirements:
            return None
        return f"{self.where.root}/envs/{env_key(self.base_python, self.requirements, self.find_links)}"


def job_env(p: JobPlan, node: NodeJob) -> dict[str, str]:
    """Every variable a node's part sees, provision's after the task's (they win)."""
    gpus = node.gpus
    env = dict(p.task.envs)
    if node.interface:  # under Slurm the node's TaskProlog gives it (jobs.slurm)
        env.setdefault("NCCL_SOCKET_IFNAME", node.interface)
        env.setdefault("GLOO_SOCKET_IFNAME", node.interface)
    if node.rank >= 0:  # under Slurm, the allocation's script sets these from its node list
        env |= {"SKYPILOT_NODE_IPS": "\n".join(n.address for n in p.nodes), "MASTER_ADDR": p.nodes[0].address}
    env |= {
        "SKYPILOT_NODE_RANK": str(node.rank),
        "SKYPILOT_NUM_NODES": str(p.task.num_nodes),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
        "MASTER_PORT": str(p.port),
        "NODE_RANK": str(node.rank),
        "NNODES": str(p.task.num_nodes),
        "NPROC_PER_NODE": str(max(1, gpus)),
        "PROVISION_RUN_ID": p.run_id,
        "PROVISION_NODE": node.name,
        "PROVISION_RUN_DIR": p.job_dir,
        "PROVISION_METRICS": f"{p.job_dir}/metrics.jsonl",
        "PYTHONUNBUFFERED": "1",
    }
    return env


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def _activate(p: JobPlan) -> str:
    """The job's python first on PATH: its own env, else the validated base venv."""
    base_bin = p.base_python.rsplit("/", 1)[0]  # torchrun and the base's other scripts
    bins = f"{p.env_dir}/bin:{base_bin}" if p.env_dir else base_bin
    venv = p.env_dir or p.base_python.rsplit("/", 2)[0]
    return f'export VIRTUAL_ENV={shlex.quote(venv)}\nexport PATH={shlex.quote(bins)}:"$PATH"\n'


def _home() -> str:
    return 'export HOME="$(getent passwd "$(id -u)" | cut -d: -f6)" USER="$(id -un)" LOGNAME="$(id -un)"\n'


LOCK_WAIT_S = 3600  # a build of the same env by another job or node, waited for


def env_build(p: JobPlan, here: bool = True) -> str:
    """Shell (as the job user) that makes the job's venv once, under a lock: a second run
    with the same requirements finds it done and installs nothing. A failed pip leaves no
    half env behind, and its last lines are the node's. ``here`` False: another node of a
    shared job directory builds it (the first node, or the one that submits to Slurm).

    The lock is a directory (mkdir is atomic on the share's server for every node: flock
    is not, between the storage node's local path and the NFS clients); one left by a
    killed build is named after the wait, to be removed by hand."""
    if p.env_dir is None:
        return f"echo '{MARK} environment: the validated venv ({p.base_python})'\n"
    if not here:
        return f"echo '{MARK} environment {p.env_dir}: built on the first node'\n"
    e, lock = shlex.quote(p.env_dir), shlex.quote(f"{p.env_dir}.lock")
    where = f"--no-index --find-links {shlex.quote(p.find_links)}" if p.find_links else ""
    if p.index_url and not p.find_links:
        where = f"--index-url {shlex.quote(p.index_url)}"
    req = shlex.quote(f"{p.env_dir}.requirements.{p.run_id}")
    return (
        f"mkdir -p -- {shlex.quote(p.where.root + '/envs')}\n"
        f"n=0; until mkdir {lock} 2>/dev/null; do n=$((n + 1)); if [ $n -gt {LOCK_WAIT_S // 2} ]; then "
        f'echo "{MARK} environment: {p.env_dir}.lock held for an hour: remove it if no job is building there"; '
        "exit 3; fi; sleep 2; done\n"
        f"trap 'rmdir {lock} 2>/dev/null' EXIT\n"
        f'if [ -f {e}/{ENV_DONE} ]; then echo "{MARK} environment {p.env_dir}: cached"\n'
        f"else\n"
        f'  echo "{MARK} environment {p.env_dir}: building on $PROVISION_NODE"\n'
        f"  rm -rf -- {e} && printf '%s' {shlex.quote(p.requirements)} > {req} && "
        f"{shlex.quote(p.base_python)} -m venv {e} && {_layer(p.base_python, p.env_dir)} && "
        f"{e}/bin/python -m pip install --disable-pip-version-check --no-input {where} -r {req} "
        f"&& touch {e}/{ENV_DONE} || {{ rc=$?; rm -rf -- {e} {req}; "
        f'echo "{MARK} environment: pip failed on $PROVISION_NODE (exit $rc)"; exit 3; }}\n'
        f"  rm -f -- {req}\n"
        f"fi\n"
        f"rmdir {lock}; trap - EXIT\n"
    )


def _layer(base_python: str, env_dir: str) -> str:
    """The base venv's packages seen from the job's env: a .pth file naming the base's
    site-packages. (``--system-site-packages`` would show the system python's, not the
    validated venv's: the base is itself a venv.) pip then finds torch installed and keeps it."""
    base = f"{shlex.quote(base_python)} -c 'import site; print(chr(10).join(site.getsitepackages()))'"
    own = f"{shlex.quote(env_dir + '/bin/python')} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
    # The base's torchrun would start the workers with the base's python (its shebang):
    # the env's own runs them with the env's, which sees both.
    torchrun = shlex.quote(f"{env_dir}/bin/torchrun")
    wrapper = shlex.quote(f'#!/bin/sh\nexec "{env_dir}/bin/python" -m torch.distributed.run "$@"\n')
    return f'{base} > "$({own})/provision-base.pth" && printf %b {wrapper} > {torchrun} && chmod 755 {torchrun}'


def prepare_script(p: JobPlan, node: NodeJob, extract: bool, build_env: bool = True, record: str = "") -> str:
    """A node's preparation, as the job user: its directories, the workdir unpacked from
    the root-owned upload (``extract``: on the first node of a shared job directory, on
    every node of local ones), the file mounts (those on a share once, the others on every
    node), the env (``build_env``: here; else the first node of the share built it), then
    ``setup``. ``record``: the run's job.json, written on the first node (what `runs` lists)."""
    j = shlex.quote(p.job_dir)
    lines = [
        "set -u\numask 022\n",
        _home(),
        _exports(job_env(p, node)),
        f"mkdir -p -- {j}/workdir {j}/outputs {j}/tb {j}/logs {j}/exit || exit 3\n",
    ]
    if extract and p.task.workdir is not None:
        lines.append(f"tar -xzf {shlex.quote(node.run_dir)}/workdir.tar.gz -C {j}/workdir || exit 3\n")
    for i, (target, _) in enumerate(p.task.file_mounts):
        if p.where.on_share(target) and not extract:
            continue  # the first node put it on the share
        dest = shlex.quote(target) if target.startswith("/") else f'"$HOME"/{shlex.quote(target[2:])}'
        upload = shlex.quote(f"{node.run_dir}/mount-{i}.tar.gz")
        lines.append(f"mkdir -p -- {dest} && tar -xzf {upload} -C {dest} || exit 3\n")
    if record:
        lines.append(f"printf '%s\\n' {shlex.quote(record)} > {j}/job.json || exit 3\n")
    lines += [f"cd {j}/workdir || exit 3\n", env_build(p, here=build_env)]
    if p.task.setup:
        lines += [
            _activate(p),
            f"echo '{MARK} setup'\n",
            f'( {_subshell(p.task.setup)} ) || {{ rc=$?; echo "{MARK} setup failed (exit $rc)"; exit 4; }}\n',
        ]
    return "".join(lines)


def _subshell(script: str) -> str:
    """The user's script, run by its own bash (as SkyPilot runs a task's block)."""
    return f"bash -c {shlex.quote(script)}"


def run_script(p: JobPlan, node: NodeJob) -> str:
    """A node's part of ``run``, as the job user, in the workdir: every line also into the
    node's log in the job directory, and the exit status into exit/<node> (what `runs`
    reads, with the controller closed)."""
    j = shlex.quote(p.job_dir)
    n = shlex.quote(node.name)
    return (
        "set -u\numask 022\n"
        + _home()
        + _exports(job_env(p, node))
        + _activate(p)
        + f"cd {j}/workdir || exit 3\n"
        + "set -o pipefail\n"
        + f"{_subshell(p.task.run)} 2>&1 | tee -a {j}/logs/{n}.log\n"
        + "rc=$?\n"
        + f'echo "$rc" > {j}/exit/{n}\n'
        + 'exit "$rc"\n'
    )


def launcher(p: JobPlan, node: NodeJob, script: str, detach: bool = False) -> str:
    """The command the SSH user runs to start ``script`` on a node: a session and process
    group of its own whose id goes to the root-owned run file first (teardown and `cancel`
    stop that group, never by name), the run's markers in the environment of every process
    (the reaper signals only what carries them), and the job user's environment made from
    nothing (root's SSH variables never reach the job). ``detach``: started and left."""
    markers = [f"PROVISION_RUN_ID={p.run_id}", f"PROVISION_NODE={node.name}"]
    user = ["runuser", "-u", node.run_as, "--"] if node.run_as else []
    clean = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", *markers]
    record = f'echo $$ > {shlex.quote(node.run_dir)}/{RUN_FILE} && exec "$@"'
    inner = ["env", *markers, "setsid", *([] if detach else ["--wait"]), "sh", "-c", record, "provision-job"]
    inner += [*user, *clean, "bash", "-c", script, f"provision-job-{node.name}"]
    tail = " >/dev/null 2>&1 </dev/null" if detach else " 2>&1"
    return f"cd / && exec {shlex.join(inner)}{tail}"


def slurm_time(seconds: int | None) -> str | None:
    """sbatch --time from seconds, rounded up to whole minutes (Slurm's unit)."""
    if seconds is None:
        return None
    minutes = -(-seconds // 60)
    return f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00"
