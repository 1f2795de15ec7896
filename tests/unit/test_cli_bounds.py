"""Numbers on the command line with no sense in them are bad input, said before any host is
contacted (a CLI audit, session 50: infinities overflowed sbatch --time and the monitor's
clock into tracebacks, a seed past 2**32 failed only after the nodes were probed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.tune import space

INV = "nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'cluster_address': '10.0.0.1'})]\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["train", "--timeout", "inf"], "--timeout"),
        (["train", "--monitor-interval", "1e300"], "--monitor-interval"),
        (["train", "--steps", "100000000000000000000"], "--steps"),
        (["train", "--batch-per-rank", "100000000000000000000"], "--batch-per-rank"),
        (["train", "--nproc-per-node", "100000000000000000000"], "--nproc-per-node"),
        (["train", "--min-nodes", "1", "--drop-stragglers", "inf"], "--drop-stragglers"),
        (["tune", "--seed", "-1"], "--seed"),
        (["tune", "--seed", "4294967296"], "--seed"),
        (["tune", "--parallel", "100000000000000000000"], "--parallel"),
        (["tune", "--threads", "100000000000000000000"], "--threads"),
        (["tune", "--trial-timeout", "inf"], "--trial-timeout"),
        (["tune", "--node-timeout", "inf"], "--node-timeout"),
    ],
)
def test_an_absurd_number_is_bad_input_naming_its_flag(cli, tmp_path: Path, args, said) -> None:
    inv = tmp_path / "inv.py"
    inv.write_text(INV)
    (tmp_path / "space.toml").write_text("[lr]\nlow = 1e-4\nhigh = 1e-2\n")
    command, *flags = args
    extra = ["--space", str(tmp_path / "space.toml"), "--trials", "2"] if command == "tune" else []
    result = cli(command, str(inv), *extra, *flags)
    assert result.code == 2, (result.out, result.err)
    assert said in result.err, result.err
    assert "Traceback" not in result.err
    assert "internal error" not in result.err


def test_a_grid_step_too_small_to_count_is_refused_not_an_overflow() -> None:
    with pytest.raises(space.SpaceError, match="grid"):
        space.parse("[lr]\nlow = 0.0\nhigh = 1.0\nstep = 5e-324\n", "s.toml", trials=2, sampler="grid")
