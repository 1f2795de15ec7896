"""The `slurm` step: Debian's and Ubuntu's Slurm packages, one controller, every node a
compute node, and the same slurm.conf everywhere, written from the facts provision gathers.

- The head (``Cluster.head_node()``) runs slurmctld; the compute nodes
  (``Cluster.compute_nodes()``) run slurmd, told their inventory name; every host gets the
  client commands.
- One munge key for the cluster, made once on the controller (the inventory's state
  directory, 0600), put on every node as /etc/munge/munge.key (0400, munge:munge); munged
  restarts when the key changed.
- slurm.conf, gres.conf and cgroup.conf come from provision.rules.slurm. Each node's line
  is read from that node's own facts (CPU topology, memory, GPUs) in this pass, once for the
  pass, and kept on the controller (``<state>/slurm-nodes.json``): a node outside the pass
  (unreachable, or left out by --limit or a rollout wave) keeps its last line there, so every
  host writes the same file. A node never seen yet is left out, and the summary says so
  (the next `up` that reaches it adds it).
- A change of the node list or of the controller restarts the daemons (Slurm 22.05 reads
  them only at start; running jobs live on in their slurmstepd), and a node's GPU count
  changing restarts slurmctld (its reconfigure refuses the new count). Any other change is an
  ``scontrol reconfigure`` from the head, and each compute node whose own files changed
  reloads its slurmd, or restarts it where its gres.conf changed (slurmd counts its GPUs at
  start). slurmctld's restart and the reconfigure are a second pass on the head
  (controller.py, run by the pipeline once this step ended on every host): a host's
  operations do not wait for the other hosts' (engine/deadlines), and a reconfigure that
  reached a node before it wrote its new gres.conf drained it. Nothing restarts when
  nothing changed.
- Ubuntu 22.04's Slurm (21.08) has no cgroup v2 support: such hosts are skipped with the
  reason unless ``slurm = "force"``.
- With ``slurm_accounting`` the head also runs slurmdbd over a MariaDB bound to loopback
  (provision.rules.slurm_accounting), slurm.conf names it on every node, and the cluster is
  registered in it before slurmctld restarts once (in the head's second pass). Its database
  password is made once on the controller, like the munge key. Turned off, slurm.conf loses
  the lines and slurmdbd stops; MariaDB and the data stay.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, replace
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from provision import state, verdicts
from provision.deploys.slurm import accounting, roster
from provision.engine import (
    Step,
    current_cluster,
    current_node,
    each_connected_host,
    note,
    once_per_pass,
    put_secret,
    skip,
)
from provision.facts.gpus import NvidiaDevices
from provision.facts.stamps import Stamp, stamp_path
from provision.facts.system import Cpu, Memory, Os
from provision.inventory import Cluster, Node
from provision.operations.apt import install
from provision.operations.stamps import digest, follow_up, stamp_command
from provision.rules import cluster_env
from provision.rules import slurm as rules
from provision.rules import slurm_accounting as accounting_rules

CONF_DIR = "/etc/slurm"
SLURM_CONF = f"{CONF_DIR}/slurm.conf"
GRES_CONF = f"{CONF_DIR}/gres.conf"
CGROUP_CONF = f"{CONF_DIR}/cgroup.conf"
MUNGE_KEY = "/etc/munge/munge.key"
SLURMD_DEFAULTS = "/etc/default/slurmd"

# Stamps (operations/stamps.py) of the restarts and the reconfigure.
NODES_STAMP = "slurm-nodes"  # slurmd restarted for this controller, node list and NodeName
CONF_STAMP = "slurm-conf"  # the head's scontrol reconfigure ran for this slurm.conf and cgroup.conf
CTLD_RESTART_STAMP = "slurmctld-nodes"  # slurmctld restarted for this controller, node list and GPU counts


@dataclass(frozen=True)
class Known:
    """A node as the controller last saw it."""

    line: str  # its NodeName line
    hostname: str  # its own short hostname (slurmctld must run on a host of that name)
    unsupported: str | None  # why its Slurm cannot run as configured (rules.unsupported)
    gpus_without_driver: int  # GPUs seen with no device file known (no driver yet): not declared
    gres: str = ""  # its gres.conf (rules.gres_conf); "" in state written before it was kept


def munge_key(cluster: Cluster) -> str:
    """The cluster's munge key on the controller, made once per inventory."""
    return str(state.generated_secret(state.inventory_dir(cluster.path) / "munge.key"))


def _known_file(cluster: Cluster) -> Path:
    return state.inventory_dir(cluster.path) / "slurm-nodes.json"


def known_nodes(cluster: Cluster) -> dict[str, Known]:
    """Every node seen by a pass of this inventory, as last seen (controller state)."""
    try:
        data = json.loads(_known_file(cluster).read_text())
        return {name: Known(**entry) for name, entry in data.items()}
    except (OSError, ValueError, TypeError):
        return {}


def warn_weight(node: Node) -> int:
    """The node's Weight: its slurm_warn_weight while its last validate warned (validate
    --drain sets the same at once; this keeps it across reconfigures), else 1."""
    last = verdicts.last_run(node.name)
    return node.settings.slurm_warn_weight if last and last[0] == "warn" else 1


def _read(cluster: Cluster, h: Any) -> Known | None:
    node = cluster.node(h.name)
    os_info, cpu, memory, gpus = h.get_fact(Os), h.get_fact(Cpu), h.get_fact(Memory), h.get_fact(NvidiaDevices)
    if not (os_info and cpu and memory and gpus is not None):
        return None
    described = replace(
        rules.node_from_facts(node.name, node.cluster_address, cpu, memory, gpus), weight=warn_weight(node)
    )
    why = rules.unsupported(os_info.id, os_info.version_id) if node.settings.slurm != "force" else None
    return Known(
        rules.node_line(described),
        os_info.hostname.split(".")[0],
        why,
        described.gpus_without_driver,
        rules.gres_conf(described),
    )


def pass_nodes(cluster: Cluster) -> dict[str, Known]:
    """The nodes as this pass found them, merged over what earlier passes found; read once
    per pass (engine.once_per_pass) and written back to the controller's state."""

    def read() -> dict[str, Known]:
        seen = {name: k for name, k in each_connected_host(lambda h: _read(cluster, h)).items() if k is not None}
        merged = known_nodes(cluster) | seen
        state.write_atomic(_known_file(cluster), json.dumps({k: asdict(v) for k, v in merged.items()}, indent=1))
        return merged

    return once_per_pass("slurm nodes", read)


def conf_computes(cluster: Cluster, nodes: dict[str, Known]) -> list[Node]:
    """The inventory's compute nodes slurm.conf holds: those a pass has seen, where their
    Slurm can run."""
    return [n for n in cluster.compute_nodes() if n.name in nodes and not nodes[n.name].unsupported]


def slurm_conf(cluster: Cluster, nodes: dict[str, Known], kept: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(slurm.conf text, compute nodes left out because no pass has seen them yet).
    ``kept``: leaving nodes that stay for now, by name, with their lines (kept_lines)."""
    head, _ = cluster.head_node()
    settings = head.settings
    computes = conf_computes(cluster, nodes)
    kept = kept or {}
    conf = rules.ClusterConf(
        name=settings.slurm_cluster_name,
        controller=nodes[head.name].hostname,
        controller_address=head.cluster_address,
        partition=settings.slurm_partition,
        default_time=settings.slurm_default_time,
        health_program=rules.HEALTH_PROGRAM,
        health_interval_s=settings.slurm_health_interval_s,
        # The address, as for the controller: the head's own hostname need not resolve on the
        # other nodes (their /etc/hosts has the inventory's names).
        accounting_host=head.cluster_address if settings.slurm_accounting else None,
    )
    text = rules.slurm_conf_with_lines(
        conf, [nodes[n.name].line for n in computes] + list(kept.values()), [n.name for n in computes] + list(kept)
    )
    unseen = [n.name for n in cluster.compute_nodes() if n.name not in nodes]
    return text, unseen


def restart_inputs(text: str, keys: tuple[str, ...] = ("NodeName=", "NodeAddr=")) -> list[str]:
    """What Slurm 22.05 reads only when its daemons start: the controller and each node's
    name and address (``keys``: the parts of a node's line that count)."""
    out = []
    for line in text.splitlines():
        if line.startswith("SlurmctldHost="):
            out.append(line)
        elif line.startswith("NodeName="):
            out.append(" ".join(p for p in line.split() if p.startswith(keys)))
    return out


def controller_restart_inputs(text: str) -> list[str]:
    """What slurmctld 22.05 takes only at its start: restart_inputs, and each node's GPU
    count. A reconfigure refuses a GPU count that changes to anything but 0 where gres.conf
    names device files ("Attempt to change gres/gpu Count on node node2 from 0 to 2 invalid
    with File configuration", found by the testbed's GPU job test), and the node is then
    left with no GPUs to schedule; the driver's first install (0 -> 8) is exactly that."""
    return restart_inputs(text, ("NodeName=", "NodeAddr=", "Gres="))


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
    nodes = pass_nodes(cluster)
    mine = nodes.get(node.name)
    why = skip_reason(node, head, nodes)
    if why:
        skip("slurm", why)
        return
    in_conf = tuple(n.name for n in conf_computes(cluster, nodes))
    seen = roster.roster(cluster, in_conf)
    kept = roster.kept_lines(seen.leaving) if seen else roster.last_kept(cluster)
    is_head = node.name == head.name
    computes = node.name in in_conf or node.name in kept
    roles = ((rules.CONTROLLER_PACKAGE, is_head), (rules.COMPUTE_PACKAGE, computes))
    daemons = [unit for unit, here in roles if here]
    keeps_accounting = is_head and head.settings.slurm_accounting
    extra = list(accounting_rules.PACKAGES) if keeps_accounting else []
    install("Install Slurm and munge", [*rules.NODE_PACKAGES, *daemons, *extra], settings.apt_lock_wait_s)
    _stop_lost_roles(roster.lost_roles(seen, node.name, [unit for unit, here in roles if not here]))
    _munge(cluster)

    text, unseen = slurm_conf(cluster, nodes, kept)
    if is_head and seen:
        roster.drain_leaving(seen.leaving, kept)
    if unseen:
        note(f"slurm: not in slurm.conf yet (no run has reached them): {', '.join(unseen)}")
    if mine is not None and mine.gpus_without_driver and computes:
        note(f"slurm: {mine.gpus_without_driver} GPUs not declared: the driver names no device file for them yet")
    # This host's own entry is always from this pass (it is connected), so its gres.conf is
    # never one an older state file lacked.
    gres = (mine.gres if mine and computes else "") or rules.GRES_HEAD
    files.directory(name=CONF_DIR, path=CONF_DIR, mode="755")
    # Before slurm.conf names it: a task on a node without it would fail to start.
    files.put(
        name="Task prolog (the cluster interface in every task)",
        src=StringIO(cluster_env.task_prolog()),
        dest=cluster_env.TASK_PROLOG,
        user="root",
        group="root",
        mode="755",
        create_remote_dir=False,  # CONF_DIR above: root's, and never chowned
    )
    conf_op = files.put(name="slurm.conf (the same on every node)", src=StringIO(text), dest=SLURM_CONF, mode="644")
    gres_op = files.put(name="gres.conf (this node's GPUs)", src=StringIO(gres), dest=GRES_CONF, mode="644")
    cgroup_op = files.put(name="cgroup.conf", src=StringIO(rules.cgroup_conf()), dest=CGROUP_CONF, mode="644")
    own = [conf_op, gres_op, cgroup_op]
    options = slurmd_options(node)
    if computes:
        own.append(files.put(name="slurmd's NodeName", src=StringIO(options), dest=SLURMD_DEFAULTS, mode="644"))
        files.put(
            name="Node health check (HealthCheckProgram)",
            src=StringIO(health_script(cluster, node)),
            dest=rules.HEALTH_PROGRAM,
            user="root",
            group="root",
            mode="755",
        )
    if is_head:
        accounting.head_daemons(cluster, head, nodes[head.name].hostname, keeps_accounting)
    _daemon_units(is_head, computes, keeps_accounting)
    for unit in daemons:
        systemd.service(name=f"{unit} running", service=f"{unit}.service", running=True, enabled=True)
    if is_head:
        _controller_due(text, options, [conf_op, cgroup_op])
        roster.resume_returning(seen.returning if seen else [])
        # slurmctld's restart for accounting (accounting.controller_accounting) is in the
        # head's second pass (controller.py), after every host's files, like its other restart.
    if computes:
        _slurmd_reload_or_restart(is_head, text, gres, options, own, gres_op)


def _daemon_units(is_head: bool, computes: bool, accounting: bool) -> None:
    """The systemd drop-ins of this host's Slurm daemons, before they are started."""
    if is_head:
        _controller_unit(accounting)
    if computes:
        _slurmd_unit()


def _controller_unit(accounting: bool) -> None:
    """slurmctld's drop-in (rules.controller_dropin): restarted on failure, after slurmdbd
    where accounting runs; systemd reloaded when it changed (in this run or one cut short)."""
    text = rules.controller_dropin(accounting)
    op = files.put(
        name="slurmctld: restarted on failure (systemd drop-in)",
        src=StringIO(text),
        dest=rules.CONTROLLER_DROPIN,
        mode="644",
    )
    follow_up(
        "systemd daemon-reload (slurmctld drop-in)",
        "slurmctld-dropin",
        [text],
        ["systemctl daemon-reload"],
        op.did_change,
    )


def _slurmd_unit() -> None:
    """slurmd's drop-in (rules.slurmd_dropin): restarted on failure; systemd reloaded when
    it changed (in this run or one cut short)."""
    text = rules.slurmd_dropin()
    op = files.put(
        name="slurmd: restarted on failure (systemd drop-in)",
        src=StringIO(text),
        dest=rules.SLURMD_DROPIN,
        mode="644",
    )
    follow_up(
        "systemd daemon-reload (slurmd drop-in)", "slurmd-dropin", [text], ["systemctl daemon-reload"], op.did_change
    )


def _stop_lost_roles(units: list[str]) -> None:
    """A daemon of a role this host no longer has (another host is the head; no longer a
    compute node) is stopped and disabled; its state stays on disk. A unit that is not
    installed is left be."""
    for unit in units:
        systemd.service(
            name=f"{unit} stopped (not this host's role)", service=f"{unit}.service", running=False, enabled=False
        )


def _munge(cluster: Cluster) -> None:
    """The cluster's one munge key on this host; munged restarted when it changed."""
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


def health_script(cluster: Cluster, node: Node) -> str:
    """This host's health check: its GPUs (as many as its driver reports in this pass's
    facts) held to the pinned driver, and the mounts the volumes and nfs steps make for it."""
    found = host.get_fact(NvidiaDevices)  # this pass's, cached: _read asked for it already
    gpus = len(found.nvml) if found else 0  # no fact: the mounts are checked, not the GPUs
    settings = node.settings
    nfs_mounts = bool(settings.nfs_exports) and cluster.storage_node() is not None
    mounts = rules.health_mounts(settings, data_volume=bool(settings.data_disks), nfs=nfs_mounts)
    return rules.health_script(node.name, gpus, rules.driver_pattern(settings), mounts)


def skip_reason(node: Node, head: Node, nodes: dict[str, Known]) -> str | None:
    """Why this host gets no Slurm in this run, or None."""
    mine = nodes.get(node.name)
    if mine is not None and mine.unsupported:
        return f"{mine.unsupported}; slurm = 'force' to try it"
    if head.name not in nodes:
        return f"the head {head.name} has not been reached by any run yet: Slurm needs its controller"
    if nodes[head.name].unsupported:
        return f"the head {head.name}: {nodes[head.name].unsupported}"
    return None


def _controller_due(text: str, options: str, confs: list[Any]) -> None:
    """On the head: what its second pass (controller.py, after every host's files) acts on.
    The reconfigure's stamp is cleared where slurm.conf or cgroup.conf changed in this run, so
    that pass reconfigures even where the new text is the one the stamp holds (an edit by hand
    put back), and a run stopped before that pass reconfigures on the next one. A head set up
    before that pass existed has slurmctld's restart recorded in "slurm-nodes" (both daemons
    restarted there): where that stamp holds this node list, the new stamp is written from it
    rather than slurmctld restarting for nothing."""
    server.shell(
        name="scontrol reconfigure due (the head runs it once every node has written its files)",
        commands=[f"rm -f {shlex.quote(stamp_path(CONF_STAMP))}"],
        _if=lambda: any(op.did_change() for op in confs),
    )
    recorded = host.get_fact(Stamp, stamp=NODES_STAMP) == digest([*restart_inputs(text), options])
    if recorded and host.get_fact(Stamp, stamp=CTLD_RESTART_STAMP) is None:
        server.shell(
            name="slurmctld's restart stamp (from the slurm-nodes stamp of an earlier version)",
            commands=[stamp_command(CTLD_RESTART_STAMP, digest(controller_restart_inputs(text)))],
        )


def _slurmd_reload_or_restart(is_head: bool, text: str, gres: str, options: str, own: list[Any], gres_op: Any) -> None:
    """On a compute node: slurmd restarted when what it reads only at start changed (the node
    list, the controller, its NodeName, its GPUs), else reloaded when its files changed. On
    the head the second pass's reconfigure stands for the reload."""
    follow_up(
        "Restart slurmd (the controller or the node list changed)",
        NODES_STAMP,
        [*restart_inputs(text), options],
        [f"systemctl restart {rules.COMPUTE_PACKAGE}.service"],
        lambda: False,  # a first run has no stamp: the restart runs after the first start
    )
    if not is_head:
        follow_up(
            "Reload slurmd (its files changed)",
            "slurmd-files",
            [text, gres, rules.cgroup_conf()],
            [f"systemctl reload {rules.COMPUTE_PACKAGE}.service"],
            lambda: any(op.did_change() for op in own),
        )
    # slurmd reads its GPUs (gres.conf) at start only: a reload or the controller's
    # reconfigure leaves it reporting the old count, and slurmctld drains the node when that
    # is lower than slurm.conf's. Restarted before the head's second pass reconfigures.
    follow_up(
        "Restart slurmd (gres.conf changed)",
        "slurmd-gres",
        [gres],
        [f"systemctl restart {rules.COMPUTE_PACKAGE}.service"],
        gres_op.did_change,
    )


def applies(node: Node) -> str | None:
    return "slurm: skip" if node.settings.slurm == "skip" else None


step = Step("slurm", slurm, "Slurm: slurmctld on the head, slurmd on compute nodes, munge, one slurm.conf", applies)
