"""What runs where: the run id, each node's torchrun command line, and the pure helpers
that build them. Nothing here touches a host, so all of it is tested directly."""

from __future__ import annotations

import ast
import json
import re
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import cast

from provision.resources import training_script
from provision.settings import Settings

RUN_FILE = "torchrun.pid"  # in the node's run dir: torchrun's pid, which is also its pgid
MARKERS = ("PROVISION_RUN_ID", "PROVISION_NODE")  # in every run process's environment (reaper)
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"  # torchrun --tee prefixes each worker line with it


@dataclass(frozen=True)
class NodePlan:
    """One node's part of a run."""

    name: str  # inventory name; the trainer reports per-node figures under it
    address: str  # cluster address: rendezvous endpoint (first node) and --local-addr
    interface: str  # cluster NIC: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    python: str  # interpreter of the frameworks venv on the node
    nproc: int  # worker processes (one per GPU; 1 on a CPU node)
    run_dir: str  # node directory of this run: trainer copy, pid file, torchrun logs
    work_dir: str  # the trainer's working directory: ./data and ./checkpoints live here
    is_host: bool  # hosts the c10d rendezvous store (the first node)
    writable: tuple[str, ...] = ()  # the shares (Share.share) the trainer's user may write
    run_as: str | None = None  # the training user, when the SSH user is root (see run_as_probe)
    gpus: int = 0  # whole GPUs nvidia-smi lists (a Slurm run asks for them: --gres=gpu:N)


@dataclass(frozen=True)
class Elastic:
    """An elastic run (``--min-nodes``): torchrun restarts the workers of the nodes left
    after one is lost, from the run's newest checkpoint, while at least ``min_nodes`` are."""

    min_nodes: int  # torchrun --nnodes MIN:N; fewer left ends the run
    max_restarts: int  # torchrun --max-restarts: worker-group restarts each agent allows
    store_ports: tuple[tuple[str, int], ...] = ()  # node -> its loopback port to the store (launch.store)

    def port(self, node: str) -> int:
        return dict(self.store_ports)[node]


# Seconds an elastic rendezvous waits, once min_nodes have joined, for the others: short,
# since every live node rejoins within seconds of a restart, and the lost one never does.
LAST_CALL_S = 10


@dataclass(frozen=True)
class RunPlan:
    """The whole run: the same rendezvous for every node."""

    run_id: str  # unique; the c10d rendezvous id and the marker of every process
    master: str  # first node's cluster address
    port: int  # rendezvous port (settings.train_master_port of the first node)
    nodes: tuple[NodePlan, ...]  # in inventory order
    trainer_args: tuple[str, ...]  # arguments of train_ddp.py, the same on every node
    env: tuple[tuple[str, str], ...] = ()  # more environment for torchrun (a tune trial's CUDA_VISIBLE_DEVICES)
    # One process, the trainer alone without torchrun (a sweep's one-rank trial): it saves a
    # torch import per run (tens of seconds on an emulated node), and its lines carry no
    # rank prefix: they are rank 0's (unprefixed).
    solo: bool = False
    elastic: Elastic | None = None  # --min-nodes; None: every node, the first failure ends the run

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    @property
    def unprefixed(self) -> str:
        """Who speaks in a node's output lines that carry no [rankN]: prefix: torchrun
        itself, or, when the trainer runs alone, rank 0."""
        return "rank0" if self.solo else "torchrun"


def new_run_id(now: float | None = None) -> str:
    """train-YYYYmmdd-HHMMSS-xxxx: sortable, and unique enough to scan /proc for."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"train-{stamp}-{secrets.token_hex(3)}"


def model_sizes() -> dict[str, tuple[int, int, int, int]]:
    """The trainer's MODEL_SIZES, read from its source (importing it would import torch)."""
    tree = ast.parse(training_script().read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODEL_SIZES":
            return cast("dict[str, tuple[int, int, int, int]]", ast.literal_eval(node.value))
    raise RuntimeError("MODEL_SIZES not found in train_ddp.py")


@dataclass(frozen=True)
class Share:
    """A trainer directory that lives on an NFS share (the `nfs` step's nfs_exports)."""

    flag: str  # train_ddp.py option that takes it
    share: str  # the share's mount point on the nodes; it must be writable there
    path: str  # the option's value, inside the share
    per_run: bool = False  # the run's id is appended: a directory of its own for each run


# trainer option, share name in nfs_exports, sub-directory (the trainer's own default layout)
_SHARED_DIRS = (("--ckpt-dir", "checkpoints", ""), ("--data-cache", "datasets", "/train_ddp"))
# TensorBoard's event files: on the runs share when it is exported (tensorboard/<run id>,
# beside every other run's: one --logdir shows them all), else in the trainer's working
# directory on each node (rank 0's is copied back).
EVENTS_SHARE = "runs"
EVENTS_DIR = "tensorboard"


def shares(settings: Settings, has_nfs_server: bool, extra: tuple[str, ...]) -> tuple[Share, ...]:
    """Checkpoint and token-cache directories on the NFS shares, from the settings: only
    when the cluster has an NFS server and the share is exported, and only for options the
    user did not pass after `--`."""
    if not has_nfs_server:
        return ()
    root = settings.nfs_mount_root.rstrip("/")
    found = [
        Share(flag, f"{root}/{name}", f"{root}/{name}{sub}")
        for flag, name, sub in _SHARED_DIRS
        if name in settings.nfs_exports and not _given(flag, extra)
    ]
    if settings.tensorboard_version and EVENTS_SHARE in settings.nfs_exports and not _given("--tensorboard", extra):
        found.append(Share("--tensorboard", f"{root}/{EVENTS_SHARE}", f"{root}/{EVENTS_SHARE}/{EVENTS_DIR}", True))
    return tuple(found)


def _given(flag: str, extra: tuple[str, ...]) -> bool:
    return any(a == flag or a.startswith(f"{flag}=") for a in extra)


def share_args(
    wanted: tuple[Share, ...], nodes: tuple[NodePlan, ...], run_id: str = ""
) -> tuple[tuple[str, ...], list[str]]:
    """(trainer options, notes): a share every node can write goes to the trainer; one that
    some node cannot write is left out with a note (the trainer then says where it writes)."""
    args: list[str] = []
    notes = []
    for s in wanted:
        if s.per_run:
            s = Share(s.flag, s.share, f"{s.path}/{run_id}")
        missing = [n.name for n in nodes if s.share not in n.writable]
        if missing:
            notes.append(
                f"{s.share} is not writable on {', '.join(missing)} (not mounted, or "
                f"root_squash and an SSH user other than the share's owner); the trainer "
                f"keeps {s.flag} on each node's local disk"
            )
        else:
            args += [s.flag, s.path]
    return tuple(args), notes


def events_args(settings: Settings, shared: tuple[str, ...], extra: tuple[str, ...], run_id: str) -> tuple[str, ...]:
    """--tensorboard for the trainer: already among ``shared`` (the runs share), else the
    trainer's working directory; none when tensorboard is not installed (its pin is null)
    or the user passed --tensorboard after `--`."""
    if "--tensorboard" in shared or not settings.tensorboard_version or _given("--tensorboard", extra):
        return ()
    return ("--tensorboard", f"{EVENTS_DIR}/{run_id}")


def events_dir(run: RunPlan, node: NodePlan) -> str | None:
    """Where the trainer writes its events on ``node`` (absolute), or None without any."""
    args = list(run.trainer_args)
    if "--tensorboard" not in args[:-1]:
        return None
    where = args[len(args) - 1 - args[::-1].index("--tensorboard") + 1]  # the last one wins, as argparse
    return where if where.startswith("/") else f"{node.work_dir}/{where}"


def trainer_args(
    *,
    steps: int,
    model: str,
    world: int,
    batch_per_rank: int,
    resume: bool,
    run_id: str,
    ckpt_name: str,
    summary: str,
    shared: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    requeue: bool = False,
    elastic: bool = False,
    ckpt_every: int = 0,
    drop_stragglers: float | None = None,
) -> tuple[str, ...]:
    """train_ddp.py arguments. The global batch grows with the world (weak scaling), so a
    rank does the same work on 1 node or on N, which is what scaling efficiency compares.
    ``shared`` are the directories on NFS (``share_args``). ``extra`` comes last, so the
    user's own flags win.

    ``requeue`` (a Slurm job that may be requeued): every start of the trainer, the first
    and each restart, takes the same arguments, so each continues from the newest
    checkpoint this run wrote (--auto-resume-own; none yet: step 0). Not any checkpoint of
    the name: the name is shared by runs of one inventory and model, and a restart before
    this run's first save must not continue an earlier run. With ``resume`` the run
    continues an earlier checkpoint anyway, and --resume does so on every start.

    ``elastic`` restarts the workers the same way (torchrun starts them again after a
    lost node), so it resumes as ``requeue`` does. ``ckpt_every`` > 0 saves a checkpoint
    every that many steps (--ckpt-interval)."""
    args = [
        "--steps",
        str(steps),
        "--model",
        model,
        "--global-batch",
        str(batch_per_rank * world),
        "--micro-batch",
        str(batch_per_rank),
        "--run-id",
        run_id,
        "--ckpt-name",
        ckpt_name,
        "--summary",
        summary,
        *shared,
    ]
    if ckpt_every:
        args += ["--ckpt-interval", str(ckpt_every)]
    if drop_stragglers is not None:
        args += ["--drop-stragglers", f"{drop_stragglers:g}"]
    if resume:
        args.append("--resume")
    elif requeue or elastic:
        args.append("--auto-resume-own")
    return (*args, *extra)


def node_env(plan: RunPlan, node: NodePlan) -> dict[str, str]:
    """Environment of torchrun and its workers on one node."""
    return {
        "NCCL_SOCKET_IFNAME": node.interface,
        "GLOO_SOCKET_IFNAME": node.interface,
        "PROVISION_RUN_ID": plan.run_id,  # with PROVISION_NODE: how the reaper finds strays
        "PROVISION_NODE": node.name,
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
        "PYTHONUNBUFFERED": "1",
        # An elastic run's restarts: each rendezvous round picks its rank 0 afresh, and the
        # workers' own store must be on that round's rank-0 node, not on the node that was
        # rank 0 at the first round (by default the agents keep that first address, and a
        # round after its node was lost could never start).
        **({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if plan.elastic else {}),
        **dict(plan.env),
    }


def rendezvous_args(plan: RunPlan, node: NodePlan) -> list[str]:
    """torchrun's rendezvous: on the first node's cluster address, or for an elastic run on
    the controller's store, which each node reaches on its own loopback (launch.store)."""
    e = plan.elastic
    if e is None:
        nnodes, endpoint, restarts = str(len(plan.nodes)), f"{plan.master}:{plan.port}", 0
        # Explicit: namespace hosts (and some clusters) share one host name, so torch's
        # guess of "is this my address" cannot be trusted.
        conf = f"is_host={int(node.is_host)}"
    else:
        nnodes, endpoint, restarts = (
            f"{e.min_nodes}:{len(plan.nodes)}",
            f"127.0.0.1:{e.port(node.name)}",
            e.max_restarts,
        )
        conf = f"is_host=0,last_call_timeout={LAST_CALL_S}"  # no agent hosts it: the store is the controller's
    return [
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        plan.run_id,
        "--rdzv-conf",
        conf,
        "--max-restarts",
        str(restarts),
    ]


def torchrun_argv(plan: RunPlan, node: NodePlan) -> list[str]:
    return [
        node.python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(node.nproc),
        *rendezvous_args(plan, node),
        "--local-addr",
        node.address,
        "--tee",
        "3",
        "--log-dir",
        f"{node.run_dir}/torchrun-logs",
        f"{node.run_dir}/train_ddp.py",
        *plan.trainer_args,
    ]


def trainer_argv(plan: RunPlan, node: NodePlan) -> list[str]:
    """The trainer alone, one process without torchrun (RunPlan.solo)."""
    return [node.python, f"{node.run_dir}/train_ddp.py", *plan.trainer_args]


def launch_argv(plan: RunPlan, node: NodePlan) -> list[str]:
    """What a node starts for this run: torchrun, or the trainer alone for a solo run."""
    return trainer_argv(plan, node) if plan.solo else torchrun_argv(plan, node)


def node_command(plan: RunPlan, node: NodePlan) -> str:
    """The shell command that starts torchrun on a node.

    torchrun runs under ``setsid`` in a session and process group of its own, whose id
    (torchrun's pid) goes to the run file before torchrun starts; teardown kills that
    group and its workers' groups by id, never by name. ``--wait`` keeps the SSH command
    open until torchrun exits, with its exit status. The run's markers are set before
    setsid, so every process of the chain (the recorded pid included) carries them in its
    environment: the reaper signals a recorded pid only when it does. The directories
    exist already (``node_dirs_command``); nothing here changes an owner. A solo run starts
    the trainer alone in torchrun's place (``launch_argv``), under the same setsid, user
    and markers.
    """
    markers = [f"{k}={v}" for k, v in node_env(plan, node).items() if k in MARKERS]
    env = [f"{k}={v}" for k, v in node_env(plan, node).items()]
    record = f'echo $$ > {shlex.quote(node.run_dir)}/{RUN_FILE} && exec "$@"'
    # runuser keeps the process group setsid made, so teardown (as root) still reaches it.
    user = ["runuser", "-u", node.run_as, "--"] if node.run_as else []
    inner = [
        "env",
        *markers,
        "setsid",
        "--wait",
        "sh",
        "-c",
        record,
        "provision-train",
        *user,
        "env",
        *env,
        *launch_argv(plan, node),
    ]
    return f"cd {shlex.quote(node.work_dir)} && exec {shlex.join(inner)} 2>&1"


def run_dir(train_dir: str, run_id: str, node: str) -> str:
    """A node's directory of one run (trainer copy, reaper, pid file): root's, not the
    training user's, so what root later reads or writes there (a tune trial's stop file)
    cannot be swapped for a link by that user."""
    return f"{train_dir}/runs/{run_id}/{node}"


def work_dir(train_dir: str) -> str:
    """The trainer's working directory (./data, ./checkpoints, summary.json): the one
    directory under train_dir that the training user owns."""
    return f"{train_dir.rstrip('/')}/work"


def node_dirs_command(train_dir: str, run_dir: str, user: str) -> str:
    """Shell that makes the node's directories, run in the probe after ``$RUN_AS`` is set
    (``run_as_probe``). Prints DIRS_OK, or one line saying why train_dir cannot be used.

    train_dir and the run directory (trainer, reaper, pid file) belong to the SSH user
    (root) and nobody else may write them: root later runs the reaper from there and
    signals the pid in that file. train_dir is made with mode 0755 unless it exists; an
    existing one (a local user may make /var/tmp/provision-train first) must be owned by
    root or the SSH user and writable by no one else, and so must every directory above it,
    unless sticky (/var/tmp), on the path as given and as resolved. The training user gets
    two fresh directories of its own, never a recursive chown: the work directory and the
    run's torchrun log directory. Nodes that share train_dir (a shared filesystem) make the
    work directory at the same moment: each tries, and each then checks it is there."""
    t, r, w, u = (shlex.quote(x) for x in (train_dir, run_dir, work_dir(train_dir), user))
    logs = shlex.quote(f"{run_dir}/torchrun-logs")
    check = (
        'me=$(id -u); safe() { ( set -f; IFS=/; p=""; for c in $1; do [ -n "$c" ] || continue; p="$p/$c"; '
        'o=$(stat -c %u -- "$p") || exit 1; '
        '[ "$o" = 0 ] || [ "$o" = "$me" ] || { echo "$p is owned by uid $o"; exit 1; }; '
        '[ -L "$p" ] || [ -z "$(find "$p" -maxdepth 0 -perm /022 ! -perm -1000)" ] '
        '|| { echo "$p is writable by group or others"; exit 1; }; done; '
        '[ -L "$1" ] || [ -z "$(find "$1" -maxdepth 0 -perm /022)" ] '
        '|| { echo "$1 is writable by group or others"; exit 1; } ); }; '
    )
    # A work directory root made (a run without the training user) is handed over; one
    # that already belongs to someone else is left as it is. Never recursive.
    give = f'chown -h -- {u}: {logs} && {{ [ "$(stat -c %u -- {w})" != "$me" ] || chown -h -- {u}: {w}; }}'
    return (
        f"umask 022; T={t}; {check}"
        f'mkdir -p -- "$(dirname -- "$T")" && {{ mkdir -m 0755 -- "$T" 2>/dev/null; true; }}; '
        f'if [ ! -d "$T" ]; then echo "cannot create $T"; '
        f'elif why=$(safe "$T") && why=$(safe "$(readlink -f -- "$T")"); then '
        f"mkdir -p -- {t}/runs {shlex.quote(run_dir.rsplit('/', 1)[0])} && mkdir -m 0755 -- {r} {logs} "
        f"&& {{ mkdir -m 0755 -- {w} 2>/dev/null; [ -d {w} ] && [ ! -L {w} ]; }} "
        f'&& {{ [ -z "$RUN_AS" ] || {{ {give}; }}; }} && echo DIRS_OK; '
        'else echo "$why"; fi'
    )


def run_as_probe(user: str) -> str:
    """Shell that prints RUN_AS=<user> when the trainer should run as the training user:
    the SSH user is root (which root_squash maps to nobody on the NFS shares, so it could
    not write checkpoints there) and the account exists (the base step makes it). A
    non-root SSH user runs the trainer as itself."""
    q = shlex.quote(user)
    return f'if [ "$(id -u)" = 0 ] && id -u {q} >/dev/null 2>&1; then echo RUN_AS={user}; fi'


def interface_for(address: str, ip_json: str) -> str | None:
    """The interface holding ``address``, from ``ip -j addr`` output."""
    for link in json.loads(ip_json or "[]"):
        for info in link.get("addr_info", []):
            if info.get("local") == address:
                return cast("str | None", link.get("ifname"))
    return None


_GPU_LINE = re.compile(r"^GPU \d+:", re.M)


def gpu_count(nvidia_smi_l: str) -> int:
    """GPUs listed by ``nvidia-smi -L``; 0 when the tool is missing or lists none."""
    return len(_GPU_LINE.findall(nvidia_smi_l))


# nvidia-smi -L prints each MIG device indented under its GPU:
#   GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)
#     MIG 1g.5gb      Device  0: (UUID: MIG-...)
_MIG_LINE = re.compile(r"^\s+MIG \S+\s+Device\s+\d+:", re.M)


def mig_gpus(nvidia_smi_l: str) -> list[int]:
    """Indices of the GPUs listed with MIG devices under them. A CUDA process sees at most
    one MIG device, so one rank per GPU (the trainer's cuda:LOCAL_RANK) cannot run there."""
    gpus: list[int] = []
    current: int | None = None
    for line in nvidia_smi_l.splitlines():
        head = _GPU_LINE.match(line)
        if head:
            current = int(line.split(":", 1)[0].split()[1])
        elif current is not None and _MIG_LINE.match(line) and current not in gpus:
            gpus.append(current)
    return gpus


MAX_NPROC = 256  # ranks on one node: more GPUs than any node has


def parse_nproc(value: str) -> int | None:
    """'auto' -> None (one per GPU, else 1); an integer from 1 to MAX_NPROC -> itself; else
    ValueError."""
    if value == "auto":
        return None
    n = int(value)
    if not 1 <= n <= MAX_NPROC:
        raise ValueError(value)
    return n
