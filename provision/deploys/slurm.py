"""The `slurm` step: Debian's and Ubuntu's Slurm packages, one controller, every node a
compute node, and the same slurm.conf everywhere, written from the facts provision gathers.

- The head (``Cluster.head_node()``) runs slurmctld; the compute nodes
  (``Cluster.compute_nodes()``) run slurmd; every host gets the client commands.
- One munge key for the cluster, made once on the controller (the inventory's state
  directory, 0600), put on every node as /etc/munge/munge.key (0400, munge:munge); munged
  restarts when the key changed.
- slurm.conf, gres.conf and cgroup.conf come from provision.rules.slurm. Each node's line
  is read from that node's own facts (CPU topology, memory, GPUs) in this pass; a node
  that is not in the pass (unreachable, or left out by --limit) keeps the line it has in
  the host's current slurm.conf, and when there is none the step refuses rather than
  write a file without it (a node missing from the file is silently unconfigured).
- A change of the node list restarts slurmctld and slurmd (Slurm 22.05 reads nodes only
  at start; running jobs live on in their slurmstepd); any other change of slurm.conf is
  an ``scontrol reconfigure`` on the head. Nothing restarts when nothing changed.
"""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, systemd

from provision import state
from provision.engine import Step, current_cluster, current_node, put_secret, refuse
from provision.facts.gpus import NvidiaDevices
from provision.facts.system import Cpu, Memory
from provision.inventory import Cluster, Node
from provision.operations.apt import install
from provision.operations.stamps import follow_up
from provision.rules import slurm as rules

CONF_DIR = "/etc/slurm"
SLURM_CONF = f"{CONF_DIR}/slurm.conf"
GRES_CONF = f"{CONF_DIR}/gres.conf"
CGROUP_CONF = f"{CONF_DIR}/cgroup.conf"
MUNGE_KEY = "/etc/munge/munge.key"
SLURMD_DEFAULTS = "/etc/default/slurmd"
CLIENT_PACKAGES = ["munge", "slurm-client"]

_facts: dict[int, dict[str, rules.SlurmNode]] = {}  # per pyinfra State: host name -> its slurm.conf line's values


def munge_key(cluster: Cluster) -> str:
    """The cluster's munge key on the controller, made once per inventory."""
    return str(state.generated_secret(state.inventory_dir(cluster.path) / "munge.key"))


def pass_nodes(cluster: Cluster) -> dict[str, rules.SlurmNode]:
    """Each host of this pass as slurm.conf describes it, read once per pass from the
    hosts' own facts."""
    current = ctx_state.get()
    if id(current) not in _facts:
        seen = {}
        for h in current.inventory:
            if not h.connected:
                continue
            node = cluster.node(h.name)
            cpu, memory, gpus = h.get_fact(Cpu), h.get_fact(Memory), h.get_fact(NvidiaDevices)
            if cpu and memory and gpus is not None:
                seen[h.name] = rules.node_from_facts(node.name, node.cluster_address, cpu, memory, gpus)
        _facts.clear()
        _facts[id(current)] = seen
    return _facts[id(current)]


def carried_lines(existing: list[str] | None) -> dict[str, str]:
    """NodeName lines of the host's current slurm.conf, by node name."""
    out = {}
    for line in existing or []:
        if line.startswith("NodeName="):
            out[line.split()[0].removeprefix("NodeName=")] = line
    return out


def conf_lines(cluster: Cluster, seen: dict[str, rules.SlurmNode], existing: list[str] | None) -> tuple[str, list[str]]:
    """(slurm.conf text, names of compute nodes with no known line)."""
    head, _ = cluster.head_node()
    computes = cluster.compute_nodes()
    carried = carried_lines(existing)
    missing = [n.name for n in computes if n.name not in seen and n.name not in carried]
    settings = head.settings
    conf = rules.ClusterConf(
        name=settings.slurm_cluster_name,
        controller=head.name,
        controller_address=head.cluster_address,
        partition=settings.slurm_partition,
        default_time=settings.slurm_default_time,
    )
    known = [seen[n.name] for n in computes if n.name in seen]
    text = rules.slurm_conf(conf, known)
    if any(n.name not in seen and n.name in carried for n in computes):
        # A node outside this pass: its line as the cluster knows it, in inventory order.
        lines = [rules.node_line(seen[n.name]) if n.name in seen else carried.get(n.name, "") for n in computes]
        body = [line for line in text.splitlines() if not line.startswith("NodeName=")]
        partition = body.pop()
        names = ",".join(n.name for n in computes if n.name in seen or n.name in carried)
        partition = " ".join(f"Nodes={names}" if p.startswith("Nodes=") else p for p in partition.split())
        text = "\n".join([*body, *[line for line in lines if line], partition]) + "\n"
    return text, missing


def node_set(text: str) -> list[str]:
    """The NodeName and NodeAddr of each node line of a slurm.conf text."""
    return [
        " ".join(p for p in line.split() if p.startswith(("NodeName=", "NodeAddr=")))
        for line in text.splitlines()
        if line.startswith("NodeName=")
    ]


def slurmd_options(node: Node) -> str:
    """/etc/default/slurmd: slurmd is told its NodeName (the inventory's name), which need
    not be the host's own hostname."""
    return f'# Managed by provision (slurm step).\nSLURMD_OPTIONS="-N {node.name}"\n'


@deploy("Slurm")
def slurm() -> None:
    node = current_node()
    cluster = current_cluster()
    settings = node.settings
    head, _ = cluster.head_node()
    is_head = node.name == head.name
    computes = node.name in {n.name for n in cluster.compute_nodes()}
    daemons = [unit for unit, here in (("slurmctld", is_head), ("slurmd", computes)) if here]
    install("Install Slurm and munge", [*CLIENT_PACKAGES, *daemons], settings.apt_lock_wait_s)

    key = munge_key(cluster)
    key_op = put_secret("munge key (0400)", key, MUNGE_KEY, "munge", "munge", mode="400")
    follow_up(
        "Restart munge (key changed)",
        "munge-key",
        [hashlib.sha256(Path(key).read_bytes()).hexdigest()],  # the stamp holds no part of the key
        ["systemctl restart munge.service"],
        key_op.did_change,
    )
    systemd.service(name="munge running", service="munge.service", running=True, enabled=True)

    existing = host.get_fact(FileContents, path=SLURM_CONF)
    seen = pass_nodes(cluster)
    text, missing = conf_lines(cluster, seen, existing)
    if missing:
        refuse(
            "slurm",
            f"no facts for {', '.join(missing)} (not reached in this run) and no line for them in "
            f"{SLURM_CONF}: run `provision up` with them reachable",
        )
        return
    mine = seen.get(node.name)
    gres = rules.gres_conf(mine) if mine and computes else rules.gres_conf_empty()
    files.directory(name=CONF_DIR, path=CONF_DIR, mode="755")
    changed = [
        files.put(name="slurm.conf (the same on every node)", src=StringIO(text), dest=SLURM_CONF, mode="644"),
        files.put(name="gres.conf (this node's GPUs)", src=StringIO(gres), dest=GRES_CONF, mode="644"),
        files.put(name="cgroup.conf", src=StringIO(rules.cgroup_conf()), dest=CGROUP_CONF, mode="644"),
    ]
    options = slurmd_options(node)
    if computes:
        files.put(name="slurmd's NodeName", src=StringIO(options), dest=SLURMD_DEFAULTS, mode="644")
    for unit in daemons:
        systemd.service(name=f"{unit} running", service=f"{unit}.service", running=True, enabled=True)
    if daemons:
        # Slurm 22.05 reads the node list when its daemons start: a node added or removed
        # (or slurmd's own name) restarts them; running jobs live on in their slurmstepd.
        follow_up(
            "Restart Slurm (the node list changed)",
            "slurm-nodes",
            [*node_set(text), options],
            [f"systemctl restart {' '.join(f'{u}.service' for u in daemons)}"],
            lambda: False,
        )
    if is_head:
        # After every node's files: pyinfra runs each operation on every host before the next.
        follow_up(
            "scontrol reconfigure (slurm.conf changed)",
            "slurm-conf",
            [text, rules.cgroup_conf()],
            ["scontrol reconfigure"],
            lambda: any(op.did_change() for op in changed),
        )


def applies(node: Node) -> str | None:
    return "slurm: skip" if node.settings.slurm == "skip" else None


step = Step("slurm", slurm, "Slurm: slurmctld on the head, slurmd on compute nodes, munge, one slurm.conf", applies)
