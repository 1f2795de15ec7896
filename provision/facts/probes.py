"""Facts the up steps read that no general fact module covers: the preflight probe (locks,
free space, Secure Boot, headers, pending reboot), the reboot probe, apt holds, SSH host keys.

Each is a shell command plus a pure parser of ``key=value`` lines, tested on captured text.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from provision.facts.apt import candidate_version
from provision.facts.dpkg import LIST_COMMAND, installed_package

# dpkg and apt take fcntl (POSIX) locks on these files; flock(1) cannot see those, so the
# probe looks the files' inodes up in /proc/locks instead.
APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")


def parse_key_values(lines: list[str]) -> dict[str, str]:
    """``key=value`` lines into a dict; a repeated key keeps its last value."""
    out = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class SecureBoot:
    """Secure Boot state as mokutil (or the lack of EFI) says."""

    enabled: bool  # the firmware enforces signatures on kernel modules
    detail: str  # mokutil's words, or why the state is known without it


# The EFI variable mokutil reads; its fifth byte is 1 when Secure Boot is enforced.
SB_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def parse_sb_state(text: str, efi: bool, efivar: str = "") -> SecureBoot:
    """Parse `mokutil --sb-state` (stdout and stderr together).

    mokutil prints "SecureBoot enabled" / "SecureBoot disabled" (optionally followed by a
    second line), or says EFI variables are unsupported on legacy BIOS. Without EFI there
    is no Secure Boot; with EFI but no answer we assume it is on, so a driver is never
    installed that the firmware would refuse to load.
    """
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("SecureBoot enabled"):
        return SecureBoot(True, first)
    if first.startswith("SecureBoot disabled"):
        return SecureBoot(False, first)
    if not efi:
        return SecureBoot(False, "legacy BIOS boot (no EFI): no Secure Boot")
    if efivar.strip() in ("0", "1"):  # mokutil missing: read the variable it would read
        return SecureBoot(efivar.strip() == "1", f"EFI variable SecureBoot={efivar.strip()}")
    return SecureBoot(True, f"unknown ({first or 'mokutil missing'}); assumed on")


def parse_apt_candidate(text: str) -> str | None:
    """The Candidate version from `apt-cache policy PKG`, None when apt has none."""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate":
            return candidate_version(value)
    return None


@dataclass(frozen=True)
class HostProbe:
    """What preflight needs to know about a host before changing anything."""

    root_free_gb: float  # free space on / (available to root)
    secure_boot: SecureBoot  # firmware signature enforcement
    apt_locks_held: tuple[str, ...]  # lock files some process holds now
    lock_holders: str  # names of apt/dpkg/unattended-upgrade processes running
    reboot_pending: bool  # /var/run/reboot-required exists
    machine_id: str  # /etc/machine-id: tells the controller apart from its targets
    headers_candidate: str | None  # apt candidate of linux-headers-$(uname -r)
    candidates: dict[str, str | None]  # each package the probe was asked about -> apt candidate
    user_uid: int | None = None  # uid of the account named like the training user, if it exists
    uid_owner: str = ""  # the account that has the training uid now, if any
    group_gid: int | None = None  # gid of the group named like the training user, if it exists
    gid_owner: str = ""  # the group that has the training gid now, if any
    # Installed kernel (uname -r form, from /boot/vmlinuz-*) -> apt candidate of its
    # linux-headers package, None when apt has none.
    kernels: dict[str, str | None] = field(default_factory=dict)
    # Package index files in /var/lib/apt/lists; 0 on an image shipped before any apt update
    # (every candidate above then reads "none"), None when not reported.
    apt_lists: int | None = None


class Probe(FactBase[HostProbe]):
    """One round trip for every preflight input. ``packages``: extra apt names whose
    candidates to report (Canonical's signed module packages for the running kernel, NVIDIA's
    driver metapackage)."""

    def command(self, packages: tuple[str, ...] = (), user: str = "", uid: int = 0) -> str:
        locks = " ".join(APT_LOCKS)
        checks = " ".join(packages)
        account = (
            (
                f"echo user_uid=$(getent passwd {shlex.quote(user)} | cut -d: -f3); "
                f"echo uid_owner=$(getent passwd {uid} | cut -d: -f1); "
                f"echo group_gid=$(getent group {shlex.quote(user)} | cut -d: -f3); "
                f"echo gid_owner=$(getent group {uid} | cut -d: -f1); "
            )
            if user
            else ""
        )
        return account + (
            "echo root_free_kb=$(df -Pk / | awk 'NR==2 {print $4}'); "
            "echo efi=$([ -d /sys/firmware/efi ] && echo 1 || echo 0); "
            "echo sb=$(mokutil --sb-state 2>&1 | head -n1); "
            f"echo sbvar=$(od -An -t u1 -j4 -N1 {SB_EFIVAR} 2>/dev/null); "
            f"held=; for f in {locks}; do [ -e $f ] || continue; "
            'i=$(stat -c %i $f); grep -q ":$i " /proc/locks && held="$held $f"; done; '
            "echo locks=$held; "
            "echo holders=$(ps -eo comm= | grep -E '^(apt|apt-get|dpkg|unattended-upgr)' | sort -u | tr '\\n' ' '); "
            "echo reboot_pending=$([ -e /var/run/reboot-required ] && echo 1 || echo 0); "
            "echo machine_id=$(cat /etc/machine-id 2>/dev/null); "
            "echo apt_lists=$(ls /var/lib/apt/lists 2>/dev/null | grep -c _Packages); "
            "echo headers=$(apt-cache policy linux-headers-$(uname -r) 2>/dev/null "
            "| awk '/Candidate:/ {print $2}'); "
            f'for p in {checks}; do echo "pkg:$p=$(apt-cache policy $p 2>/dev/null '
            "| awk '/Candidate:/ {print $2}')\"; done; "
            # /boot/vmlinuz-<release> is named for `uname -r` on every flavour (Ubuntu generic,
            # HWE, cloud; Debian amd64, cloud-amd64, rt), unlike the linux-image package names
            # (metapackages, -unsigned, -dbg variants).
            'for f in /boot/vmlinuz-*; do [ -e "$f" ] || continue; k=${f#/boot/vmlinuz-}; '
            'echo "kernel:$k=$(apt-cache policy linux-headers-$k 2>/dev/null '
            "| awk '/Candidate:/ {print $2}')\"; done"
        )

    def process(self, output: list[str]) -> HostProbe:
        return parse_probe(output)


def parse_probe(lines: list[str]) -> HostProbe:
    values = parse_key_values(lines)
    return HostProbe(
        root_free_gb=int(values.get("root_free_kb") or 0) / 1024 / 1024,
        secure_boot=parse_sb_state(values.get("sb", ""), values.get("efi") == "1", values.get("sbvar", "")),
        apt_locks_held=tuple(values.get("locks", "").split()),
        lock_holders=values.get("holders", "").strip(),
        reboot_pending=values.get("reboot_pending") == "1",
        machine_id=values.get("machine_id", ""),
        headers_candidate=candidate_version(values.get("headers")),
        candidates={key[4:]: candidate_version(value) for key, value in values.items() if key.startswith("pkg:")},
        user_uid=_number(values.get("user_uid")),
        uid_owner=values.get("uid_owner", ""),
        group_gid=_number(values.get("group_gid")),
        gid_owner=values.get("gid_owner", ""),
        apt_lists=_number(values.get("apt_lists")),
        # A release starts with a digit: leaves out a stray vmlinuz-old or the like.
        kernels={
            key[7:]: candidate_version(value)
            for key, value in values.items()
            if key.startswith("kernel:") and key[7:8].isdigit()
        },
    )


def _number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@dataclass(frozen=True)
class RebootState:
    """What decides whether a host needs a reboot, and whether the driver came back."""

    reboot_required: bool  # /var/run/reboot-required exists (packages asked for a reboot)
    loaded_module: str | None  # /sys/module/nvidia/version: the driver the kernel runs
    installed_module: str | None  # modinfo's version of the installed nvidia.ko
    smi_version: str | None  # what nvidia-smi answers as driver_version, None if it fails
    machine_id: str  # /etc/machine-id

    @property
    def runs_installed_module(self) -> bool:
        """The kernel runs the NVIDIA module that is installed: no reboot is needed for the
        driver, so nothing but this run will start the daemons that need it."""
        return self.loaded_module is not None and self.loaded_module == self.installed_module


class RebootProbe(FactBase[RebootState]):
    def command(self) -> str:
        return (
            "echo reboot_required=$([ -e /var/run/reboot-required ] && echo 1 || echo 0); "
            "echo loaded=$(cat /sys/module/nvidia/version 2>/dev/null); "
            "echo installed=$(modinfo -F version nvidia 2>/dev/null | head -n1); "
            "echo smi=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null "
            "| head -n1); "
            "echo machine_id=$(cat /etc/machine-id 2>/dev/null)"
        )

    def process(self, output: list[str]) -> RebootState:
        return parse_reboot_state(output)


def parse_reboot_state(lines: list[str]) -> RebootState:
    values = parse_key_values(lines)
    return RebootState(
        reboot_required=values.get("reboot_required") == "1",
        loaded_module=values.get("loaded") or None,
        installed_module=values.get("installed") or None,
        smi_version=values.get("smi") or None,
        machine_id=values.get("machine_id", ""),
    )


class AptHolds(FactBase[tuple[dict[str, str], set[str]]]):
    """Installed packages (name -> version) and the set of held ones, for apt-mark hold."""

    def command(self) -> str:
        return f"{LIST_COMMAND}; apt-mark showhold 2>/dev/null | sed 's/^/hold /'"

    def process(self, output: list[str]) -> tuple[dict[str, str], set[str]]:
        return parse_holds(output)


def parse_holds(lines: list[str]) -> tuple[dict[str, str], set[str]]:
    installed: dict[str, str] = {}
    held: set[str] = set()
    for line in lines:
        parts = line.split()
        found = installed_package(line)
        if found:
            installed[found[0]] = found[1]
        elif len(parts) == 2 and parts[0] == "hold":
            held.add(parts[1])
    return installed, held


@dataclass(frozen=True)
class Account:
    """A user as getent sees it, with its primary group's name and its group's gid."""

    uid: int  # the user's uid
    gid: int  # its primary group's gid
    home: str  # home directory
    shell: str  # login shell
    group: str  # primary group's name
    group_gid: int | None  # gid of the group named like the user; None when there is none


class AccountFact(FactBase[Account | None]):
    """One account from getent, or None when it does not exist. Cheap where pyinfra's
    Users fact runs several commands for every account on the host (about 5 s under
    emulation), which made every re-run of base pay for all of them."""

    def command(self, user: str) -> str:
        q = shlex.quote(user)
        return (
            f'getent passwd {q} || true; echo --; getent group "$(id -gn {q} 2>/dev/null)" || true; '
            f"echo --; getent group {q} || true"
        )

    def process(self, output: list[str]) -> Account | None:
        return parse_account(output)


def parse_account(lines: list[str]) -> Account | None:
    parts: list[list[list[str]]] = [[], [], []]
    section = 0
    for line in lines:
        if line.strip() == "--":
            section = min(section + 1, 2)
        elif line.strip():
            parts[section].append(line.strip().split(":"))
    if not parts[0] or len(parts[0][0]) < 7:
        return None
    passwd = parts[0][0]
    group = parts[1][0][0] if parts[1] and parts[1][0] else ""
    own = parts[2][0] if parts[2] and len(parts[2][0]) >= 3 else None
    return Account(
        int(passwd[2]), int(passwd[3]), passwd[5], passwd[6], group, int(own[2]) if own and own[2].isdigit() else None
    )


class HostKeys(FactBase[list[str]]):
    """The host's public SSH host keys ("type base64" per line)."""

    def command(self) -> str:
        return "cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [" ".join(line.split()[:2]) for line in output if len(line.split()) >= 2]


class DpkgInterrupted(FactBase[bool]):
    """True when a dpkg run was cut off (power loss or a crash mid-install): files left in
    /var/lib/dpkg/updates, or packages `dpkg --audit` finds half-installed. apt refuses to
    install anything until `dpkg --configure -a` has finished that run."""

    def command(self) -> str:
        return "ls -A /var/lib/dpkg/updates 2>/dev/null | wc -l; dpkg --audit 2>/dev/null | wc -l"

    def process(self, output: list[str]) -> bool:
        return parse_dpkg_interrupted(output)


def parse_dpkg_interrupted(lines: list[str]) -> bool:
    return any(line.strip().isdigit() and int(line) > 0 for line in lines)


def lock_wait_command(seconds: int) -> str:
    """Shell that waits until no process holds an apt/dpkg lock, failing after `seconds`."""
    held = " || ".join(f'( [ -e {f} ] && grep -q ":$(stat -c %i {f}) " /proc/locks )' for f in APT_LOCKS)
    return (
        f"end=$(( $(date +%s) + {seconds} )); "
        f"while {held}; do "
        f'if [ $(date +%s) -ge $end ]; then echo "apt/dpkg lock still held after {seconds}s by: '
        "$(ps -eo comm= | grep -E '^(apt|dpkg|unattended-upgr)' | sort -u | tr '\\n' ' ')"
        '(wait for it, or raise apt_lock_wait_s)" >&2; exit 1; fi; '
        "sleep 3; done"
    )


@dataclass(frozen=True)
class CloudInit:
    """What cloud-init would do to /etc/hosts at the next boot."""

    installed: bool  # /etc/cloud/cloud.cfg.d exists: a drop-in there is read
    overriding: tuple[str, ...]  # user-/vendor-data files that set manage_etc_hosts (they outrank cfg.d)


class CloudInitFact(FactBase[CloudInit]):
    """cloud-init with manage_etc_hosts: true (Debian's cloud images set it in
    01_debian_cloud.cfg; some providers in vendor-data) rewrites /etc/hosts from its template
    on every boot, which drops the cluster block after the driver reboot."""

    def command(self) -> str:
        data = " ".join(f"/var/lib/cloud/instance/{f}" for f in CLOUD_INIT_DATA)
        return (
            "test -d /etc/cloud/cloud.cfg.d && echo installed; "
            f"grep -ls '^[[:space:]]*manage_etc_hosts:[[:space:]]*[\"'\\'']*\\(true\\|True\\|template\\)' "
            f"{data} 2>/dev/null || true"
        )

    @staticmethod
    def default() -> CloudInit:
        return CloudInit(False, ())

    def process(self, output: list[str]) -> CloudInit:
        return parse_cloud_init(output)


CLOUD_INIT_DATA = ("user-data.txt", "vendor-data.txt", "vendor-data2.txt")


def parse_cloud_init(lines: list[str]) -> CloudInit:
    return CloudInit("installed" in lines, tuple(line for line in lines if line.startswith("/")))


class UnconfinedRepositories(FactBase[list[str]]):
    """Backing-up hosts whose default restic repository on the storage host is not yet in its
    confined layout: its files directly in ``<root>/<host>`` (as before each host had an
    account and a chroot of its own), or a move into ``<root>/<host>/repo`` cut short
    (``<root>/<host>.moving`` left). The backups step moves each one into place."""

    def command(self, root: str) -> str:
        # `*` stays literal in an empty directory: neither test matches it.
        return (
            f"cd {shlex.quote(root)} 2>/dev/null || exit 0; "
            'for d in *; do case "$d" in *.moving) echo "${d%.moving}";; '
            '*) [ -f "$d/config" ] && echo "$d";; esac; done; true'
        )

    def process(self, output: list[str]) -> list[str]:
        return parse_unconfined(output)


def parse_unconfined(lines: list[str]) -> list[str]:
    return sorted({line.strip() for line in lines if line.strip()})


class SlurmDrainReason(FactBase[str | None]):
    """This host's reason in Slurm (a drain's or a DOWN's; "none" without one), where it is a
    Slurm node: its name is the one the slurm step gave slurmd (-N, in /etc/default/slurmd,
    root's). None where it is no Slurm node, or the controller does not answer. Never fails:
    a reboot pass asks every host."""

    def command(self) -> str:
        return (
            "f=/etc/default/slurmd; "
            '{ [ -r "$f" ] && command -v sinfo >/dev/null; } || exit 0; '
            """n=$(sed -n 's/^SLURMD_OPTIONS="-N \\(.*\\)"$/\\1/p' "$f" | head -n 1); """
            '[ -n "$n" ] || exit 0; '
            "timeout 30 sinfo --noheader --Node --nodes=\"$n\" --format='%E' 2>/dev/null | head -n 1; true"
        )

    def process(self, output: list[str]) -> str | None:
        first = output[0].strip() if output else ""
        return first or None


@dataclass(frozen=True)
class LeavingNode:
    """A node the controller's slurm.conf holds that the inventory no longer makes a
    compute node (removed, or its role changed)."""

    line: str  # its NodeName line as the controller has it
    jobs: list[str] | None  # the jobs on it; None: Slurm could not say (squeue failed)
    reason: str = ""  # its drain or down reason ("none" without one; "" where sinfo did not say)


@dataclass(frozen=True)
class SlurmRoster:
    """What the head says of nodes joining and leaving Slurm (SlurmLeaving)."""

    leaving: dict[str, LeavingNode] = field(default_factory=dict)
    returning: list[str] = field(default_factory=list)  # compute nodes still drained as removed


RETURNING = "back"  # SlurmLeaving's tag of a returning node's line


class SlurmLeaving(FactBase[SlurmRoster]):
    """On the head: the nodes its /etc/slurm/slurm.conf holds besides ``computes``, each with
    its line and the jobs running on it (squeue, bounded); and the ``computes`` whose drain
    is a removal's (``removed``: rules.slurm.REMOVED_PREFIX), which have come back. Empty
    where there is no such file; never fails (the slurm step asks the head every pass).
    Node names are read only as [A-Za-z0-9._-] words from root's own file, or compared with
    ``computes``, which enter quoted."""

    CONF = "/etc/slurm/slurm.conf"

    def command(self, computes: tuple[str, ...] = (), removed: str = "", conf: str = CONF) -> str:
        keep = "|".join(shlex.quote(name) for name in computes)
        skip = f'case "$n" in {keep}) continue ;; esac; ' if keep else ""
        back = (
            f"timeout 30 sinfo --noheader --Node --format='%N|%E' 2>/dev/null | grep -F {shlex.quote('|' + removed)} "
            f'| while IFS=\'|\' read -r n r; do case "$n" in {keep}) echo {RETURNING}"|$n" ;; esac; done; '
            if keep and removed
            else ""
        )
        return (
            f'f={shlex.quote(conf)}; [ -r "$f" ] || exit 0; '
            "grep -E '^NodeName=[A-Za-z0-9._-]+ ' \"$f\" | while read -r line; do "
            "n=${line%% *}; n=${n#NodeName=}; "
            f"{skip}"
            'r=$(timeout 30 sinfo --noheader --Node --nodes="$n" --format=%E 2>/dev/null | head -n 1); '
            'if jobs=$(timeout 30 squeue --noheader --nodelist="$n" --format=%i 2>/dev/null); '
            # tr, not an unquoted $jobs: an array job's id ("12_[1-3]") is a glob pattern.
            'then echo "$n|$(printf %s "$jobs" | tr "\\n" " ")|$line|$r"; else echo "$n|?|$line|$r"; fi; '
            f"done; {back}true"
        )

    @staticmethod
    def default() -> SlurmRoster:
        # pyinfra answers a fact whose command printed nothing with default(), not process():
        # an empty answer is "nobody leaves or comes back", not "the head did not answer"
        # (that one raises, and the slurm step then decides nothing).
        return SlurmRoster()

    def process(self, output: list[str]) -> SlurmRoster:
        return parse_roster(output)


def parse_roster(lines: list[str]) -> SlurmRoster:
    """SlurmLeaving's lines: "<name>|<job ids, or ?>|<NodeName line>|<reason>" for a leaving
    node (the reason last: anyone's free text, it may hold '|'), "back|<name>" for a
    returning one."""
    roster = SlurmRoster()
    for raw in lines:
        parts = raw.strip().split("|", 3)
        if len(parts) == 2 and parts[0] == RETURNING and parts[1]:
            roster.returning.append(parts[1])
            continue
        if len(parts) != 4 or not parts[0] or not parts[2].startswith(f"NodeName={parts[0]} "):
            continue
        name, jobs, line, reason = parts
        ids = None if jobs.strip() == "?" else jobs.split()  # shown, never run
        roster.leaving[name] = LeavingNode(line, ids, reason.strip())
    return roster
