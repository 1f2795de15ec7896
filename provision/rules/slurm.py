"""Pure decisions of the slurm step: each node's line in slurm.conf from the facts provision
already gathers (CPU topology, memory, GPUs), gres.conf's device files, cgroup.conf, and the
whole slurm.conf every node gets (the same file everywhere: Slurm refuses nodes whose file
differs).

The complaints these rules answer (Slurm users' most common drains):
- "Low RealMemory": slurmd drains a node whose memory is below RealMemory. MemTotal moves by
  megabytes with a kernel or driver update, so RealMemory sits a margin below it
  (``real_memory_mib``).
- GPU counts that disagree with the hardware: the Gres count comes from the GPUs the host's
  driver reports, and gres.conf names each one's device file explicitly (Debian's and
  Ubuntu's slurm packages are built without NVML autodetection). The file is /dev/nvidiaN
  for the driver's minor number N, which is not always the NVML index (a captured 2x RTX
  A5000 has index 0 at minor 1): the lines follow NVML's index order, which is CUDA's, and
  each names its GPU's own file, as Slurm's NVML autodetection would.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from provision.facts.gpus import Gpus
from provision.facts.system import CpuInfo
from provision.resources import render_template
from provision.rules.cluster_env import TASK_PROLOG
from provision.settings import Settings

# RealMemory's margin below MemTotal: 3 %, at least 256 MiB (a small VM's kernel moves by
# tens of MiB), at most 16 GiB (a 2 TiB node loses no more than that to the margin).
MARGIN_SHARE = 0.03
MARGIN_MIN_MIB = 256
MARGIN_MAX_MIB = 16 * 1024

# Debian's and Ubuntu's packages: every Slurm host gets the client and munge; compute nodes
# slurmd, the controller slurmctld.
NODE_PACKAGES = ("munge", "slurm-client")
COMPUTE_PACKAGE = "slurmd"
CONTROLLER_PACKAGE = "slurmctld"

# The node health check (templates/slurm/health.sh.j2), Slurm's HealthCheckProgram.
HEALTH_PROGRAM = "/usr/local/sbin/provision-slurm-health"
FULL_AT_PERCENT = 98  # a checked filesystem at or above this use% drains the node
# Deadlines: every probe runs side by side within PROBE_S, then sinfo and scontrol within
# SLURM_S each: at most about 30 s, well inside the 60 s after which slurmd kills the program.
PROBE_S = 10
SLURM_S = 8
# How long a run waits for one already going (slurmd's beside one by hand): that one's own
# deadlines and a little, so the two together stay inside slurmd's 60 s.
LOCK_S = PROBE_S + 2 * SLURM_S + 4

# Words of a GPU's marketing name that say nothing of its model, dropped from Gres types.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "corporation"}
# A word from which the rest of the name is variant detail (memory, form factor, interconnect).
_DETAIL = re.compile(r"^(\d+gb|sxm\d*|pcie|hbm\d*e?|nvl|nvlink)$")


@dataclass(frozen=True)
class SlurmNode:
    """One node as slurm.conf describes it."""

    name: str  # NodeName: the inventory's host name
    address: str  # NodeAddr: the node's cluster address
    cpus: int  # CPUs: logical CPUs
    sockets: int  # Sockets
    cores_per_socket: int  # CoresPerSocket
    threads_per_core: int  # ThreadsPerCore
    real_memory_mib: int  # RealMemory: a margin below MemTotal
    gpu_type: str | None  # Gres type, e.g. "h100"; None without GPUs
    gpu_count: int  # GPUs declared: those whose device file the driver names
    gpus_without_driver: int = 0  # GPUs seen (PCI bus or NVML) with no device file known: not declared
    weight: int = 1  # Weight: lower is picked first
    gpu_files: tuple[str, ...] = ()  # each declared GPU's device file, in NVML index order


def real_memory_mib(memory_bytes: int) -> int:
    """RealMemory for a node whose MemTotal is ``memory_bytes``: a margin below it."""
    total = memory_bytes // 2**20
    margin = min(max(int(total * MARGIN_SHARE), MARGIN_MIN_MIB), MARGIN_MAX_MIB)
    return max(total - margin, 1)


def gres_type(name: str) -> str:
    """A GPU's Gres type from its name as NVML ("NVIDIA H100 80GB HBM3") or lspci ("GH100
    [H100 SXM5 80GB]") gives it: the model, lower case, [a-z0-9_] only ("h100", "a100",
    "rtx_a5000", "t4"), which users then ask for as ``--gres=gpu:h100:1``."""
    bracket = re.search(r"\[([^\]]+)\]", name)
    text = bracket[1] if bracket else name
    words: list[str] = []
    for word in re.split(r"[\s/-]+", text.lower()):
        if not word or word in _VENDOR_WORDS:
            continue
        if _DETAIL.match(word) and words:
            break
        words.append(re.sub(r"[^a-z0-9]+", "_", word).strip("_"))
    return "_".join(w for w in words if w) or "gpu"


def node_from_facts(name: str, address: str, cpu: CpuInfo, memory_bytes: int, gpus: Gpus) -> SlurmNode:
    """A node's slurm.conf description from its facts. Where the node's GPUs differ in
    model, the first one's type names them all (Slurm's one Gres type per NodeName line).

    Only GPUs whose device file the driver names are declared: gres.conf names
    /dev/nvidiaN, which the driver creates, and slurmd does not start when a named device
    file is missing. GPUs seen only on the PCI bus (no driver yet) or without a minor number
    are counted apart (the step says so; the next `up` after the driver loads declares
    them)."""
    sockets = max(cpu.sockets, 1)
    cores = max(cpu.cores, sockets)
    declared = [g for g in gpus.nvml if g.device_file]
    count, first = len(declared), (declared[0].name if declared else "")
    return SlurmNode(
        name=name,
        address=address,
        cpus=cpu.threads,
        sockets=sockets,
        cores_per_socket=cores // sockets,
        threads_per_core=max(cpu.threads // cores, 1),
        real_memory_mib=real_memory_mib(memory_bytes),
        gpu_type=gres_type(first) if count else None,
        gpu_count=count,
        gpus_without_driver=max(len(gpus.gpus), len(gpus.nvml)) - count,
        gpu_files=tuple(g.device_file for g in declared if g.device_file),
    )


def unsupported(os_id: str, version_id: str) -> str | None:
    """Why the distribution's Slurm cannot run here as configured, or None. Ubuntu 22.04
    ships Slurm 21.08, which has no cgroup v2 plugin, and 22.04 boots with cgroup v2 only:
    slurmd would not start with proctrack/cgroup."""
    if (os_id, version_id) == ("ubuntu", "22.04"):
        return "Ubuntu 22.04's Slurm 21.08 has no cgroup v2 support (Debian 12 and Ubuntu 24.04 have 22.05+)"
    return None


def node_line(node: SlurmNode) -> str:
    """The node's NodeName line of slurm.conf."""
    parts = [
        f"NodeName={node.name}",
        f"NodeAddr={node.address}",
        f"CPUs={node.cpus}",
        f"Sockets={node.sockets}",
        f"CoresPerSocket={node.cores_per_socket}",
        f"ThreadsPerCore={node.threads_per_core}",
        f"RealMemory={node.real_memory_mib}",
    ]
    if node.gpu_count:
        parts.append(f"Gres=gpu:{node.gpu_type}:{node.gpu_count}")
    parts += [f"Weight={node.weight}", "State=UNKNOWN"]
    return " ".join(parts)


GRES_HEAD = "# Managed by provision (slurm step): one line per GPU device file.\n"


def gres_conf(node: SlurmNode) -> str:
    """gres.conf for one node: each declared GPU's own device file, in NVML index order; the
    head line alone for a node without GPUs."""
    return GRES_HEAD + "".join(f"NodeName={node.name} Name=gpu Type={node.gpu_type} File={f}\n" for f in node.gpu_files)


def cgroup_conf() -> str:
    """cgroup.conf: jobs confined to the cores, memory and devices (GPUs) they were given."""
    return (
        "# Managed by provision (slurm step).\n"
        "CgroupPlugin=autodetect\n"
        "ConstrainCores=yes\n"
        "ConstrainRAMSpace=yes\n"
        "ConstrainDevices=yes\n"
    )


@dataclass(frozen=True)
class ClusterConf:
    """What slurm.conf says about the cluster as a whole."""

    name: str  # ClusterName
    controller: str  # the head host's own short hostname (slurmctld runs only on a host of that name)
    controller_address: str  # its cluster address
    partition: str  # the one partition's name
    default_time: str  # DefaultTime of the partition, Slurm's time format
    health_program: str | None = None  # HealthCheckProgram path on every node; None: no health check
    health_interval_s: int = 60  # HealthCheckInterval
    accounting_host: str | None = None  # AccountingStorageHost: where slurmdbd listens; None: no accounting


def slurm_conf(conf: ClusterConf, nodes: list[SlurmNode]) -> str:
    """slurm.conf, the same text for every node."""
    return slurm_conf_with_lines(conf, [node_line(n) for n in nodes], [n.name for n in nodes])


def slurm_conf_with_lines(conf: ClusterConf, lines: list[str], names: list[str]) -> str:
    """slurm.conf from the compute nodes' NodeName lines (and their names, for the partition)."""
    out = [
        "# Managed by provision (slurm step): every node has this same file. Do not edit;",
        "# change the inventory's slurm_* settings and run `provision up` again.",
        f"ClusterName={conf.name}",
        f"SlurmctldHost={conf.controller}({conf.controller_address})",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "GresTypes=gpu",
        "MpiDefault=none",
        # A task that fails ends its step: without it, a rank whose peer died waits for it
        # until the job's time limit (seen with `srun torchrun` on two nodes).
        "KillOnBadExit=1",
        # Every task gets its node's cluster interface for NCCL and gloo (rules/cluster_env).
        f"TaskProlog={TASK_PROLOG}",
        "JobAcctGatherType=jobacct_gather/cgroup",
        # A node that was down comes back by itself once it registers healthy: provision's
        # drains (reason "provision: ...") are left to provision, an admin's to the admin.
        "ReturnToService=2",
        "SlurmctldTimeout=120",
        "SlurmdTimeout=300",
    ]
    if conf.health_program:
        out += [
            f"HealthCheckProgram={conf.health_program}",
            f"HealthCheckInterval={conf.health_interval_s}",
            "HealthCheckNodeState=ANY",
        ]
    if conf.accounting_host:
        out += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={conf.accounting_host}",
            # GPUs are what a GPU cluster's users share: count them in sacct and sreport too.
            "AccountingStorageTRES=gres/gpu",
        ]
    out += lines
    joined = ",".join(names)
    out.append(f"PartitionName={conf.partition} Nodes={joined} Default=YES DefaultTime={conf.default_time} State=UP")
    return "\n".join(out) + "\n"


def health_mounts(settings: Settings, data_volume: bool, nfs: bool) -> list[str]:
    """The mount points a node's health check probes: the data volume where the volumes step
    makes one, and every NFS share where the nfs step mounts them (the server sees them too,
    through its bind mounts). The script skips one that /etc/fstab no longer lists."""
    mounts = [settings.data_mount] if data_volume else []
    if nfs:
        mounts += [f"{settings.nfs_mount_root}/{name}" for name in settings.nfs_exports]
    return mounts


HEALTH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # the script's own PATH: root runs it


def driver_pattern(settings: Settings) -> str:
    """What the health check holds a node's loaded driver to, as a shell pattern: the pinned
    exact version, else the pinned branch ("580.*"); any version where provision does not
    manage the driver (nvidia = skip)."""
    if settings.nvidia == "skip":
        return "*"
    if settings.nvidia_driver_version:
        return settings.nvidia_driver_version.split("-")[0]
    return f"{settings.nvidia_driver_branch}.*"


HEALTH_STATE = "/run/provision-health"  # the health check's probes (root's, 0700)


def health_script(
    name: str, gpus: int, driver: str, mounts: list[str], path: str = HEALTH_PATH, state_dir: str = HEALTH_STATE
) -> str:
    """The node's health check program: its values rendered into the script, each quoted
    for the shell (a node name, a path and a driver pin are validated at load, and quoted
    again here). ``gpus``: the GPUs the driver reported when `up` ran (all of them, declared
    in gres.conf or not); ``driver``: driver_pattern; ``path``: the script's PATH and
    ``state_dir`` where its probes live (tests put a stand-in for nvidia-smi first, and keep
    their probes apart)."""
    return render_template(
        "slurm/health.sh.j2",
        path=shlex.quote(path),
        state_dir=shlex.quote(state_dir),
        node=shlex.quote(name),
        gpus=int(gpus),
        driver=shlex.quote(driver),
        mounts=" ".join(shlex.quote(m) for m in mounts),
        full_at=int(FULL_AT_PERCENT),
        probe_s=int(PROBE_S),
        slurm_s=int(SLURM_S),
        lock_s=int(LOCK_S),
    )


REBOOT_PREFIX = "provision: reboot:"
REBOOT_REASON = f"{REBOOT_PREFIX} up reboots it (driver or kernel change)"
SLURM_CALL_S = 30  # each sinfo, squeue or scontrol the reboot's drain and resume make


# Who owns a drain is in its reason (ownership by reason, not by state: a node an admin set
# DOWN with "RMA pending" is the admin's as much as a drained one). provision's own reasons:
# the health check's, validate's and a reboot's. A reason none of them wrote belongs to
# someone else and is never replaced or lifted. The health check's may be taken over (by
# validate or a reboot): it lifts only its own, so a taken-over drain stays until its new
# owner lifts it.
HEALTH_PREFIX = "provision: health:"
VALIDATE_PREFIX = "provision: validate:"

_DRAIN_FOR_REBOOT = """\
systemctl is-enabled --quiet slurmd.service 2>/dev/null && command -v scontrol >/dev/null || exit 0
n=@N@
now=$(timeout @T@ sinfo --noheader --Node --nodes="$n" --format='%E' | head -n 1) \
  && [ -n "$now" ] || { echo "cannot read $n's state in Slurm: @NOT@" >&2; exit 1; }
case "$now" in
  '@PREFIX@'*) ;;
  none|'@HEALTH@'*) timeout @T@ scontrol update NodeName="$n" State=DRAIN Reason=@REASON@ \
       || { echo "could not drain $n in Slurm: @NOT@" >&2; exit 1; } ;;
  *) echo "left as it was (someone else's): $now" ;;
esac
end=$(( $(date +%s) + @WAIT@ ))
while :; do
  if out=$(timeout @T@ squeue --noheader --nodelist="$n" --format='%i(%u)'); then
    jobs=$(echo "$out" | xargs)
    [ -z "$jobs" ] && break
  else
    jobs="(squeue did not answer)"
  fi
  if [ "$(date +%s)" -ge "$end" ]; then
    echo "jobs still running on $n after @WAIT@ s: $jobs (@NOT@; it stays drained; run up again once they end)" >&2
    exit 1
  fi
  sleep 5
done
"""

_RESUME_AFTER_REBOOT = """\
systemctl is-enabled --quiet slurmd.service 2>/dev/null && command -v scontrol >/dev/null || exit 0
n=@N@
for try in 1 2 3 4; do
  if reason=$(timeout @T@ sinfo --noheader --Node --nodes="$n" --format='%E' | head -n 1) && [ -n "$reason" ]; then
    case "$reason" in
      '@PREFIX@'*) timeout @T@ scontrol update NodeName="$n" State=RESUME && exit 0 ;;
      *) exit 0 ;;
    esac
  fi
  sleep 5
done
echo "could not resume $n in Slurm (the controller did not answer): it stays drained; run up again" >&2
exit 1
"""


def _fill(text: str, name: str, wait_s: int = 0, held_back: str = "not rebooted") -> str:
    return (
        text.replace("@N@", shlex.quote(name))
        .replace("@NOT@", held_back)
        .replace("@REASON@", shlex.quote(REBOOT_REASON))
        .replace("@PREFIX@", REBOOT_PREFIX)
        .replace("@HEALTH@", HEALTH_PREFIX)
        .replace("@WAIT@", str(int(wait_s)))
        .replace("@T@", str(SLURM_CALL_S))
    )


def drain_for_reboot(name: str, wait_s: int, held_back: str = "not rebooted") -> str:
    """Shell (POSIX sh: pyinfra runs it with sh) on a node `up` is about to reboot. Where it
    is a Slurm node (slurmd enabled), it is drained with REBOOT_REASON (taking over a health
    check's drain; a reason someone else wrote stays, in any state); then it waits, at most
    ``wait_s``, until no job runs on it. It fails closed: when Slurm cannot say (sinfo or
    squeue do not answer), or jobs still run at the end, the host fails unrebooted and stays
    drained, its jobs named. ``held_back`` says, in those messages, what did not happen
    (the nvidia step drains the same way before a driver change: "driver not changed")."""
    return _fill(_DRAIN_FOR_REBOOT, name, wait_s, held_back)


def resume_after_reboot(name: str) -> str:
    """Shell run on a node after its reboot and driver check: resume it in Slurm if, and only
    if, its drain is the reboot's (REBOOT_PREFIX). The controller may still be starting (the
    head rebooted in the same batch): a few tries, then the host fails, still drained."""
    return _fill(_RESUME_AFTER_REBOOT, name)


REMOVED_PREFIX = "provision: removed:"
REMOVED_REASON = f"{REMOVED_PREFIX} no longer a compute node in the inventory"

# Only an unclaimed node or the health check's drain is taken over: validate's and a reboot's
# drains stay theirs (drained all the same), so a node that comes back is resumed by the owner
# that knows whether it is fit, not by its return.
_DRAIN_LEAVING = """\
n=@N@
out=$(timeout @T@ sinfo --noheader --Node --nodes="$n" --format='%E') \
  || { echo "cannot read $n's state in Slurm: it stays in slurm.conf; run up again" >&2; exit 1; }
now=$(printf '%s\\n' "$out" | head -n 1)
[ -n "$now" ] || exit 0
case "$now" in
  '@PREFIX@'*) ;;
  none|'@HEALTH@'*) timeout @T@ scontrol update NodeName="$n" State=DRAIN Reason=@REASON@ \
       || { echo "could not drain $n in Slurm: it stays in slurm.conf" >&2; exit 1; } ;;
  *) echo "left as it was (drained by its owner): $now" ;;
esac
"""

# A node leaving with no jobs is dropped from slurm.conf in this run; a job that started on
# it since SlurmLeaving looked would die in the restart: the head fails instead, the node
# drained, and the next `up` keeps it until that job ends.
_NO_JOB_SINCE = """\
out=$(timeout @T@ squeue --noheader --nodelist="$n" --format='%i(%u)') \
  || { echo "cannot read $n's jobs: it stays in slurm.conf; run up again" >&2; exit 1; }
jobs=$(echo "$out" | xargs)
[ -z "$jobs" ] || { echo "jobs started on $n while it was leaving: $jobs" \
  "(drained; run up again once they end)" >&2; exit 1; }
"""


def drain_leaving(name: str, dropping: bool) -> str:
    """Shell run on the head for a node leaving Slurm (SlurmLeaving): drained with
    REMOVED_REASON where it has no reason or the health check's; any other reason stays (the
    node is drained or down by its owner already). It fails when Slurm cannot say. Where it is
    ``dropping`` from slurm.conf in this run (no jobs when the pass looked), it also checks
    that no job started on it since, else the head fails before its files change. A node
    Slurm no longer lists has nothing to drain."""
    text = _DRAIN_LEAVING + (_NO_JOB_SINCE if dropping else "")
    return (
        text.replace("@N@", shlex.quote(name))
        .replace("@REASON@", shlex.quote(REMOVED_REASON))
        .replace("@PREFIX@", REMOVED_PREFIX)
        .replace("@HEALTH@", HEALTH_PREFIX)
        .replace("@T@", str(SLURM_CALL_S))
    )


def resume_returning(name: str) -> str:
    """Shell run on the head for a compute node whose drain is still a removal's: resumed,
    if its reason is still that (read again: an admin may have drained it since)."""
    return (
        f"n={shlex.quote(name)}; "
        f"reason=$(timeout {SLURM_CALL_S} sinfo --noheader --Node --nodes=\"$n\" --format='%E' | head -n 1); "
        f'case "$reason" in {shlex.quote(REMOVED_PREFIX)}*) timeout {SLURM_CALL_S} scontrol update '
        'NodeName="$n" State=RESUME ;; esac'
    )


CONTROLLER_DROPIN = "/etc/systemd/system/slurmctld.service.d/provision.conf"


def controller_dropin(accounting: bool) -> str:
    """slurmctld's systemd drop-in on the head. Restarted on failure: at boot it may start
    before the cluster network has its address or (with accounting) before slurmdbd answers,
    and slurmctld 22.05 then exits for good (seen on the testbed: "Unable to resolve" its own
    address, then DBD_GET_TRES failures, exit 1), leaving the cluster without a controller.
    With accounting it is also ordered after slurmdbd."""
    unit = ["[Unit]", "After=slurmdbd.service", "Wants=slurmdbd.service", ""] if accounting else []
    lines = ["# Managed by provision (slurm step).", *unit, "[Service]", "Restart=on-failure", "RestartSec=10"]
    return "\n".join(lines) + "\n"


SLURMD_DROPIN = "/etc/systemd/system/slurmd.service.d/provision.conf"


def slurmd_dropin() -> str:
    """slurmd's systemd drop-in on every compute node: restarted on failure, and given five
    minutes to start. A slurmd that exits, or is killed for not reporting ready within
    systemd's default 90 s, stays down until someone restarts it, and the node is "not
    responding" to the controller all that while. CI twice found the head's slurmd never
    registered after the testbed booted beside the other test tiers (SlurmdStartTime=None);
    why it stopped was not captured, and no restart policy meant nothing brought it back."""
    lines = [
        "# Managed by provision (slurm step).",
        "[Service]",
        "Restart=on-failure",
        "RestartSec=10",
        "TimeoutStartSec=300",
    ]
    return "\n".join(lines) + "\n"
