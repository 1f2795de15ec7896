"""TEST STAND-IN for NVIDIA's CUDA apt repository (which tests cannot reach).

``build(directory)`` writes a flat, signed apt repository of stand-in packages with the
real names, versions and dependencies of the 580 driver branch (plus a 590 release that
the branch pin must refuse), and DCGM's host engine and exporter (``dcgm.py``). Their
``nvidia-smi`` is a script printing the driver version; the kernel-module package's
postinst marks a reboot as required, as the real one does.
``serve(directory)`` serves it over HTTP on 127.0.0.1; testbed VMs reach it as
``http://10.0.2.2:PORT/`` through qemu user networking.

Nothing here ships in the wheel; it lives under tests/ only.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

DRIVER = "580.95.05-1"  # the stand-in driver release of branch 580
NEWER = "590.48.01-1"  # a newer branch the apt pin and holds must keep out
TOOLKIT = "12.8.1-1"
KEYRING = "cuda-archive-keyring.gpg"
# NCCL as NVIDIA publishes it: each release once per CUDA version. The newest here is built
# for CUDA 13.0, which the toolkit 12-8 pin must keep out.
NCCL_BUILDS = ["2.27.7-1+cuda12.8", "2.27.7-1+cuda12.9", "2.28.3-1+cuda13.0"]
NCCL_FOR_TOOLKIT = "2.27.7-1+cuda12.8"


@dataclass
class Package:
    """One stand-in .deb."""

    name: str  # the real package name
    version: str  # the real version scheme (CUDA repo revision -1)
    depends: list[str] = field(default_factory=list)  # Depends: entries
    files: dict[str, str] = field(default_factory=dict)  # path in the package -> content
    executable: tuple[str, ...] = ()  # paths among files to mark 0755
    postinst: str | None = None  # maintainer script body


def _smi(version: str) -> str:
    return (
        "#!/bin/sh\n# TEST STAND-IN for nvidia-smi: prints the driver version it belongs to.\n"
        f"echo {version.split('-')[0]}\n"
    )


PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (TEST STAND-IN)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --no-persistence-mode

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_UNIT = """[Unit]
Description=NVIDIA fabric manager (TEST STAND-IN)

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true

[Install]
WantedBy=multi-user.target
"""


def driver_release(version: str) -> list[Package]:
    """The packages of one driver release, wired as NVIDIA's repository wires them."""
    branch = version.split(".")[0]
    pin = f"(= {version})"
    return [
        Package(f"nvidia-open-{branch}", version, [f"nvidia-open {pin}"]),
        Package(
            "nvidia-open",
            version,
            [
                f"nvidia-driver-cuda {pin}",
                f"nvidia-kernel-open-dkms {pin}",
                f"nvidia-persistenced {pin}",
                f"libnvidia-compute {pin}",
            ],
        ),
        Package(f"cuda-drivers-{branch}", version, [f"cuda-drivers {pin}"]),
        Package(
            "cuda-drivers",
            version,
            [
                f"nvidia-driver-cuda {pin}",
                f"nvidia-kernel-dkms {pin}",
                f"nvidia-persistenced {pin}",
                f"libnvidia-compute {pin}",
            ],
        ),
        Package("nvidia-driver-cuda", version, [], {"usr/bin/nvidia-smi": _smi(version)}, ("usr/bin/nvidia-smi",)),
        Package("libnvidia-compute", version),
        Package("nvidia-kernel-open-dkms", version, postinst="touch /var/run/reboot-required"),
        Package("nvidia-kernel-dkms", version, postinst="touch /var/run/reboot-required"),
        Package(
            "nvidia-persistenced",
            version,
            [],
            {
                "usr/bin/nvidia-persistenced": "#!/bin/sh\n# TEST STAND-IN: stays up.\nexec sleep infinity\n",
                "lib/systemd/system/nvidia-persistenced.service": PERSISTENCED_UNIT,
            },
            ("usr/bin/nvidia-persistenced",),
        ),
        Package(
            "nvidia-fabricmanager", version, [], {"lib/systemd/system/nvidia-fabricmanager.service": FABRICMANAGER_UNIT}
        ),
    ]


def nccl_builds() -> list[Package]:
    return [
        pkg
        for version in NCCL_BUILDS
        for pkg in (Package("libnccl2", version), Package("libnccl-dev", version, [f"libnccl2 (= {version})"]))
    ]


def packages() -> list[Package]:
    from tests.standins.nvidia_repo import dcgm  # its packages are built from this module's Package

    return [
        *driver_release(DRIVER),
        *driver_release(NEWER),
        Package("cuda-toolkit-12-8", TOOLKIT),
        *nccl_builds(),
        *dcgm.packages(),
    ]


def build_deb(pkg: Package, out: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"standin-{pkg.name}-"))
    try:
        (root / "DEBIAN").mkdir()
        control = [
            f"Package: {pkg.name}",
            f"Version: {pkg.version}",
            "Architecture: amd64",
            "Maintainer: provision tests <standin@test.invalid>",
            "Section: non-free/libs",
            "Priority: optional",
            f"Description: TEST STAND-IN for NVIDIA's {pkg.name}",
        ]
        if pkg.depends:
            control.insert(3, f"Depends: {', '.join(pkg.depends)}")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        if pkg.postinst:
            script = root / "DEBIAN" / "postinst"
            script.write_text(
                f"#!/bin/sh\nset -e\n# TEST STAND-IN for the real package's maintainer script.\n{pkg.postinst}\n"
            )
            script.chmod(0o755)
        for path, content in pkg.files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(0o755 if path in pkg.executable else 0o644)
        # Named as Debian's pools name files: the version without its epoch (no ':' in a URL).
        deb = out / f"{pkg.name}_{pkg.version.split(':')[-1]}_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return deb
    finally:
        shutil.rmtree(root)


def build(directory: str | Path) -> Path:
    """Build the signed flat repository in ``directory``; returns it. Needs dpkg-deb,
    apt-ftparchive and gpg on the controller."""
    repo = Path(directory)
    repo.mkdir(parents=True, exist_ok=True)
    for pkg in packages():
        build_deb(pkg, repo)
    _run(["apt-ftparchive", "packages", "."], repo, out=repo / "Packages")
    _run(
        [
            "apt-ftparchive",
            "-o",
            "APT::FTPArchive::Release::Origin=provision test stand-in",
            "-o",
            "APT::FTPArchive::Release::Label=NVIDIA CUDA stand-in",
            "release",
            ".",
        ],
        repo,
        out=repo / "Release",
    )
    _sign(repo)
    return repo


def _run(cmd: list[str], cwd: Path, out: Path | None = None, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, check=True, timeout=120, env=env)
    if out is not None:
        out.write_bytes(done.stdout)


def _sign(repo: Path) -> None:
    """A throwaway key in a temporary GNUPGHOME (batch, no passphrase) signs InRelease;
    its public key, exported binary, is the repository's keyring file."""
    home = Path(tempfile.mkdtemp(prefix="standin-gnupg-"))
    home.chmod(0o700)
    env = os.environ | {"GNUPGHOME": str(home)}
    try:
        uid = "provision test stand-in repository <standin@test.invalid>"
        _run(
            ["gpg", "--batch", "--passphrase", "", "--quick-generate-key", uid, "rsa3072", "sign", "never"],
            repo,
            env=env,
        )
        _run(["gpg", "--batch", "--yes", "--clearsign", "-o", "InRelease", "Release"], repo, env=env)
        _run(["gpg", "--batch", "--yes", "-abs", "-o", "Release.gpg", "Release"], repo, env=env)
        _run(["gpg", "--batch", "--export", uid], repo, out=repo / KEYRING, env=env)
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, timeout=30)
        shutil.rmtree(home, ignore_errors=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Served:
    """A running HTTP server for the repository."""

    port: int  # on 127.0.0.1
    server: http.server.ThreadingHTTPServer  # stop with shutdown()

    def url_for_vms(self) -> str:
        """What a qemu user-networking guest uses: 10.0.2.2 is the host's loopback."""
        return f"http://10.0.2.2:{self.port}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(directory: str | Path) -> Served:
    """Serve the repository on 127.0.0.1, on a free port, from a thread."""
    handler = partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Served(server.server_address[1], server)
