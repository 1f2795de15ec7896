"""The slurm step's second pass, on the head alone (``CONTROLLER_STEP``): what slurmctld does
about the files every host of the pass has now written.

- slurmctld restarted when the controller, the node list or a node's GPU count changed
  (Slurm 22.05 reads the first two only at start, and a reconfigure refuses the third);
  stamp "slurmctld-nodes", ``controller_restart_inputs`` of the head's slurm.conf;
- else ``scontrol reconfigure`` when slurm.conf or cgroup.conf changed (stamp "slurm-conf",
  the same stamp and inputs the slurm step used before this pass existed, so a cluster set
  up by an earlier version does not reconfigure again);
- slurmctld restarted once for accounting turned on or off (accounting.controller_accounting).

Why a pass of its own: a host's operations do not wait for the other hosts' within a pass
(engine/deadlines), and each of these makes every slurmd register again with what it has
read. Run in the slurm step's pass, the head's reconfigure could reach a node before that
node wrote its new gres.conf: the node registered its old GPU count and slurmctld drained it
("gres/gpu count reported lower than configured (0 < 2)"), as the testbed's GPU job test
found, and as a node whose driver the nvidia step just installed would (0 -> 8 GPUs). The
pipeline (up/pipeline.py, after_step) runs this pass once the slurm step has ended on every
host of the wave, on the head alone where its slurm step ran to the end; a compute node
whose gres.conf changed restarted its own slurmd in the slurm step already.

Its inputs are the head's own files as the slurm step left them (FileContents), nothing
computed again. `provision plan` runs no after_step: it shows this pass's reconfigure as the
slurm step's "scontrol reconfigure due" operation on the head (which clears the stamp), and
does not show the restart for a node list change.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FileContents

from provision.deploys.slurm import CONF_STAMP, CTLD_RESTART_STAMP, SLURM_CONF, accounting, controller_restart_inputs
from provision.engine import Step, current_cluster, refuse
from provision.operations.stamps import follow_up
from provision.rules import slurm as rules


def file_text(lines: list[str]) -> str:
    """A file's text from FileContents' lines (each without its newline; the files the slurm
    step writes end with one)."""
    return "".join(f"{line}\n" for line in lines)


@deploy("Slurm controller")
def controller() -> None:
    lines = host.get_fact(FileContents, path=SLURM_CONF)
    if lines is None:  # the slurm step wrote it in this run: gone since is not a state to act on
        refuse("slurm", f"{SLURM_CONF} is missing on the head after the slurm step wrote it; run up again")
        return
    text = file_text(lines)
    ctld = f"{rules.CONTROLLER_PACKAGE}.service"
    follow_up(
        "Restart slurmctld (the controller, the node list or a node's GPU count changed)",
        CTLD_RESTART_STAMP,
        controller_restart_inputs(text),
        [f"systemctl restart {ctld}"],
        lambda: False,  # a first run has no stamp: the restart runs after the first start
    )
    # The slurm step clears this stamp when it changed either file in this run (even back to
    # what the stamp holds: an edit by hand that slurmctld may have read), so a change alone
    # is enough here. cgroup.conf is the one text every host writes: rules.cgroup_conf().
    follow_up(
        "scontrol reconfigure (slurm.conf changed)",
        CONF_STAMP,
        [text, rules.cgroup_conf()],
        ["scontrol reconfigure"],
        lambda: False,
    )
    # Accounting's restart is here too, not in the slurm step: it is a slurmctld restart like
    # the one above, and every slurmd registers again after it, so it must also wait for the
    # compute nodes' files. slurmdbd answers by now (the slurm step registered the cluster).
    cluster = current_cluster()
    head, _ = cluster.head_node()
    accounting.controller_accounting(cluster, head.settings.slurm_accounting)


CONTROLLER_STEP = Step(
    "slurm", controller, "Slurm on the head, after every node's files: slurmctld restarted or reconfigured"
)
