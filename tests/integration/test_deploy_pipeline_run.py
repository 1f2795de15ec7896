"""up's input checks before any host, with a loopback listener that must see no connection."""

from __future__ import annotations


def test_a_wheelhouse_without_the_pinned_versions_is_bad_input_before_any_host(cli, tmp_path) -> None:
    house = tmp_path / "wheels"
    house.mkdir()
    for name in (
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
        "nvidia_ml_py-13.580.126-py3-none-any.whl",
        "tensorboard-2.21.0-py3-none-any.whl",
    ):
        (house / name).write_bytes(b"wheel")
    inventory = tmp_path / "inv.py"
    inventory.write_text(f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'wheelhouse': '{house}'}})]\n")
    result = cli("up", str(inventory), "--only", "frameworks")
    assert result.code == 2
    said = " ".join(result.err.split())  # one message, however the terminal wraps it
    assert said.startswith(f"error: {inventory}: host n1: key wheelhouse: {house} has no wheel for numpy==2.2.6 (")
    assert "pip download numpy==2.2.6 --only-binary=:all:" in said
    assert "nvidia-ml-py" not in said
    assert result.out.strip() == ""  # said before any progress display
    # The same wheelhouse with the pinned numpy passes the check (port 1 then fails the host).
    (house / "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"wheel")
    assert "has no wheel" not in cli("up", str(inventory), "--only", "frameworks").err
