"""The Debian 12 base image: debootstrap once, then cached under the image cache dir.

The image's name carries a hash of its recipe (release, packages, mirror, baked files,
size), so a changed recipe builds a new image and an unchanged one is never rebuilt.
The root filesystem is written with ``mkfs.ext4 -d`` (no loop device, no mount) into a
sparse file; nodes boot it by label with the image's own kernel and initrd.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.errors import TestbedError
from provision.rules import slurm, slurm_accounting
from provision.rules.packages import BASE_PACKAGES
from provision.testbed import guest_files, tools
from provision.testbed.apt_sources import Mirror, guest_sources

RECIPE_VERSION = 3  # bump when the build steps change in a way the fields below miss

PACKAGES = (
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "linux-image-amd64",
    "openssh-server",
    "openssh-sftp-server",
    "sudo",
    "python3",
    "iproute2",
    "ifupdown",
    "iputils-ping",
    "netbase",
    "ca-certificates",
    "gnupg",
    "apt-utils",
    "procps",
    "less",
    "pciutils",
    "e2fsprogs",
)

# Three of the base step's own packages, baked in: under TCG their install is most of the
# shared `up` (gcc and its toolchain, Python's headers, fio's ceph and gluster libraries: about
# 6 of the base step's 12 minutes on the 2-core build VM, BENCHMARKS.md, issue 21), and
# debootstrap on the host installs them at native speed. `up` still installs the rest of the
# base set (python3-venv, numactl, nvme-cli, mdadm, iperf3, chrony, rsync) on every
# testbed, so its install path runs in every suite and demo; verify checks the whole set.
# Named from BASE_PACKAGES, so a package the base step drops is dropped here too.
PRESEEDED = tuple(p for p in BASE_PACKAGES if p in {"build-essential", "python3-dev", "fio"})
# The slurm step's node packages too (munge, the client, slurmd and the plugins they pull in):
# about 2 of its 4 minutes in the shared `up` went to installing them under TCG. Nothing of
# them runs before `up` configures it: slurmd's unit waits for /etc/slurm/slurm.conf
# (ConditionPathExists), and munge's image-made key is replaced by the cluster's. slurmctld
# stays out: once slurm.conf exists its unit would start on every node; `up` installs it on
# the head only, so that install path still runs in every suite and demo.
PRESEEDED_SLURM = (*slurm.NODE_PACKAGES, slurm.COMPUTE_PACKAGE)
# The head's accounting packages too (the testbed keeps slurm_accounting): MariaDB and its
# dependencies are the costliest install of the slurm step under TCG. On the nodes that are
# not the head they stay idle: MariaDB is disabled here (guest_files.DISABLED_UNITS) and
# slurmdbd's unit waits for a slurmdbd.conf that only the head gets.
PRESEEDED_ACCOUNTING = slurm_accounting.PACKAGES

DEBOOTSTRAP_TIMEOUT_S = 1800  # a cold build downloads ~200 packages
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the image's content; its hash names the image."""

    suite: str  # Debian release codename
    packages: tuple[str, ...]  # --include for debootstrap --variant=minbase
    mirror: str  # archive root debootstrap downloads from
    apt_sources: str  # the guest's deb822 sources (same mirror)
    size: str  # root filesystem size (sparse), room for build tools and a torch venv
    version: int = RECIPE_VERSION  # build-step version

    def digest(self) -> str:
        files = guest_files.image_files("LABEL", self.apt_sources)
        units = [guest_files.MASKED_UNITS, guest_files.ENABLED_UNITS, guest_files.DISABLED_UNITS]
        blob = json.dumps([asdict(self), sorted(files.items()), *units])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"debian-{self.suite}-{self.digest()}"

    @property
    def label(self) -> str:
        """ext4 label of the root filesystem (at most 16 characters)."""
        return f"pvroot-{self.digest()[:8]}"


def recipe_for(mirror: Mirror, size: str = "8G") -> Recipe:
    packages = PACKAGES + PRESEEDED + PRESEEDED_SLURM + PRESEEDED_ACCOUNTING
    return Recipe(mirror.suite, packages, mirror.uri, guest_sources(mirror), size)


@dataclass(frozen=True)
class BaseImage:
    """A built image in the cache."""

    path: Path  # its folder
    root: Path  # raw ext4 root filesystem (sparse)
    kernel: Path  # the image's own vmlinuz
    initrd: Path  # the image's own initrd
    label: str  # root filesystem label, for root=LABEL=


def at(folder: Path, label: str) -> BaseImage | None:
    """The built image in ``folder``, or None if it is not (completely) built there."""
    image = BaseImage(folder, folder / "root.img", folder / "vmlinuz", folder / "initrd.img", label)
    done = folder / "recipe.json"
    return image if done.is_file() and image.root.is_file() else None


def cached(recipe: Recipe, images_dir: Path) -> BaseImage | None:
    """The built image for this recipe, or None if it is not (completely) built."""
    return at(images_dir / recipe.name, recipe.label)


def ensure(recipe: Recipe, images_dir: Path, progress: Progress = lambda _: None) -> BaseImage:
    """Return the cached image for the recipe, building it first if needed."""
    image = cached(recipe, images_dir)
    if image:
        return image
    tools.require(*tools.IMAGE_TOOLS)
    if os.geteuid() != 0:
        raise TestbedError(
            "building the testbed image needs root (debootstrap, ownership in "
            "mkfs.ext4 -d): run `sudo provision testbed up` once"
        )
    images_dir.mkdir(parents=True, exist_ok=True)
    with open(images_dir / ".build.lock", "w") as lock:
        # Two testbeds coming up at once build the image once: the second waits here,
        # then finds it in the cache.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("waiting for another image build to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        return cached(recipe, images_dir) or build(recipe, images_dir, progress)


def build(recipe: Recipe, images_dir: Path, progress: Progress) -> BaseImage:
    """debootstrap, configure, write the ext4 image; the folder appears only when complete."""
    images_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(images_dir)
    work = images_dir / f".build-{recipe.name}-{os.getpid()}"
    _remove_tree(work)
    rootfs = work / "rootfs"
    try:
        started = time.monotonic()
        _debootstrap(recipe, rootfs, progress)
        progress("installing the release's updates (apt-get upgrade in the image)")
        _bring_up_to_date(rootfs, recipe)
        progress("configuring the root filesystem")
        configure_rootfs(rootfs, recipe)
        progress("rebuilding the initrd (virtio and ext4 only)")
        _run(["chroot", str(rootfs), "update-initramfs", "-u", "-k", "all"], "update-initramfs", timeout=600)
        # The VMs boot the initrd copied out here, never their own /boot, so later rebuilds
        # inside a guest (mdadm's postinst, the volumes step) are pure cost under TCG: minutes
        # each. Turn them off after the one that counts.
        (rootfs / "etc/initramfs-tools/update-initramfs.conf").write_text(
            "# provision testbed: the VM boots a host-side initrd; see provision/testbed/image.py\n"
            "update_initramfs=no\nbackup_initramfs=no\n"
        )
        shutil.copyfile(_only(rootfs, "boot/vmlinuz-*"), work / "vmlinuz")
        shutil.copyfile(_only(rootfs, "boot/initrd.img-*"), work / "initrd.img")
        progress(f"writing the {recipe.size} root filesystem (mkfs.ext4 -d)")
        _run(
            ["mkfs.ext4", "-q", "-F", "-d", str(rootfs), "-L", recipe.label, str(work / "root.img"), recipe.size],
            "mkfs.ext4",
            timeout=900,
        )
        _remove_tree(rootfs)
        meta = {"recipe": asdict(recipe), "build_seconds": round(time.monotonic() - started, 1)}
        (work / "recipe.json").write_text(json.dumps(meta, indent=2) + "\n")
        work.rename(images_dir / recipe.name)  # the build lock guarantees it is not there yet
    except BaseException:
        _remove_tree(work)
        raise
    image = cached(recipe, images_dir)
    assert image is not None
    return image


def _remove_stale_builds(images_dir: Path) -> None:
    """Remove build folders left by a build that was killed (its pid is gone)."""
    for stale in images_dir.glob(".build-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_tree(stale)


def _remove_tree(path: Path) -> None:
    """rmtree that first unmounts what debootstrap mounted inside (proc, sys, and in a
    container bind mounts of the host's /dev): deleting through a bind mount would
    delete the host's files."""
    if not path.exists():
        return
    prefix = f"{path.resolve()}/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mountpoint in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=30)
    still = [m for m in Path("/proc/self/mounts").read_text().split() if m.startswith(prefix)]
    if still:
        raise TestbedError(f"{path} still has mounts ({', '.join(still)}); unmount them and delete it")
    shutil.rmtree(path, ignore_errors=True)


def _debootstrap(recipe: Recipe, rootfs: Path, progress: Progress) -> None:
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}", "--components=main"]
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if keyring.is_file():
        argv.append(f"--keyring={keyring}")
    argv += [recipe.suite, str(rootfs), recipe.mirror]
    progress(f"debootstrap {recipe.suite} from {recipe.mirror}")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    deadline = time.monotonic() + DEBOOTSTRAP_TIMEOUT_S
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = ([*tail, line.rstrip()])[-15:]
        if line.startswith(("I: Retrieving", "I: Unpacking", "I: Configuring", "I: Extracting")):
            progress("debootstrap: " + line[3:].strip())
        if time.monotonic() > deadline:
            proc.kill()
    if proc.wait() != 0:
        log = " | ".join(tail[-5:])
        raise TestbedError(f"debootstrap failed (exit {proc.returncode}): {log}")


def _bring_up_to_date(rootfs: Path, recipe: Recipe) -> None:
    """Install the release's updates and security fixes here, at native speed. debootstrap
    takes one suite (the point release) and the guests' sources add -updates and
    -security, so without this the first `apt-get install` in a guest upgrades what the new
    packages depend on: python3-venv brought python3.11 and its standard library, byte-compiled
    under TCG, about 3 of the base step's 6 install minutes (BENCHMARKS.md, issue 21).
    `upgrade`, not `dist-upgrade`: a kernel of a new ABI is a new package and stays out, so
    the image keeps one kernel. policy-rc.d keeps maintainer scripts from starting services
    in the chroot; the host's resolv.conf (debootstrap's copy) reaches the mirror."""
    sources = rootfs / guest_files.APT_SOURCES  # the guests' own (configure_rootfs writes it again)
    sources.parent.mkdir(parents=True, exist_ok=True)
    sources.write_text(recipe.apt_sources)
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# provision testbed image build: no service starts in the chroot\nexit 101\n")
    policy.chmod(0o755)
    apt = ["chroot", str(rootfs), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y"]
    try:
        _run([*apt, "update"], "apt-get update in the image", timeout=600)
        _run([*apt, "-o", "Dpkg::Options::=--force-confold", "upgrade"], "apt-get upgrade in the image", timeout=1200)
        _run([*apt, "clean"], "apt-get clean in the image", timeout=120)
    finally:
        policy.unlink(missing_ok=True)


def configure_rootfs(rootfs: Path, recipe: Recipe) -> None:
    """Bake the shared configuration: no host keys, seed unit, same mirror, quiet timers."""
    for rel, (content, mode) in guest_files.image_files(recipe.label, recipe.apt_sources).items():
        path = rootfs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_text(content)
        path.chmod(mode)
    for stale in [
        rootfs / "etc/hostname",
        rootfs / "etc/apt/sources.list",
        rootfs / "var/lib/dbus/machine-id",
        *rootfs.glob("etc/ssh/ssh_host_*"),
    ]:
        stale.unlink(missing_ok=True)
    units = rootfs / "etc/systemd/system"
    for target, unit_path in guest_files.ENABLED_UNITS:
        wants = units / f"{target}.wants"
        wants.mkdir(parents=True, exist_ok=True)
        _symlink(wants / Path(unit_path).name, unit_path)
    for unit in guest_files.MASKED_UNITS:
        _symlink(units / unit, "/dev/null")
    # The links point into the image's /lib (absolute): dangling seen from here, so they are
    # looked for by name, not by glob (which skips a link whose target it cannot stat).
    for unit in guest_files.DISABLED_UNITS:
        for wants in units.glob("*.wants"):
            (wants / unit).unlink(missing_ok=True)
    for deb in rootfs.glob("var/cache/apt/archives/*.deb"):
        deb.unlink()


def _symlink(link: Path, target: str) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def _only(rootfs: Path, pattern: str) -> Path:
    found = sorted(p for p in rootfs.glob(pattern) if not p.is_symlink())
    if len(found) != 1:
        raise TestbedError(f"expected one {pattern} in the image, found {len(found)}")
    return found[0]


def _run(argv: list[str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{what} did not finish within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise TestbedError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
