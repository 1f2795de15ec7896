"""The slurm step's shell for nodes leaving and rejoining Slurm, run for real by dash (the
shell pyinfra runs): the head's SlurmLeaving fact over a slurm.conf, the leaving node's
drain and the check for jobs started since, and the resume of a node that came back. Slurm's
commands are test stand-ins (sinfo, squeue, scontrol) over a state directory; against a real
slurmctld this is the end-to-end tier's (tests/e2e/test_slurm_e2e.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.facts.probes import SlurmLeaving, parse_roster
from provision.rules import slurm

pytestmark = pytest.mark.skipif(shutil.which("dash") is None, reason="dash is the shell pyinfra runs commands with")

# Stand-ins for Slurm's commands: <state>/reason.<node> holds a node's reason (absent: Slurm
# does not know the node), <state>/jobs.<node> its job ids, <state>/down makes squeue fail.
STANDINS = {
    "sinfo": """#!/bin/sh
# Test stand-in for sinfo: --nodes=<n> --format='%E', or every node with --format='%N|%E';
# fails while <state>/sinfo-down exists.
[ -e "$S/sinfo-down" ] && { echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1; }
for a in "$@"; do case "$a" in --nodes=*) n=${a#--nodes=} ;; esac; done
if [ -n "$n" ]; then [ -e "$S/reason.$n" ] && cat "$S/reason.$n"; exit 0; fi
for f in "$S"/reason.*; do [ -e "$f" ] && echo "${f##*/reason.}|$(cat "$f")"; done; exit 0
""",
    "squeue": """#!/bin/sh
# Test stand-in for squeue: --nodelist=<n>; fails while <state>/down exists.
[ -e "$S/down" ] && { echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; }
for a in "$@"; do case "$a" in --nodelist=*) n=${a#--nodelist=} ;; esac; done
[ -e "$S/jobs.$n" ] && cat "$S/jobs.$n"; exit 0
""",
    "scontrol": """#!/bin/sh
# Test stand-in for scontrol update: records the call, and sets the node's reason.
echo "$*" >> "$S/scontrol.log"
n=; reason=; state=
for a in "$@"; do
  case "$a" in NodeName=*) n=${a#NodeName=} ;; Reason=*) reason=${a#Reason=} ;; State=*) state=${a#State=} ;; esac
done
case "$state" in DRAIN) echo "$reason" > "$S/reason.$n" ;; RESUME) echo none > "$S/reason.$n" ;; esac
""",
}


@pytest.fixture
def fake_slurm(tmp_path: Path):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in STANDINS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "S": str(state)}

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["dash", "-c", command], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
        )

    return state, run


CONF = """ClusterName=provision
NodeName=node1 NodeAddr=10.0.0.1 CPUs=2 RealMemory=1000 Weight=1 State=UNKNOWN
NodeName=node2 NodeAddr=10.0.0.2 CPUs=2 RealMemory=1000 Weight=1 State=UNKNOWN
NodeName=node3 NodeAddr=10.0.0.3 CPUs=2 RealMemory=1000 Weight=1 State=UNKNOWN
PartitionName=main Nodes=node1,node2,node3 Default=YES State=UP
"""


def test_the_head_names_leaving_nodes_with_their_jobs_and_returning_ones(fake_slurm, tmp_path) -> None:
    state, run = fake_slurm
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF)
    (state / "jobs.node2").write_text("4711\n4712_[1-3]\n")
    (tmp_path / "4712_1").write_text("")  # a file the array id would glob to, unquoted
    for n, reason in (("node1", "none"), ("node2", "none"), ("node3", "none"), ("node4", slurm.REMOVED_REASON)):
        (state / f"reason.{n}").write_text(reason + "\n")
    fact = SlurmLeaving()
    out = run(fact.command(("node1", "node4"), removed=slurm.REMOVED_PREFIX, conf=str(conf)))
    assert out.returncode == 0, out.stderr
    roster = parse_roster(out.stdout.splitlines())
    assert {n: v.jobs for n, v in roster.leaving.items()} == {"node2": ["4711", "4712_[1-3]"], "node3": []}
    assert roster.leaving["node3"].line.startswith("NodeName=node3 NodeAddr=10.0.0.3 ")
    assert roster.leaving["node3"].reason == "none"
    assert roster.returning == ["node4"]  # a compute node whose drain is still the removal's
    # squeue not answering: the node's jobs are unknown (None), so it is kept.
    (state / "down").write_text("")
    roster = parse_roster(run(fact.command(("node1",), conf=str(conf))).stdout.splitlines())
    assert {n: v.jobs for n, v in roster.leaving.items()} == {"node2": None, "node3": None}
    # No slurm.conf (Slurm not set up yet on the head): nothing, and no failure.
    missing = run(fact.command(("node1",), conf=str(tmp_path / "none.conf")))
    assert (missing.returncode, missing.stdout) == (0, "")


def test_a_leaving_node_is_drained_over_no_reason_or_the_health_checks_and_a_new_job_fails_the_head(
    fake_slurm,
) -> None:
    state, run = fake_slurm
    (state / "reason.node3").write_text("provision: health: / 99% full\n")
    assert run(slurm.drain_leaving("node3", dropping=True)).returncode == 0
    assert (state / "reason.node3").read_text().strip() == slurm.REMOVED_REASON
    # An admin's drain, validate's and a reboot's stay theirs (the node is drained already):
    # a node put back is resumed by the owner that knows whether it is fit.
    for reason in ("admin: RMA 42", "provision: validate: gpu_bf16_tflops 512 < 742", "provision: reboot: up"):
        (state / "reason.node3").write_text(reason + "\n")
        out = run(slurm.drain_leaving("node3", dropping=True))
        assert out.returncode == 0
        assert f"left as it was (drained by its owner): {reason}" in out.stdout
        assert (state / "reason.node3").read_text().strip() == reason
    # Slurm not answering: fails, and nothing is dropped on a guess.
    (state / "sinfo-down").write_text("")
    out = run(slurm.drain_leaving("node3", dropping=True))
    assert out.returncode == 1
    assert "cannot read node3's state in Slurm: it stays in slurm.conf" in out.stderr
    (state / "sinfo-down").unlink()
    # A job that started since the head looked: the head fails, the node drained, named.
    (state / "reason.node3").write_text("none\n")
    (state / "jobs.node3").write_text("4800(bob)\n")
    out = run(slurm.drain_leaving("node3", dropping=True))
    assert out.returncode == 1
    assert "jobs started on node3 while it was leaving: 4800(bob)" in out.stderr
    assert (state / "reason.node3").read_text().strip() == slurm.REMOVED_REASON
    # Kept (it has jobs): drained, and no failure.
    assert run(slurm.drain_leaving("node3", dropping=False)).returncode == 0
    # A node Slurm no longer lists: nothing to drain.
    assert run(slurm.drain_leaving("node9", dropping=True)).returncode == 0
    assert "NodeName=node9" not in (state / "scontrol.log").read_text()


def test_a_returning_node_is_resumed_only_from_the_removals_drain(fake_slurm) -> None:
    state, run = fake_slurm
    (state / "reason.node4").write_text(slurm.REMOVED_REASON + "\n")
    assert run(slurm.resume_returning("node4")).returncode == 0
    assert (state / "reason.node4").read_text().strip() == "none"
    (state / "reason.node4").write_text("admin: bad fan\n")  # drained by an admin since the pass looked
    assert run(slurm.resume_returning("node4")).returncode == 0
    assert (state / "reason.node4").read_text().strip() == "admin: bad fan"
