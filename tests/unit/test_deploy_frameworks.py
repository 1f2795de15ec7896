"""Frameworks deploy: wheelhouse vs index, the torch pin, and the import check verdict."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from provision.deploys import frameworks
from provision.facts import venv as venv_facts
from provision.rules import frameworks as framework_rules
from provision.settings import Settings
from tests.helpers.deploy_facts import FakeHost, node, plan_with_facts

WHEELS = [
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl",
    "nvidia_ml_py-13.580.126-py3-none-any.whl",
    "tensorboard-2.21.0-py3-none-any.whl",
]
PINS = "numpy==2.2.6 nvidia-ml-py==13.580.126 tensorboard==2.21.0"  # the default pins
WHEELHOUSE_INSTALL = (
    "/opt/provision/venv/bin/pip install --only-binary=:all: --no-index --find-links /opt/provision/wheelhouse "
    "--require-hashes -r /opt/provision/wheelhouse/requirements.txt"
)


def wheelhouse(directory: Path, names: list[str]) -> Path:
    """Wheels (stand-in bytes) and the SHA256SUMS the wheelhouse carries."""
    for name in names:
        (directory / name).write_bytes(b"wheel")
    framework_rules.write_sums(directory)
    return directory


def test_wheelhouse_is_uploaded_and_installed_without_an_index(tmp_path: Path) -> None:
    wheelhouse(tmp_path, WHEELS)
    ops, _ = plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path)), FakeHost())
    names = [o.name.removeprefix("Frameworks | ") for o in ops]
    assert names[:1] == ["wheelhouse directory"]
    assert sorted(n for n in names if n.startswith("wheel ")) == sorted(f"wheel {w}" for w in WHEELS)
    assert "requirements.txt: the wheels' hashes" in names
    install = {o.name: o for o in ops}["Frameworks | torch, numpy, nvidia-ml-py"].commands
    assert install[-1] == WHEELHOUSE_INSTALL


def test_index_url_setting_goes_to_pip() -> None:
    ops, _ = plan_with_facts(frameworks.step, node(pip_index_url="http://10.0.0.5/simple"), FakeHost())
    install = {o.name: o for o in ops}["Frameworks | torch, numpy, nvidia-ml-py"].commands
    assert install == [
        "/opt/provision/venv/bin/pip install --only-binary=:all: --index-url http://10.0.0.5/simple "
        f"torch==2.13.0 {PINS}"
    ]


def test_installed_pins_change_nothing(tmp_path: Path) -> None:
    wheelhouse(tmp_path, WHEELS[:1])
    freeze = venv_facts.parse_freeze(
        ["torch==2.13.0+cpu", "numpy==2.2.6", "nvidia-ml-py==13.580.126", "tensorboard==2.21.0", "sympy==1.14.0"]
    )
    hashes = hashlib.sha1(framework_rules.hashed_requirements(str(tmp_path)).encode()).hexdigest()
    fake = FakeHost(
        VenvPackages=freeze,
        Directory={"mode": 755},
        File={"mode": 644},
        WheelSizes={WHEELS[0]: len(b"wheel")},
        Sha1File=hashes,
    )
    assert plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path)), fake)[0] == []
    assert plan_with_facts(frameworks.step, node(), fake)[0] == []
    # A wheel is identified by its name and size, never by a sha1 of it on the host (only
    # the small requirements file is).
    asked = [kwargs.get("path") for name, kwargs in fake.asked if name == "Sha1File"]
    assert asked == [framework_rules.REMOTE_REQUIREMENTS]


def test_the_hosts_wheelhouse_is_listed_once_for_all_its_wheels(tmp_path: Path) -> None:
    # pyinfra keeps no facts: a listing asked by each wheel's operation was 24 round trips
    # a host on every converged up (BENCHMARKS.md, issue 20). One wheel the host has, one
    # torn, one missing: only the last two are sent.
    wheelhouse(tmp_path, WHEELS)
    fake = FakeHost(Directory={"mode": 755}, File={"mode": 644}, WheelSizes={WHEELS[0]: 5, WHEELS[1]: 2})
    ops, _ = plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path)), fake)
    assert [name for name, _ in fake.asked].count("WheelSizes") == 1
    sent = sorted(o.name.removeprefix("Frameworks | wheel ") for o in ops if " wheel " in o.name)
    assert sent == sorted(WHEELS[1:])


def test_a_torn_wheel_upload_is_sent_again(tmp_path: Path) -> None:
    wheelhouse(tmp_path, WHEELS[:1])
    torn = FakeHost(Directory={"mode": 755}, File={"mode": 644}, WheelSizes={WHEELS[0]: 2})
    ops, _ = plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path)), torn)
    (upload,) = [o for o in ops if o.name.endswith(WHEELS[0])]
    assert upload.commands[-1] == f"chmod 644 /opt/provision/wheelhouse/{WHEELS[0]}"


def test_local_version_label_counts_as_installed_and_other_versions_do_not() -> None:
    # pyinfra's own PipPackages regex drops "torch==2.13.0+cpu" entirely: every re-run
    # would reinstall torch. The venv fact keeps it.
    installed = venv_facts.parse_freeze(["torch==2.13.0+cpu", "nvidia_ml_py==13.580.82"])
    assert framework_rules.missing(["torch==2.13.0+cpu", "numpy", "nvidia-ml-py"], installed) == ["numpy"]
    assert framework_rules.missing(["torch==2.13.0"], installed) == []
    assert framework_rules.missing(["torch==2.12.1", "torch==2.13.0+cu128"], installed) == [
        "torch==2.12.1",
        "torch==2.13.0+cu128",
    ]


def test_torch_pin_takes_the_wheel_local_label_and_numpy_pin() -> None:
    assert framework_rules.torch_version("2.13.0", WHEELS) == "2.13.0+cpu"
    assert framework_rules.torch_version("2.13.0", []) == "2.13.0"
    assert framework_rules.requirements(Settings()) == [
        "torch==2.13.0",
        "numpy==2.2.6",
        "nvidia-ml-py==13.580.126",
        "tensorboard==2.21.0",
    ]
    assert framework_rules.requirements(
        Settings(numpy_version="2.3.4", nvml_version=None, tensorboard_version=None)
    ) == [
        "torch==2.13.0",
        "numpy==2.3.4",
        "nvidia-ml-py",
    ]
    assert framework_rules.requirements(Settings(nvml_version="13.580.82"))[2] == "nvidia-ml-py==13.580.82"


def test_a_pinned_numpy_or_nvml_that_the_installed_venv_lacks_is_installed() -> None:
    # A venv made before the pins (numpy 2.4.6, the newest nvidia-ml-py) is brought to them.
    old = FakeHost(
        VenvPackages=venv_facts.parse_freeze(["torch==2.13.0+cpu", "numpy==2.4.6", "nvidia-ml-py==13.615.71"])
    )
    ops, _ = plan_with_facts(frameworks.step, node(), old)
    install = {o.name: o for o in ops}["Frameworks | torch, numpy, nvidia-ml-py"].commands
    assert install == [f"/opt/provision/venv/bin/pip install --only-binary=:all: {PINS}"]


def test_wheelhouse_gaps_name_each_pin_no_wheel_satisfies() -> None:
    assert framework_rules.wheelhouse_gaps(Settings(), WHEELS) == []
    newer = [
        WHEELS[0],
        "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
        "nvidia_ml_py-13.615.71-py3-none-any.whl",
        "not-a-wheel.whl",
    ]
    assert framework_rules.wheelhouse_gaps(Settings(), newer) == [
        "numpy==2.2.6",
        "nvidia-ml-py==13.580.126",
        "tensorboard==2.21.0",
    ]
    # Several versions of a package side by side: one matching wheel is enough.
    assert framework_rules.wheelhouse_gaps(Settings(), [*newer, *WHEELS[1:]]) == []
    # Unpinned, any version will do; a torch of another release is a gap.
    unpinned = Settings(numpy_version=None, nvml_version=None, tensorboard_version=None)
    assert framework_rules.wheelhouse_gaps(unpinned, newer) == []
    assert framework_rules.wheelhouse_gaps(Settings(torch_version="2.12.1"), WHEELS) == ["torch==2.12.1"]


def test_torch_check_verdicts() -> None:
    assert framework_rules.torch_problem("torch-ok 2.13.0+cpu", "2.13.0") is None
    assert framework_rules.torch_problem("torch-ok 2.12.1", "2.13.0") == "torch 2.12.1 is installed, 2.13.0 is pinned"
    assert (
        framework_rules.torch_problem("AssertionError: torch.cuda.is_available() is False", "2.13.0")
        == "AssertionError: torch.cuda.is_available() is False"
    )
    assert "torch.cuda.is_available()" in venv_facts.check_script(need_cuda=True)
    assert "cuda" not in venv_facts.check_script(need_cuda=False)


def test_pip_compile_false_installs_without_byte_compiling(tmp_path: Path) -> None:
    wheelhouse(tmp_path, WHEELS)
    ops, _ = plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path), pip_compile=False), FakeHost())
    install = {o.name: o for o in ops}["Frameworks | torch, numpy, nvidia-ml-py"].commands
    assert install[-1] == WHEELHOUSE_INSTALL.replace("--only-binary=:all: ", "--only-binary=:all: --no-compile ")


def test_wheel_sizes_come_from_one_listing() -> None:
    sizes = venv_facts.WheelSizes().process([f"{WHEELS[0]} 191234567", "numpy-2.3.4-cp311.whl 17000000", "junk"])
    assert sizes == {WHEELS[0]: 191234567, "numpy-2.3.4-cp311.whl": 17000000}


def test_a_wheel_that_does_not_match_the_wheelhouses_sha256sums_is_refused_before_any_upload(tmp_path: Path) -> None:
    wheelhouse(tmp_path, WHEELS)
    (tmp_path / WHEELS[1]).write_bytes(b"swapped")  # changed after the download
    ops, _ = plan_with_facts(frameworks.step, node(wheelhouse=str(tmp_path)), FakeHost())
    assert [o.name.removeprefix("Frameworks | ") for o in ops] == ["frameworks checks"]
    assert f"{WHEELS[1]} does not match its SHA-256 in {tmp_path}/SHA256SUMS" in ops[0].commands[0]
    (tmp_path / "SHA256SUMS").unlink()
    assert framework_rules.sums_problem(str(tmp_path)).startswith(f"{tmp_path}/SHA256SUMS does not exist; write")
    framework_rules.write_sums(tmp_path)
    (tmp_path / "SHA256SUMS").write_text((tmp_path / "SHA256SUMS").read_text().replace(WHEELS[2], "other.whl"))
    assert framework_rules.sums_problem(str(tmp_path)) == f"{WHEELS[2]} is not listed in {tmp_path}/SHA256SUMS"


def test_a_wheel_is_hashed_once_while_unchanged_and_again_after_any_write(tmp_path: Path, monkeypatch) -> None:
    # Every host's frameworks step checks the wheelhouse: read once per process, not per host.
    wheel = tmp_path / WHEELS[0]
    wheel.write_bytes(b"torch-1")
    first = framework_rules.file_sha256(wheel)
    opened: list[str] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    assert framework_rules.file_sha256(wheel) == first
    assert opened == []
    # Same size, mtime put back: the write still moved ctime, so the swap is seen.
    stat = wheel.stat()
    wheel.write_bytes(b"torch-2")
    os.utime(wheel, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert framework_rules.file_sha256(wheel) == hashlib.sha256(b"torch-2").hexdigest()
    assert opened == [str(wheel)]


def test_hashed_requirements_pin_every_wheel_by_its_sha256(tmp_path: Path) -> None:
    wheelhouse(tmp_path, [*WHEELS, "numpy-2.2.6-cp312-cp312-manylinux_2_17_x86_64.whl"])
    (tmp_path / WHEELS[0]).write_bytes(b"torch")
    framework_rules.write_sums(tmp_path)
    torch, wheel = hashlib.sha256(b"torch").hexdigest(), hashlib.sha256(b"wheel").hexdigest()
    assert framework_rules.hashed_requirements(str(tmp_path)).splitlines() == [
        f"numpy==2.2.6 --hash=sha256:{wheel} --hash=sha256:{wheel}",  # one line, a hash per wheel
        f"nvidia_ml_py==13.580.126 --hash=sha256:{wheel}",
        f"tensorboard==2.21.0 --hash=sha256:{wheel}",
        f"torch==2.13.0+cpu --hash=sha256:{torch}",
    ]


# --- installs from an index: every file checked against the lock's hashes ---------------

H = "sha256:" + "a" * 64
LOCK = f"""# uv pip compile --universal --generate-hashes
numpy==2.2.6 \\
    --hash={H} \\
    --hash=sha256:{"b" * 64}
    # via torch
nvidia-ml-py==13.580.126 --hash={H}
tensorboard==2.21.0 --hash={H}
torch==2.13.0 ; platform_machine == 'x86_64' --hash={H}
sympy==1.14.0 --hash={H}
networkx==3.6.1 ; python_full_version == '3.11.*' \\
    --hash={H}
cuda-toolkit[cublas,cudart]==13.0.2 ; sys_platform == 'linux' --hash={H}
"""


def test_an_index_install_with_a_lock_installs_the_lock_whole_with_require_hashes(tmp_path: Path) -> None:
    lock = tmp_path / "pip-lock.txt"
    lock.write_text(LOCK)
    settings = dict(pip_index_url="http://10.0.0.5/simple", pip_lock_file=str(lock))
    ops, _ = plan_with_facts(frameworks.step, node(**settings), FakeHost())
    by_name = {o.name.removeprefix("Frameworks | "): o for o in ops}
    assert "pip lock: every file's hash" in by_name
    assert by_name["torch, numpy, nvidia-ml-py"].commands == [
        "/opt/provision/venv/bin/pip install --only-binary=:all: --index-url http://10.0.0.5/simple "
        "--require-hashes -r /opt/provision/pip-lock.txt"
    ]


def test_without_a_lock_an_index_install_is_unchecked_only_when_asked(tmp_path: Path) -> None:
    ops, _ = plan_with_facts(frameworks.step, node(pip_require_hashes=False), FakeHost())
    install = {o.name: o for o in ops}["Frameworks | torch, numpy, nvidia-ml-py"].commands
    assert install == [f"/opt/provision/venv/bin/pip install --only-binary=:all: torch==2.13.0 {PINS}"]


def test_a_lock_parses_pins_hashes_markers_comments_and_continuations() -> None:
    pins, problems = framework_rules.parse_lock(LOCK)
    assert problems == []
    assert pins == {
        "numpy": {"2.2.6"},
        "nvidia-ml-py": {"13.580.126"},
        "tensorboard": {"2.21.0"},
        "torch": {"2.13.0"},
        "sympy": {"1.14.0"},
        "networkx": {"3.6.1"},
        "cuda-toolkit": {"13.0.2"},
    }
    assert framework_rules.lock_problems(Settings(), LOCK) == []


def test_every_line_that_could_widen_what_roots_pip_takes_is_named() -> None:
    hostile = "\n".join(
        [
            "--index-url http://evil.example/simple",
            "--trusted-host evil.example",
            "-r other.txt",
            "-e git+https://example.invalid/x#egg=x",
            f"torch>=2.0 --hash={H}",  # not pinned
            "numpy==2.2.6",  # no hash
            f"numpy==2.2.6 --hash=md5:{'a' * 32}",  # not sha256
            f"https://example.invalid/torch.whl --hash={H}",  # a URL, not a name
            f"nvidia-ml-py==13.580.126 --hash={H} --no-deps",  # a trailing option
        ]
    )
    pins, problems = framework_rules.parse_lock(hostile)
    assert pins == {}
    assert [p.split(":")[0] for p in problems] == [f"line {n}" for n in range(1, 10)]


def test_a_lock_that_lacks_a_pin_or_pins_another_version_is_named() -> None:
    lock = f"torch==2.12.0 --hash={H}\nnumpy==2.2.6 --hash={H}\n"
    assert framework_rules.lock_problems(Settings(), lock) == [
        "it pins torch 2.12.0, the settings 2.13.0",
        "it has no nvidia-ml-py",
        "it has no tensorboard",
    ]
    assert framework_rules.lock_problems(Settings(), "# nothing\n") == ["it names no package"]


def test_a_lock_of_a_labelled_torch_build_satisfies_the_pin() -> None:
    lock = (
        f"torch==2.13.0+cu128 --hash={H}\nnumpy==2.2.6 --hash={H}\nnvidia-ml-py==13.580.126 --hash={H}\n"
        f"tensorboard==2.21.0 --hash={H}\n"
    )
    assert framework_rules.lock_problems(Settings(), lock) == []
