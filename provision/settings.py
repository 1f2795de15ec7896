"""The typed settings model: every knob that a deploy or command reads.

Settings come from pyinfra host and group data (inventory file, group_data/*.py). Each
knob has a default, a one-line comment (``doc``) and validation. pyinfra's own
connection keys (``ssh_*``) and global arguments (``_sudo`` and friends) pass through
untouched; any other key that is not a knob here is an error, so a typo never silently
falls back to a default.

Roles come from group names, not from settings; see ``ROLES``.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, get_args, get_origin

from provision import values as v
from provision.errors import Problem
from provision.metrics import check_budgets, check_flat

# Group names with a meaning to provision. Hosts in no role group are plain nodes.
ROLES: dict[str, str] = {
    "gpu_nodes": "hosts with NVIDIA GPUs; the nvidia step runs here even if no NVIDIA GPU is found",
    "storage": "the NFS server and backup target (the first host in the group)",
    "head": "the Slurm controller: one host; without this group, the storage host, else the first host",
    "compute": "hosts that run Slurm jobs; without this group, every host (the head as slurm_head_computes says)",
}

StepSwitch = Literal["auto", "force", "skip"]


def knob(default: Any, doc: str, check: typing.Callable[[Any], str | None] | None = None) -> Any:
    """Declare a setting: its default, its one-line comment and an optional extra check.

    ``check`` returns an error message, or None when the value is fine.
    """
    meta = {"doc": doc, "check": check}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


_VERSION = re.compile(r"[0-9]([0-9A-Za-z.+!~-]*[0-9A-Za-z+~])?")  # not ending in '.' or '-'


def _version(value: str | None) -> str | None:
    """A package version as pip or apt writes it (2.2.6, 2.13.0+cpu, 2.27.7-1+cuda12.8):
    it goes into install commands, so a space, '=' or ';' is refused here."""
    if value is None or _VERSION.fullmatch(value):
        return None
    return f"{value!r} is not a version number such as 2.2.6"


def _branch(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9]{3,4}", value) else f"{value!r} is not a driver branch such as 580"


def _cuda_version(value: str | None) -> str | None:
    if value is None or re.fullmatch(r"[0-9]+[-.][0-9]+", value):
        return None
    return f"{value!r} is not a CUDA major-minor version such as 12-8"


def _sha256(value: str | None) -> str | None:
    if value is None or re.fullmatch(r"[0-9a-f]{64}", value):
        return None
    return f"{value!r} is not a SHA-256 (64 lowercase hex digits)"


def _fingerprint(value: str | None) -> str | None:
    if value is None or re.fullmatch(r"[0-9A-Fa-f]{40}", value):
        return None
    return f"{value!r} is not an OpenPGP v4 fingerprint (40 hex digits, no spaces)"


def _retention(value: str) -> str | None:
    """A Prometheus duration for --storage.tsdb.retention.time: a number and one unit."""
    if re.fullmatch(r"[1-9][0-9]{0,5}[hdwy]", value):
        return None
    return f"{value!r} is not a retention such as 30d (a number, then h, d, w or y)"


def _seconds_between(low: int, high: int) -> typing.Callable[[int], str | None]:
    """A check for a deadline in whole seconds: at least ``low``, at most ``high``."""

    def check(value: int) -> str | None:
        return None if low <= value <= high else f"{value!r} must be between {low} and {high} seconds"

    return check


# The kernel's fs.nr_open default: no process may raise its open-files limit above it.
NR_OPEN_DEFAULT = 1048576


# Fewest members per raid_level (the knob allows these). RAID10 takes 2: mdadm builds the
# "near 2" layout, a mirror, on two disks. (A listed data_disks is checked against it at
# load; "auto" once the host's disks are known, rules/disks.)
RAID_MIN_DISKS = {0: 2, 1: 2, 5: 3, 6: 4, 10: 2}


NOFILE_FLOOR = 1024  # the kernel's own default soft limit: below it sshd and sudo cannot work


def _nofile(value: int) -> str | None:
    """pam_limits applies the limit at every login, root's SSH included (the limits file
    names root too); above fs.nr_open setrlimit fails and pam_limits refuses the login, and
    a hard limit of a few files leaves no login able to open what it needs: either would
    lock everyone out of the host."""
    if value > NR_OPEN_DEFAULT:
        return (
            f"{value} is above {NR_OPEN_DEFAULT}, the kernel's fs.nr_open default; pam_limits "
            f"would then refuse every login, root's SSH included; use {NR_OPEN_DEFAULT} or less"
        )
    if value < NOFILE_FLOOR:
        return (
            f"{value} is below {NOFILE_FLOOR}: applied to every login, root's included, it would leave "
            "sshd and sudo without the files they open; training wants far more (the default is the most)"
        )
    return None


def _uid(value: int) -> str | None:
    """Below 1000 are system accounts (0 is root); 65534 is nobody."""
    if value == 65534 or not 1000 <= value <= 2_147_483_646:
        return f"{value} is not a uid for a person's account (1000 to 2147483646, not 65534)"
    return None


def _shares(value: list[str]) -> str | None:
    if len(set(value)) != len(value):
        return "a share is listed twice"
    return v.each(v.share_name)(value)


BY_ID = "/dev/disk/by-id/"  # the only /dev path a disk may be named by (see disk_id_problem)


def disk_id_problem(disk: str) -> str | None:
    """Why ``disk`` cannot name a data disk, or None. Only a /dev/disk/by-id path or a
    serial will do: kernel names (/dev/sdb) change between boots, so naming a disk by one
    could format the wrong disk, and the volumes step matches disks by id and serial only,
    so by-uuid, by-path or by-label would name nothing it can find. A serial is one name:
    no '/' (so no path of any other kind), and no leading '-' or '.' (an option to a
    command, or '..')."""
    if not disk.strip():
        return f"{disk!r} is neither a /dev/disk/by-id path nor a serial"
    problem = v.disk_name(disk)
    if problem:
        return problem
    if disk.startswith(BY_ID):
        name = disk.removeprefix(BY_ID)
        if name and "/" not in name and not name.startswith(("-", ".")):
            return None
        return f"{disk!r} is not a disk's link in {BY_ID} (one name after it, not starting with '-' or '.')"
    if disk.startswith("/dev/disk/"):
        return f"{disk!r} is not a /dev/disk/by-id path; use /dev/disk/by-id/... or the disk's serial"
    if disk.startswith("/dev/"):
        return f"{disk!r} is a kernel name that can change between boots; use /dev/disk/by-id/... or the disk's serial"
    if "/" in disk or disk.startswith(("-", ".")):
        return f"{disk!r} is neither a /dev/disk/by-id path nor a serial (which has no '/' and no leading '-' or '.')"
    if len(disk) < 4 or re.fullmatch(r"part[0-9]+", disk):
        # the volumes step takes a serial as the end of a by-id link ("...-<serial>"): "0"
        # would name every disk whose id ends in -0, "part1" every first partition
        return f"{disk!r} is too short or too common for a serial: it would match other disks' ids"
    return None


def _disk_ids(value: list[str]) -> str | None:
    found = [p for p in (disk_id_problem(d) for d in value) if p]
    if not found and len(set(value)) != len(value):
        found = [f"{', '.join(sorted({d for d in value if value.count(d) > 1}))} listed twice"]
    return "; ".join(found) or None


def _data_disks(value: list[str] | str) -> str | None:
    if isinstance(value, str):
        return None if value == "auto" else f"{value!r} must be 'auto' or a list of disk ids"
    return _disk_ids(value)


def _validate_expect(value: dict[str, float]) -> str | None:
    return v.finite_numbers(value) or check_flat(value)


@dataclass(frozen=True)
class Settings:
    """Every knob, with its default. Field order groups knobs by the step that reads them."""

    # --- cluster addressing ---
    cluster_address: str | None = knob(
        None, "the host's address on the cluster (data) network; default: its SSH address", v.optional(v.host_ip)
    )
    cluster_cidr: str | None = knob(
        None, "the cluster network, e.g. 10.0.0.0/24; NFS exports go to it only", v.optional(v.cluster_network)
    )
    cluster_interface: str | None = knob(
        None,
        "NIC on the cluster network (NCCL/GLOO_SOCKET_IFNAME); default: found by address",
        v.optional(v.interface),
    )

    # --- preflight ---
    min_root_free_gb: int = knob(20, "free space needed on / before anything is installed", v.bounded(1, 1_000_000))
    apt_lock_wait_s: int = knob(300, "how long to wait for another apt/dpkg to let go", v.bounded(1, 86400))

    # --- base ---
    training_user: str = knob("train", "the account that runs training jobs (not root)", v.unprivileged_user)
    training_uid: int = knob(
        2000, "uid and gid of the training user and its group, the same on every node (NFS ownership)", _uid
    )
    nofile_limit: int = knob(NR_OPEN_DEFAULT, "open-files limit for training processes (1024 to 1048576)", _nofile)
    ntp_servers: list[str] = knob(
        [], "chrony's only servers (the distribution's pool is parked); empty keeps the pool", v.each(v.server_address)
    )
    apt_cache_valid_s: int = knob(
        86400, "an apt cache younger than this is not updated again (re-runs stay quick)", v.bounded(1, 31_536_000)
    )

    # --- nvidia ---
    nvidia: StepSwitch = knob("auto", "auto: on hosts with an NVIDIA GPU; force; skip")
    nvidia_repo_url: str = knob(
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
        "NVIDIA CUDA apt repository; {distro} becomes ubuntu2204, ubuntu2404 or debian12",
        v.url,
    )
    nvidia_keyring_url: str = knob(
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/cuda-archive-keyring.gpg",
        "the repository's signing key (binary keyring); installed under /etc/apt/keyrings",
        v.url,
    )
    nvidia_keyring_sha256: str | None = knob(
        None, "SHA-256 the downloaded keyring must have (sha256sum of the file); null trusts HTTPS alone", _sha256
    )
    nvidia_key_fingerprint: str | None = knob(
        "EB693B3035CD5710E231E123A4B469963BF863CC",
        "OpenPGP fingerprint of the one key the downloaded keyring may hold (default: NVIDIA's "
        "published CUDA repository key 3BF863CC); null trusts HTTPS alone",
        _fingerprint,
    )
    nvidia_driver_branch: str = knob("580", "driver branch to pin, e.g. 570 or 580", _branch)
    nvidia_driver_version: str | None = knob(
        None,
        "exact driver version (580.95.05); default: newest of the "
        "branch. Canonical's signed driver needs the version apt offers "
        "or one with its revision (580.95.05-0ubuntu0.22.04.1)",
        _version,
    )
    nvidia_driver_source: Literal["auto", "cuda-repo", "ubuntu-server"] = knob(
        "auto", "auto: CUDA repo, or Canonical's signed -server modules under Secure Boot (Ubuntu)"
    )
    nvidia_kernel_headers: bool = knob(
        True,
        "install headers for the running and every installed kernel "
        "(DKMS builds the driver for the one the next boot runs)",
    )
    nvidia_kernel_modules: Literal["auto", "open", "proprietary"] = knob(
        "auto", "auto: open modules on Turing and newer, proprietary before"
    )
    cuda_toolkit_version: str | None = knob("12-8", "cuda-toolkit-X-Y to install; null skips it", _cuda_version)
    fabric_manager: StepSwitch = knob("auto", "auto: only on NVSwitch systems (HGX, DGX)")
    install_nccl: bool = knob(
        False, "install libnccl2/libnccl-dev from the CUDA repository, built for cuda_toolkit_version, and hold them"
    )
    nccl_version: str | None = knob(
        None, "exact NCCL version, e.g. 2.27.7-1; default: the newest built for cuda_toolkit_version", _version
    )
    install_container_toolkit: bool = knob(False, "install nvidia-container-toolkit")
    reboot_timeout_s: int = knob(900, "how long a rebooted host may take to answer SSH", v.bounded(1, 86400))

    # --- frameworks ---
    venv_path: str = knob("/opt/provision/venv", "the Python venv for training and the agent", v.data_directory)
    torch_version: str = knob("2.13.0", "pinned torch version", _version)
    # numpy 2.3 and later need Python 3.11, so the default is the newest release with wheels
    # for every supported OS's python3: 3.10 (Ubuntu 22.04), 3.11 (Debian 12), 3.12 (24.04).
    numpy_version: str | None = knob(
        "2.2.6", "pinned numpy version (2.2.6 has wheels for Python 3.10-3.13); null takes what torch allows", _version
    )
    nvml_version: str | None = knob(
        "13.580.126",
        "pinned nvidia-ml-py version (the NVML bindings of driver branch 580); null takes the newest",
        _version,
    )
    tensorboard_version: str | None = knob(
        "2.21.0",
        "pinned tensorboard version: the trainer writes TensorBoard event files with it; null: not installed",
        _version,
    )
    pip_index_url: str | None = knob(None, "pip index URL; null uses pip's own configuration", v.optional(v.url))
    wheelhouse: str | None = knob(
        None,
        "controller directory of wheels to upload and install from (air-gapped clusters)",
        v.optional(v.controller_path),
    )
    pip_lock_file: str | None = knob(
        None,
        "controller file of `name==version --hash=sha256:...` lines for every package an index install takes "
        "(uv pip compile --universal --generate-hashes, or pip-compile --generate-hashes); pip checks each file",
        v.optional(v.controller_path),
    )
    pip_require_hashes: bool = knob(
        True, "refuse installs from an index without pip_lock_file; false takes the index's files unchecked"
    )
    pip_compile: bool = knob(True, "byte-compile installed packages; false saves minutes on emulated VMs")

    # --- volumes ---
    data_disks: list[str] | str = knob([], "data disks by /dev/disk/by-id path or serial, or 'auto'", _data_disks)
    raid_level: Literal[0, 1, 5, 6, 10] = knob(0, "mdadm RAID level when there are several disks")
    filesystem: Literal["xfs", "ext4"] = knob("xfs", "filesystem for the data volume")
    data_mount: str = knob("/data", "where the data volume is mounted", v.data_directory)
    force_format: list[str] = knob(
        [], "disks (by-id path or serial) that may be formatted even though they hold data", _disk_ids
    )

    # --- nfs ---
    nfs_server: str | None = knob(
        None, "host name of the NFS server; default: first storage host", v.optional(v.host_name)
    )
    nfs_exports: list[str] = knob(
        ["datasets", "checkpoints", "scratch"], "directories to share (names under nfs_export_root)", _shares
    )
    nfs_export_root: str = knob(
        "/data/shared",
        "where exported directories live on the server; default: <data_mount>/shared, on the data volume",
        v.data_directory,
    )
    nfs_mount_root: str = knob("/shared", "where clients (and the server) see the shares", v.data_directory)
    nfs_export_options: str = knob(
        "rw,sync,root_squash,no_subtree_check",
        "exports(5) options for the cluster network (no no_root_squash)",
        v.export_options,
    )

    # --- slurm ---
    slurm: StepSwitch = knob("auto", "auto and force: Slurm on every host (controller on the head); skip")
    slurm_cluster_name: str = knob("provision", "Slurm's ClusterName", v.slurm_name)
    slurm_partition: str = knob("main", "name of the one partition, which holds every compute node", v.slurm_name)
    slurm_default_time: str = knob(
        "01:00:00", "time limit of a job that asks for none (Slurm's time format)", v.slurm_time
    )
    slurm_head_computes: bool = knob(True, "the head host also runs jobs (small clusters); false: controller only")
    slurm_warn_weight: int = knob(
        1,
        "Slurm Weight of a node whose last validate warned (higher: picked after the others); 1: no difference",
        v.bounded(1, 65533),
    )
    slurm_drain_wait_s: int = knob(
        3600,
        "how long a reboot or a driver change by up waits for the jobs on the drained node; past it the host "
        "fails, drained, its jobs named",
        v.bounded(0, 7 * 86400),
    )
    slurm_health_interval_s: int = knob(
        60, "seconds between runs of provision's node health check (HealthCheckInterval)", v.bounded(10, 86400)
    )
    slurm_accounting: bool = knob(
        False,
        "the head keeps job accounting (slurmdbd, MariaDB on localhost) so sacct works; "
        "turned off later, slurmdbd stops and its database stays",
    )

    # --- backups ---
    backup_repository: str | None = knob(
        None, "restic repository URL; default: sftp to the storage host", v.optional(v.restic_repository)
    )
    backup_password_file: str | None = knob(
        None, "controller file holding the restic password", v.optional(v.controller_path)
    )
    backup_paths: list[str] = knob([], "paths to back up; default: the checkpoints share", v.each(v.source_path))
    backup_schedule: str = knob("daily", "systemd OnCalendar expression for the backup timer", v.calendar)
    backup_keep_daily: int = knob(7, "restic forget --keep-daily", v.bounded(1, 100_000))
    backup_keep_weekly: int = knob(4, "restic forget --keep-weekly", v.bounded(1, 100_000))
    backup_keep_monthly: int = knob(6, "restic forget --keep-monthly", v.bounded(1, 100_000))

    # --- monitoring ---
    monitoring: bool = knob(True, "the monitoring step: node exporter on every host, Prometheus on the head")
    prometheus_retention: str = knob("30d", "how long Prometheus keeps samples (15d, 12w, 1y)", _retention)
    exporter_collectors: list[str] = knob(
        ["cpu", "diskstats", "filesystem", "loadavg", "meminfo", "netdev", "pressure", "stat", "time", "uname"],
        "the node exporter's collectors (its others are off: each costs CPU on every node every scrape); "
        "textfile, provision's own series, is always on",
        v.each(v.exporter_collector),
    )
    gpu_telemetry: Literal["auto", "nvml"] = knob(
        "auto",
        "auto: DCGM's host engine and exporter (NVIDIA's repository) on hosts declared GPU hosts "
        "(gpu_nodes, nvidia = force), provision's NVML collector on hosts whose GPUs are only found; "
        "nvml: the NVML collector on every GPU host",
    )

    # --- validate ---
    validate_expect: dict[str, float] = knob(
        {},
        "validate thresholds: {metric: floor, 'metric.fraction': share of GPU spec, "
        "'metric.max': ceiling, 'fleet.warn_drop': ...}",
        _validate_expect,
    )
    validate_budgets_s: dict[str, float] = knob(
        {},
        "seconds per validate agent phase (cpu, ram, disk, gemm, hbm, copies, burn, allreduce) over the "
        "mode's own (quick: cpu 30, disk 45...); raise them for slow or emulated hosts; the agent's "
        "deadline grows with them",
        check_budgets,
    )

    # --- train ---
    train_master_port: int = knob(
        29500, "c10d rendezvous port on the first node (the training user binds it: 1024 up)", v.bounded(1024, 65535)
    )
    train_max_restarts: int = knob(
        3, "train --min-nodes: times torchrun restarts a node's workers (each lost node is one)", v.bounded(0, 100)
    )
    train_dir: str = knob(
        "/var/tmp/provision-train",
        "node directory for the trainer: runs/<run-id>/ (script, pid file; root's), work/ (data, checkpoints)",
        v.data_directory,
    )

    # --- deadlines (up, plan, facts, status): a host past one is reported and the others go on ---
    connect_timeout_s: int = knob(15, "how long one SSH connection attempt may take", _seconds_between(1, 600))
    command_timeout_s: int = knob(
        3600, "how long one remote command may run (an apt install, a fact)", _seconds_between(1, 86400)
    )
    step_timeout_s: int = knob(
        7200, "how long one step (base, nvidia, ...) may take on one host, all commands", _seconds_between(1, 86400)
    )

    # --- fleet ---
    parallel: int = knob(
        0,
        "hosts connected to and worked on at once in each pass of up, plan, facts and status "
        "(0: pyinfra's choice, 20 per controller core within the open-files limit) and by the "
        "per-host SSH commands of validate, backup, train's setup and the host locks (0: 32); "
        "where the run's hosts differ, the smallest wins",
        v.bounded(0, 100_000),
    )


def knob_docs() -> list[tuple[str, Any, str]]:
    """(name, default, comment) for every knob, for `inventory check` and the README."""
    out = []
    for f in fields(Settings):
        default = f.default if f.default_factory is MISSING else f.default_factory()
        out.append((f.name, default, f.metadata["doc"]))
    return out


def is_pyinfra_key(key: object) -> bool:
    """pyinfra's own connection data and global arguments (checked by inventory.py)."""
    return isinstance(key, str) and key.startswith(("ssh_", "_", "winrm_"))


def type_ok(value: Any, annotation: Any) -> bool:
    origin = get_origin(annotation)
    if annotation is Any:
        return True
    if origin is Literal:
        return value in get_args(annotation) and type(value) in {type(a) for a in get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, arg) for arg in get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = get_args(annotation)
        return isinstance(value, list) and all(type_ok(v, item) for v in value)
    if origin is dict:
        key_t, val_t = get_args(annotation)
        return isinstance(value, dict) and all(type_ok(k, key_t) and type_ok(v, val_t) for k, v in value.items())
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is list:
        return f"a list of {_describe(get_args(annotation)[0])}"
    return getattr(annotation, "__name__", str(annotation))


_HINTS = typing.get_type_hints(Settings)


def parse_settings(data: dict[str, Any], where: str) -> tuple[Settings, list[Problem]]:
    """Validate raw host data into Settings, key by key. Returns the settings (a key that
    is wrong keeps its default) and every problem found. What is wrong only with keys taken
    together is cross_key_problems', asked of the merged settings.

    ``where`` prefixes each problem ("inventories/x.py: host node1").
    """
    problems: list[Problem] = []
    known = {f.name: f for f in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if is_pyinfra_key(key):
            continue
        if key not in known:
            problems.append(_unknown_key(where, key))
            continue
        annotation = _HINTS[key]
        odd = v.plain_data(value)
        if odd:
            problems.append(Problem(f"{where}: key {key}", f"{v.brief(value)} {odd}"))
            continue
        if not type_ok(value, annotation):
            problems.append(
                Problem(
                    f"{where}: key {key}",
                    f"{v.brief(value)} is not {_describe(annotation)}",
                    f"see `provision inventory knobs` for {key}",
                )
            )
            continue
        check = known[key].metadata["check"]
        message = check(value) if check else None
        if message:
            problems.append(Problem(f"{where}: key {key}", message))
            continue
        values[key] = value
    # The shares belong on the data volume: moving data_mount moves their default with it
    # (a fixed /data/shared would put them on the root disk).
    if "data_mount" in values and "nfs_export_root" not in values:
        values["nfs_export_root"] = f"{values['data_mount'].rstrip('/')}/shared"
    return Settings(**values), problems


def cross_key_problems(s: Settings) -> list[Problem]:
    """What is wrong with a host's settings taken together (keys that name each other's
    directories, versions that need one another). Asked of the merged settings, once a host,
    since any layer may give either key; each Problem's ``where`` is the key alone, and the
    caller says whose settings they are."""
    problems = []
    if s.install_nccl:
        try:
            nccl_version_pattern(s.cuda_toolkit_version, s.nccl_version)
        except ValueError as e:
            problems.append(Problem("key install_nccl", str(e)))
    disks = s.data_disks
    if s.raid_level and isinstance(disks, list) and 0 < len(disks) < RAID_MIN_DISKS[s.raid_level]:
        problems.append(
            Problem(
                "key raid_level",
                f"raid_level {s.raid_level} needs at least {RAID_MIN_DISKS[s.raid_level]} disks; data_disks lists "
                f"{len(disks)}",
                "list more disks, or set raid_level 0 (one disk: a plain filesystem)",
            )
        )
    version = s.nvidia_driver_version
    if version and version.split(".", 1)[0] != s.nvidia_driver_branch:
        problems.append(
            Problem(
                "key nvidia_driver_version",
                f"{version} is not of nvidia_driver_branch {s.nvidia_driver_branch}",
                "give a version of the branch, or set nvidia_driver_branch to its branch",
            )
        )
    message = _train_dir_problem(s)
    if message:
        problems.append(Problem("key train_dir", message, "use a directory of its own, e.g. /srv/train"))
    return problems + _layout_problems(s)


def _unknown_key(where: str, key: str) -> Problem:
    import difflib

    close = difflib.get_close_matches(key, [f.name for f in fields(Settings)], n=1) if isinstance(key, str) else []
    fix = f"did you mean {close[0]!r}?" if close else "see `provision inventory knobs`"
    return Problem(f"{where}: key {key_label(key)}", "unknown setting", fix)


def key_label(key: object) -> str:
    """A data key as problems print it: escaped unless it is a plain name."""
    return key if isinstance(key, str) and key.isidentifier() and key.isascii() else ascii(key)


def nccl_version_pattern(cuda_toolkit: str | None, nccl_version: str | None) -> str:
    """The apt version NCCL is pinned to: built for the CUDA toolkit that is installed.

    NVIDIA's repository publishes each NCCL release once per CUDA version
    (2.27.7-1+cuda12.9, 2.27.7-1+cuda13.0); unpinned, apt takes the newest, built for the
    newest CUDA, whatever toolkit and driver the host has. The pattern is an apt version
    glob (fnmatch): ``*+cuda12.8`` is the newest NCCL for CUDA 12.8. A version with its
    ``+cudaX.Y`` suffix is taken as written. ValueError when nothing names the CUDA version
    (settings refuse that combination before any host is contacted).
    """
    if nccl_version and "+" in nccl_version:
        return nccl_version
    if not cuda_toolkit:
        raise ValueError(
            "install_nccl without cuda_toolkit_version needs nccl_version with its "
            "+cudaX.Y suffix, e.g. 2.27.7-1+cuda12.8"
        )
    cuda = cuda_toolkit.replace("-", ".")
    return f"{nccl_version or '*'}+cuda{cuda}"


def _layout_problems(s: Settings) -> list[Problem]:
    """Directories that would land on each other (each path knob is already absolute and
    normalised: values.data_directory). The venv is PATH's and root's: on the data volume,
    a share or the trainer's directory it is not the node's own (and a share is
    root-squashed); ':' splits PATH. The clients' mount point must not be the data volume or
    the exported tree (the server mounts the shares there too, over its own data)."""
    problems = []
    venv = s.venv_path
    if ":" in venv:
        problems.append(Problem("key venv_path", f"{venv!r} holds ':', which splits PATH"))
    # train_dir is root's, but its work/ is the training user's (the launcher makes it so):
    # a venv there, or one holding train_dir, would be that user's to change.
    trees = {"data_mount": s.data_mount, "nfs_mount_root": s.nfs_mount_root, "nfs_export_root": s.nfs_export_root}
    if v.inside(s.train_dir, venv):
        trees["train_dir"] = s.train_dir
    else:
        trees["train_dir's work/"] = f"{s.train_dir.rstrip('/')}/work"
    for name, tree in trees.items():
        if v.overlap(venv, tree):
            problems.append(
                Problem(
                    "key venv_path",
                    f"{venv!r} is on or holds {name} {tree}",
                    "keep the venv on the root disk, e.g. /opt/provision/venv",
                )
            )
    for name, tree in (("data_mount", s.data_mount), ("nfs_export_root", s.nfs_export_root)):
        if v.overlap(s.nfs_mount_root, tree):
            problems.append(
                Problem(
                    "key nfs_mount_root",
                    f"{s.nfs_mount_root!r} is on or holds {name} {tree}",
                    "mount the shares at a directory of their own, e.g. /shared",
                )
            )
    return problems


def _train_dir_problem(s: Settings) -> str | None:
    """Why train_dir cannot hold the trainer's files, or None. It is made and owned by root
    on every node, so it must be a directory of its own: not the root, not a system
    directory (the knob's own check, values.data_directory, refused those), not on an NFS
    share (root_squash; and every node would share one run directory), and not the data
    volume itself or a directory above it or the shares."""
    for name, other in (("nfs_mount_root", s.nfs_mount_root), ("nfs_export_root", s.nfs_export_root)):
        if v.inside(s.train_dir, other):
            return f"{s.train_dir!r} is on the NFS shares ({name} {other})"
    if s.train_dir == s.data_mount or any(v.inside(p, s.train_dir) for p in (s.data_mount, s.nfs_mount_root)):
        return f"{s.train_dir!r} is, or holds, the data volume or the NFS shares (data_mount {s.data_mount})"
    return None
