"""``Testbed``: bring a local cluster of qemu VMs up, report on it, take it down.

Every process is recorded by pid in the state file and stopped by that pid only; every
file lives under the state dir (except the inventory, which carries a marker line). The
base image stays in the image cache across `down`.

Example::

    tb = Testbed("/tmp/tb", inventory_path="/tmp/tb-inventory.py")
    nodes = tb.up(nodes=2, disks=2)
    tb.stop_node("node2", hard=True)   # failure drill: SIGKILL its qemu
    tb.start_node("node2")
    tb.down()
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

# pyinfra's CLI package monkey-patches threading with gevent when first imported; if that
# happens after paramiko's transport threads have run (wait_for_ssh below), the next
# import fails with "cannot release un-acquired lock". provision.inventory imports it
# lazily, so import it now, before any SSH connection is made.
import pyinfra_cli  # noqa: F401

from provision.errors import InputError, Problem, TestbedError
from provision.inventory import SshTarget
from provision.remote import RemoteError, wait_for_ssh
from provision.testbed import accel as accel_mod
from provision.testbed import (
    apt_sources,
    image,
    inventory_writer,
    keys,
    network,
    node,
    paths,
    procs,
    qemu,
    state,
    tools,
    wheelhouse,
)
from provision.testbed.state import NodeRecord, TestbedState

Progress = Callable[[str, str], None]  # (subject, what it is doing now)
DEFAULT_INVENTORY = "inventories/testbed.py"
MAX_SOCKET_DIR = 80  # unix socket paths are limited to 107 bytes; leave room for names
BOOT_TIMEOUT_S = {"kvm": 120.0, "tcg": 420.0}  # several TCG VMs share 2 host cores
POWERDOWN_TIMEOUT_S = 60.0


class Testbed:
    """One testbed, identified by its state dir."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        images_dir: str | Path | None = None,
        inventory_path: str | Path | None = None,
        mirror: str | None = None,
        progress: Progress | None = None,
    ):
        self.state_dir = Path(state_dir or paths.default_state_dir()).absolute()
        self.images_dir = Path(images_dir or paths.images_dir()).absolute()
        self._inventory_path = Path(inventory_path).absolute() if inventory_path else None
        self.mirror = mirror  # Debian mirror URL; None: from the machine's apt configuration
        self.progress: Progress = progress or (lambda subject, text: None)
        self.marker = f"{self.state_dir}/"  # every process of ours has this in its cmdline

    # --- paths -----------------------------------------------------------------------
    @property
    def ssh_key(self) -> Path:
        return self.state_dir / "keys" / "id_ed25519"

    @property
    def inventory_path(self) -> Path:
        """The inventory file: as given, else where `up` wrote it, else
        inventories/testbed.py under the current directory."""
        if self._inventory_path:
            return self._inventory_path
        st = state.load(self.state_dir)
        if st and st.inventory_path:
            return Path(st.inventory_path)
        return Path(DEFAULT_INVENTORY).absolute()

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def switch_dir(self) -> Path:
        return self.state_dir / "switch"

    # --- public API --------------------------------------------------------------------
    def up(
        self,
        nodes: int = 2,
        disks: int = 2,
        memory_mb: int = 2048,
        cpus: int = 2,
        accel: str = "auto",
        disk_gb: int = 2,
        disk_bps_total: int | None = None,
        boot_timeout_s: float | None = None,
    ) -> list[NodeRecord]:
        """Make sure nodes node1..nodeN exist and answer SSH; return every node's record.

        Running nodes are left as they are, stopped ones are started again. The
        inventory is (re)written. Raises InputError for bad arguments (nothing started),
        TestbedError when a tool is missing or a VM does not come up.
        """
        check_up_args(nodes, disks, memory_mb, cpus, disk_gb)
        with self._lock():
            tools.require(*tools.RUN_TOOLS)
            st = self._prepare(accel)
            keys.generate(self.ssh_key, "provision-testbed")
            self._ensure_switch(st)
            for i in range(1, nodes + 1):
                self._ensure_record(st, i, disks, memory_mb, cpus, disk_bps_total)
            base = self._base(st)
            for rec in st.nodes:
                node.create_disks(node.files(self.state_dir, rec.name), base, rec, disk_gb << 30)
            todo = [r for r in st.nodes[:nodes] if not procs.owned(r.pid, self.marker)]
            for rec in st.nodes[:nodes]:
                if rec not in todo:
                    self.progress(rec.name, "already running")
            self._boot(st, todo, boot_timeout_s)
            self._write_inventory(st)
            return self._refresh(st)

    def status(self) -> list[NodeRecord]:
        """Every node with ``running`` and ``pid`` as they are now; [] without a testbed."""
        st = state.load(self.state_dir)
        return self._refresh(st) if st else []

    def switch_running(self) -> bool:
        st = state.load(self.state_dir)
        return bool(st) and procs.owned(st.vde_pid if st else None, self.marker)

    def down(self) -> list[int]:
        """Stop every process the testbed started (by pid) and remove its files.

        Returns the pids that were stopped. The cached base image is kept.
        """
        with self._lock():
            st = state.load(self.state_dir)
            stopped: list[int] = []
            if st:
                for rec in st.nodes:
                    self.progress(rec.name, "stopping")
                    if rec.pid and procs.stop(rec.pid, self.marker):
                        stopped.append(rec.pid)
                if st.vde_pid and procs.stop(st.vde_pid, self.marker):
                    stopped.append(st.vde_pid)
                if st.inventory_path:
                    inventory_writer.remove(Path(st.inventory_path))
            for sub in ("nodes", "switch", "keys", "known_hosts", state.STATE_FILE):
                path = self.state_dir / sub
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        (self.state_dir / ".lock").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()  # only if nothing else was put there
        return stopped

    def stop_node(self, name: str, hard: bool = True) -> bool:
        """Stop one node: hard is SIGKILL (a power cut, for drills); soft presses the power
        button (ACPI) and waits. Returns True if it was running."""
        with self._lock():
            st = self._existing()
            rec = _node(st, name)
            if not procs.owned(rec.pid, self.marker):
                return False
            if not hard:
                self._powerdown(rec)
            return procs.stop(rec.pid, self.marker, hard=hard) or not procs.alive(rec.pid)

    def start_node(self, name: str, boot_timeout_s: float | None = None) -> NodeRecord:
        """Start a stopped node again (same disks, same port when free) and wait for SSH."""
        with self._lock():
            st = self._existing()
            rec = _node(st, name)
            if not procs.owned(rec.pid, self.marker):
                self._ensure_switch(st)
                self._boot(st, [rec], boot_timeout_s)
                self._write_inventory(st)
            return next(r for r in self._refresh(st) if r.name == name)

    def set_disk_throttle(self, name: str, bps_total: int | None) -> None:
        """Limit each data disk of a node to bps_total bytes/s (None: no limit). Applied
        live through QMP when the node runs, and kept for its next start."""
        with self._lock():
            st = self._existing()
            rec = _node(st, name)
            rec.disk_bps_total = bps_total
            state.save(self.state_dir, st)
            if procs.owned(rec.pid, self.marker):
                sock = node.files(self.state_dir, name).dir / "qmp.sock"
                for k in range(1, len(rec.serials) + 1):
                    qemu.qmp(sock, "block_set_io_throttle", qemu.throttle_args(f"dev-data{k}", bps_total))

    def ssh_argv(self, name: str, command: list[str] | None = None) -> list[str]:
        """The ssh command line for a node, with the pinned host key and the testbed key."""
        rec = _node(self._existing(), name)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.ssh_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-p",
            str(rec.ssh_port),
            "root@127.0.0.1",
            *(command or []),
        ]

    def ssh_target(self, rec: NodeRecord) -> SshTarget:
        return SshTarget("127.0.0.1", rec.ssh_port, "root", str(self.ssh_key), str(self.known_hosts), "yes")

    # --- steps -------------------------------------------------------------------------
    def _prepare(self, requested_accel: str) -> TestbedState:
        """Load the state, or start a new one: image built or cached, accelerator chosen."""
        if len(str(self.state_dir)) > MAX_SOCKET_DIR:
            raise InputError(
                Problem(
                    "state dir",
                    f"{self.state_dir} is too long for unix sockets",
                    f"use a path of at most {MAX_SOCKET_DIR} characters",
                )
            )
        st = state.load(self.state_dir)
        if st is None:
            base = self._build_image()
            verdict = accel_mod.choose(requested_accel, paths.cache_root() / "accel.json", lambda: self._probe(base))
            self.progress("accel", f"{verdict.accel}: {verdict.reason}")
            st = TestbedState(image=str(base.path), image_label=base.label, accel=verdict.accel)
        elif requested_accel != "auto":
            accel_mod.choose(requested_accel, paths.cache_root() / "accel.json", lambda: (False, ""))
            st.accel = requested_accel  # applies to the nodes started now
        wanted = str(self._inventory_path or st.inventory_path or self.inventory_path)
        if st.inventory_path and st.inventory_path != wanted:
            inventory_writer.remove(Path(st.inventory_path))  # moved: no stale copy left behind
        st.inventory_path = wanted
        state.save(self.state_dir, st)
        return st

    def recipe(self) -> image.Recipe:
        """The base image's recipe for this testbed's mirror (its name carries its hash)."""
        if self.mirror:
            mirror = apt_sources.mirror_from_uri(self.mirror)
        else:
            mirror = apt_sources.debian_mirror(apt_sources.read_system_sources())
        return image.recipe_for(mirror)

    def _build_image(self) -> image.BaseImage:
        return image.ensure(self.recipe(), self.images_dir, lambda text: self.progress("image", text))

    def _base(self, st: TestbedState) -> image.BaseImage:
        base = image.at(Path(st.image), st.image_label)
        if base is None:
            raise TestbedError(
                f"the testbed's base image {st.image} is gone; run `provision testbed down` and `up` again"
            )
        return base

    def _probe(self, base: image.BaseImage) -> tuple[bool, str]:
        self.progress("accel", "probing KVM with a throwaway VM")
        run_dir = self.state_dir / "probe"
        run_dir.mkdir(parents=True, exist_ok=True)
        overlay = node.NodeFiles(run_dir).overlay
        probe_rec = NodeRecord("probe", 1, network.free_port(set()), "", 1024, 1, [])
        node.create_disks(node.NodeFiles(run_dir), base, probe_rec, 0)
        vm = qemu.VmSpec(
            "probe",
            "kvm",
            1024,
            1,
            base.kernel,
            base.initrd,
            base.label,
            overlay,
            None,
            (),
            probe_rec.ssh_port,
            network.mac(0, 0),
            None,
            None,
            run_dir,
        )
        return accel_mod.probe_boot(vm)

    def _ensure_switch(self, st: TestbedState) -> None:
        if not procs.owned(st.vde_pid, self.marker):
            shutil.rmtree(self.switch_dir, ignore_errors=True)
            st.vde_pid = network.start_switch(self.switch_dir, self.marker)
            state.save(self.state_dir, st)

    def _ensure_record(
        self, st: TestbedState, index: int, disks: int, memory_mb: int, cpus: int, disk_bps_total: int | None
    ) -> None:
        name = f"node{index}"
        existing = next((r for r in st.nodes if r.name == name), None)
        if existing is not None:
            # A node keeps the disks and memory it was made with (its disks hold data);
            # say so rather than seem to have applied the new values.
            if len(existing.serials) != disks or existing.memory_mb != memory_mb:
                self.progress(
                    name,
                    f"kept as made: {len(existing.serials)} data disks, {existing.memory_mb} MiB "
                    f"(asked {disks}, {memory_mb}); `provision testbed down` first to change them",
                )
            return
        taken = {r.ssh_port for r in st.nodes}
        st.nodes.append(
            NodeRecord(
                name=name,
                index=index,
                ssh_port=network.free_port(taken),
                cluster_address=network.cluster_address(index),
                memory_mb=memory_mb,
                cpus=cpus,
                serials=[node.serial(name, k) for k in range(1, disks + 1)],
                disk_bps_total=disk_bps_total,
            )
        )
        st.nodes.sort(key=lambda r: r.index)
        state.save(self.state_dir, st)

    def _boot(self, st: TestbedState, todo: list[NodeRecord], timeout_s: float | None) -> None:
        """Start qemu for each node, then wait for all of them to answer SSH."""
        base = self._base(st)
        peers = {r.name: r.cluster_address for r in st.nodes}
        client_key = keys.public(self.ssh_key)
        for rec in todo:
            self.progress(rec.name, "starting qemu")
            f = node.files(self.state_dir, rec.name)
            node.write_seed(f, rec, client_key, peers)
            self._start_qemu(st, rec, f, base)
        timeout = timeout_s or BOOT_TIMEOUT_S[st.accel]
        # All VMs boot at once; waiting for them one after another costs no extra time.
        errors = []
        with _quiet_paramiko():
            for rec in todo:
                try:
                    self._wait(rec, timeout)
                except TestbedError as e:
                    errors.append(str(e))
        if errors:
            raise TestbedError("; ".join(errors))

    def _start_qemu(self, st: TestbedState, rec: NodeRecord, f: node.NodeFiles, base: image.BaseImage) -> None:
        for _ in range(3):
            if not network.port_free(rec.ssh_port):
                rec.ssh_port = network.free_port({r.ssh_port for r in st.nodes})
            self._write_known_hosts(st)
            try:
                vm = node.spec(f, rec, base, st.accel, network.switch_socket(self.switch_dir))
                rec.pid = node.start(vm, self.marker)
                break
            except node.PortTaken:
                rec.ssh_port = network.free_port({r.ssh_port for r in st.nodes})
        else:
            raise TestbedError(f"{rec.name}: no free loopback port for its SSH forward")
        state.save(self.state_dir, st)
        self.progress(rec.name, f"booting ({st.accel}), pid {rec.pid}, ssh port {rec.ssh_port}")

    def _wait(self, rec: NodeRecord, timeout_s: float) -> float:
        """Wait for the guest's sshd banner, then for a real login with the pinned key."""
        try:
            banner = network.wait_for_banner(rec.ssh_port, timeout_s)
            took = banner + wait_for_ssh(self.ssh_target(rec), max(30.0, timeout_s - banner))
        except (RemoteError, TimeoutError) as e:
            tail = node.console_tail(node.files(self.state_dir, rec.name))
            raise TestbedError(f"{rec.name} did not come up: {e}; console: {tail}") from None
        self.progress(rec.name, f"SSH answered after {took:.0f}s")
        return took

    def _write_known_hosts(self, st: TestbedState) -> None:
        entries = []
        for rec in st.nodes:
            host_key = node.files(self.state_dir, rec.name).host_key
            if host_key.is_file():
                entries.append((rec.ssh_port, keys.public(host_key)))
        keys.write_known_hosts(self.known_hosts, entries)

    def _write_inventory(self, st: TestbedState) -> None:
        path = Path(st.inventory_path or self.inventory_path)
        if not wheelhouse.ready():
            self.progress("wheelhouse", "downloading torch==2.13.0 (CPU), numpy, nvidia-ml-py")
        inventory_writer.write(path, st.nodes, self.ssh_key, self.known_hosts, self.state_dir, wheelhouse.ensure())

    def _powerdown(self, rec: NodeRecord) -> None:
        sock = node.files(self.state_dir, rec.name).dir / "qmp.sock"
        with contextlib.suppress(OSError, RuntimeError, ConnectionError):
            qemu.qmp(sock, "system_powerdown")
            procs.wait_gone(rec.pid or 0, POWERDOWN_TIMEOUT_S)

    def _refresh(self, st: TestbedState) -> list[NodeRecord]:
        for rec in st.nodes:
            rec.running = procs.owned(rec.pid, self.marker)
        return list(st.nodes)

    def _existing(self) -> TestbedState:
        st = state.load(self.state_dir)
        if st is None:
            raise TestbedError(f"no testbed in {self.state_dir}; run `provision testbed up` first")
        return st

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One command at a time per testbed (two `up`s would race for ports and files)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TestbedError(f"another provision command is using {self.state_dir}") from None
            yield


def _node(st: TestbedState, name: str) -> NodeRecord:
    try:
        return st.node(name)
    except KeyError:
        names = ", ".join(r.name for r in st.nodes) or "none"
        raise InputError(Problem(f"node {name}", "no such node in the testbed", f"known nodes: {names}")) from None


def check_up_args(
    nodes: int, disks: int, memory_mb: int, cpus: int, disk_gb: int, accel: str = "auto", mirror: str | None = None
) -> None:
    """Raise InputError naming every bad argument of up(), before anything is built."""
    from provision import values

    limits = {
        "--nodes": (nodes, 1, 200),
        "--disks": (disks, 0, 8),
        "--memory": (memory_mb, 256, 1 << 20),
        "--cpus": (cpus, 1, 64),
        "--disk-gb": (disk_gb, 1, 1024),
    }
    problems = [
        Problem(flag, f"{value} is outside {low}..{high}")
        for flag, (value, low, high) in limits.items()
        if not low <= value <= high
    ]
    if accel not in accel_mod.CHOICES:
        problems.append(Problem("--accel", f"{accel!r} is not one of {', '.join(accel_mod.CHOICES)}"))
    if mirror is not None and (problem := values.url(mirror)):  # it goes into the guest's apt sources
        problems.append(Problem("--mirror", problem))
    if problems:
        raise InputError(problems)


@contextlib.contextmanager
def _quiet_paramiko() -> Iterator[None]:
    """A booting VM makes paramiko log tracebacks ("Error reading SSH protocol banner")
    that wait_for_ssh already handles; keep them off the user's terminal."""
    logger = logging.getLogger("paramiko")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
