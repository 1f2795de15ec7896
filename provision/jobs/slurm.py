"""A job through Slurm: one allocation of N nodes with their GPUs, the preparation and then
``run`` started on each node by ``srun``, under the task's time limit and Slurm's
accounting. Attached, ``salloc`` holds the allocation for as long as the controller's SSH
command lives and streams every node's lines (``srun --label``); ``--detach`` submits the
same script with ``sbatch``. Pure builders; the SSH side is in ``jobs.runner``.

Inside the allocation a node learns its part from Slurm (``SLURM_NODEID``, the name slurmd
runs under) and its cluster interface from provision's TaskProlog; the cluster addresses
come from a table the controller writes into the script.
"""

from __future__ import annotations

import re
import shlex

from provision.jobs import layout
from provision.jobs.layout import JobPlan, NodeJob

NODES_LINE = re.compile(r"^\[provision\] nodes: (.+)$")
LABEL = re.compile(r"^\s*(\d+): ?(.*)$")  # srun --label: "<task id>: line"
JOB_NAME_PREFIX = "provision-"


def job_name(run_id: str) -> str:
    return f"{JOB_NAME_PREFIX}{run_id}"


def _node_part(p: JobPlan) -> NodeJob:
    """The node's values as Slurm gives them (shell words, filled in on the node)."""
    return NodeJob("${SLURMD_NODENAME}", -1, "", "", p.task.gpus_per_node, "", None)


def _slurm_env() -> str:
    """What differs per node, read from Slurm and the task prolog on the node."""
    return (
        'export PROVISION_NODE="$SLURMD_NODENAME" SKYPILOT_NODE_RANK="$SLURM_NODEID" NODE_RANK="$SLURM_NODEID"\n'
        'if [ -n "${PROVISION_CLUSTER_IFNAME:-}" ]; then\n'
        '  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$PROVISION_CLUSTER_IFNAME}"\n'
        '  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$PROVISION_CLUSTER_IFNAME}"\n'
        "fi\n"
    )


def _with_slurm_env(script: str) -> str:
    """A node script with Slurm's per-node values put in after the plan's exports (which
    name no node), and the node's name unquoted where the script names its files."""
    lines = script.replace("'${SLURMD_NODENAME}'", '"$SLURMD_NODENAME"')
    marker = "export PROVISION_METRICS="
    at = lines.index(marker)
    end = lines.index("\n", at) + 1
    return lines[:end] + _slurm_env() + lines[end:]


def batch_script(p: JobPlan, addresses: dict[str, str]) -> str:
    """The allocation's script, run on its first node as the job user: the node list said
    (the controller maps srun's task ids to names by it), the cluster addresses exported,
    then the preparation on every node and, when all of them prepared, ``run``."""
    table = " ".join(f"{shlex.quote(name)}) echo {shlex.quote(addr)} ;;" for name, addr in addresses.items())
    node = _node_part(p)
    # srun's own env carries SKYPILOT_NODE_IPS and MASTER_ADDR to every task.
    prepare = _with_slurm_env(layout.prepare_script(p, node, extract=False, build_env=False))
    run = _with_slurm_env(layout.run_script(p, node))
    srun = "srun --label --ntasks-per-node=1 --kill-on-bad-exit=1"
    return (
        "set -u\n"
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")\n'
        f'echo "{layout.MARK} nodes: $(echo $hosts)"\n'
        f'addr() {{ case "$1" in {table} *) echo "$1" ;; esac; }}\n'
        'ips=""; for h in $hosts; do ips="$ips$(addr "$h")\n"; done\n'
        'export SKYPILOT_NODE_IPS="$(printf "%b" "$ips" | sed "/^$/d")"\n'
        'export MASTER_ADDR="$(printf "%s\\n" "$SKYPILOT_NODE_IPS" | head -n 1)"\n'
        # Each node's own preparation is its setup (the workdir and env are on the share,
        # made by the submitting node): without one, no step is spent on it.
        + (f"{srun} bash -c {shlex.quote(prepare)} provision-prepare || exit $?\n" if p.task.setup else "")
        + f"exec {srun} bash -c {shlex.quote(run)} provision-run\n"
    )


def allocation_args(p: JobPlan, nodes: list[str] | None = None) -> list[str]:
    """salloc's and sbatch's shared flags: N whole nodes, their GPUs, the time limit."""
    args = [
        f"--job-name={job_name(p.run_id)}",
        f"--nodes={p.task.num_nodes}",
        "--ntasks-per-node=1",
        "--exclusive",
        "--mem=0",
        f"--chdir={p.job_dir}",
    ]
    if nodes:
        args.append(f"--nodelist={','.join(nodes)}")
    if p.task.gpus_per_node:
        args.append(f"--gres=gpu:{p.task.gpus_per_node}")
    limit = layout.slurm_time(p.task.time_limit_s)
    if limit:
        args.append(f"--time={limit}")
    return args


def _as(user: str | None, argv: list[str]) -> list[str]:
    """As the job's user, from a clean environment: srun hands the submitting environment
    to every task, and root's SSH session's variables are not the job's."""
    clean = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", *argv]
    return ["runuser", "-u", user, "--", *clean] if user else clean


def attached_command(p: JobPlan, user: str | None, addresses: dict[str, str]) -> str:
    """salloc with the script: the allocation lives as long as this command (a lost SSH
    connection hangs it up, and Slurm ends the job)."""
    argv = ["salloc", "--quiet", *allocation_args(p), "bash", "-c", batch_script(p, addresses)]
    return shlex.join(_as(user, argv)) + " 2>&1"


def detached_command(p: JobPlan, user: str | None, addresses: dict[str, str]) -> str:
    """sbatch with the same script; prints the job id. Its output goes to the job's logs."""
    argv = [
        "sbatch",
        "--parsable",
        "--no-requeue",  # a node lost mid-run ends the job, as over SSH (salloc never requeues)
        *allocation_args(p),
        f"--output={p.job_dir}/logs/slurm-%j.out",
        "--wrap",
        batch_script(p, addresses),
    ]
    return shlex.join(_as(user, argv))


def cancel_command(run_id: str, user: str | None) -> str:
    """Every job of this run, by its unique name."""
    return shlex.join(_as(user, ["scancel", f"--name={job_name(run_id)}"]))


def nodes_of(line: str) -> list[str] | None:
    """The node list from the batch script's first line, or None."""
    m = NODES_LINE.match(line)
    return m.group(1).split() if m else None


def split_label(line: str) -> tuple[int, str] | None:
    """(task id, text) of an ``srun --label`` line, or None for the script's own lines."""
    m = LABEL.match(line)
    return (int(m.group(1)), m.group(2)) if m else None
