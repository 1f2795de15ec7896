"""Registering the cluster in slurmdbd (rules.slurm_accounting.register_cluster_command) run
for real by sh, against a stand-in for sacctmgr (no slurmdbd here): nothing added when the
cluster is listed, retried while slurmdbd is still starting, and a failure that says where to
look when it never lists it. Against a real slurmdbd: tests/e2e/test_slurm_e2e.py.

The script runs with a PATH of its own: the stand-ins first, then only the real tools it
uses, so a Slurm installed on this machine is never asked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from provision.rules import slurm_accounting as accounting

REAL_TOOLS = ("sh", "cat", "grep", "timeout", "touch")

# Test stand-in for sacctmgr: fails (slurmdbd not answering) until its "answers" file exists,
# lists the clusters in its "clusters" file, and records every add.
SACCTMGR = """#!/bin/sh
[ -e {state}/answers ] || {{ echo "sacctmgr: error: Connection refused" >&2; exit 1; }}
case "$*" in
  "-n -P list cluster format=cluster") cat {state}/clusters 2>/dev/null ;;
  "-i add cluster "*) echo "$4" >> {state}/added; echo "$4" >> {state}/clusters ;;
  *) exit 9 ;;
esac
"""
# Test stand-ins for sleep (no wait) and date (each call 60 s later): the script's deadline in
# a few calls. From its call number ``up_after`` on, date makes the "answers" file: a
# slurmdbd that comes up while the script waits.
SLEEP = "#!/bin/sh\nexit 0\n"
DATE = """#!/bin/sh
n=$(cat {state}/clock 2>/dev/null || echo 0); echo $((n + 1)) > {state}/clock
[ "$n" -lt {up_after} ] || touch {state}/answers
echo $((1000 + n * 60))
"""


def _run(tmp: Path, *, listed: bool = False, up_after: int = 0):
    bin_dir, state = tmp / "standin", tmp / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("sacctmgr", SACCTMGR), ("sleep", SLEEP), ("date", DATE)):
        (bin_dir / name).write_text(text.format(state=state, up_after=up_after))
        (bin_dir / name).chmod(0o755)
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not installed here"
        (bin_dir / tool).symlink_to(found)
    if listed:
        (state / "clusters").write_text("other\nlab\n")
    done = subprocess.run(
        ["sh", "-c", accounting.register_cluster_command("lab")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    added = (state / "added").read_text().split() if (state / "added").exists() else []
    return done, added


def test_a_listed_cluster_is_not_added_again(tmp_path: Path) -> None:
    done, added = _run(tmp_path, listed=True)
    assert (done.returncode, added) == (0, []), done.stderr


def test_the_cluster_is_added_once_slurmdbd_answers(tmp_path: Path) -> None:
    done, added = _run(tmp_path, up_after=1)
    assert (done.returncode, added) == (0, ["lab"]), done.stderr


def test_a_slurmdbd_that_never_answers_fails_saying_where_to_look(tmp_path: Path) -> None:
    done, added = _run(tmp_path, up_after=1000)
    assert done.returncode == 1
    assert added == []
    assert "slurmdbd did not list cluster lab" in done.stderr
    assert "/var/log/slurm/slurmdbd.log" in done.stderr
