"""Reboots after the nvidia step: only hosts that need one, a bounded batch at a time,
never the controller, each verified after it comes back. On a cluster running Slurm each
host is drained first and its jobs waited for (slurm_drain_wait_s), and resumed once its
driver checks out (rules.slurm.drain_for_reboot, resume_after_reboot).

Only hosts the nvidia step ran on in this run are considered. One of them needs a reboot
when the nvidia step changed it and a package asked for a reboot
(/var/run/reboot-required), or when the kernel runs a different NVIDIA module than the
one installed (the "driver/library version mismatch" state). After the reboot, nvidia-smi
must answer with the pinned driver version; when a batch fails that, no later batch is
rebooted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra.api import deploy
from pyinfra.operations import server

from provision import engine
from provision.facts.gpus import Gpus, NvidiaDevices
from provision.facts.probes import RebootProbe, RebootState, SlurmDrainReason
from provision.inventory import Node
from provision.rules import slurm
from provision.rules.packages import driver_version_ok

# Seconds pyinfra waits after issuing the reboot before it tries to reconnect.
RECONNECT_DELAY_S = 10
STEP_MARGIN_S = 300  # the reboot step's own commands beside its two waits (jobs, SSH back)


def batch_size(hosts: int, requested: int | None) -> int:
    """At most this many hosts reboot at once: as asked, else a quarter of them, at least 1."""
    if requested is not None:
        return max(1, requested)
    return max(1, hosts // 4)


def batches(names: list[str], size: int) -> list[list[str]]:
    return [names[i : i + size] for i in range(0, len(names), size)]


def needs_reboot(probe: RebootState, changed: bool, has_gpu: bool) -> str | None:
    """Why this host must reboot, or None."""
    if changed and probe.reboot_required:
        return "packages changed and a reboot is required"
    if probe.loaded_module and probe.installed_module and probe.loaded_module != probe.installed_module:
        return f"kernel runs NVIDIA module {probe.loaded_module}, {probe.installed_module} is installed"
    if has_gpu and probe.installed_module and not probe.loaded_module:
        return f"NVIDIA module {probe.installed_module} is installed but not loaded"
    return None


def controller_machine_id(path: str = "/etc/machine-id") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def refuse_reason(node: Node, host_machine_id: str, controller_id: str) -> str | None:
    """Why this host must not be rebooted by this run: it is the machine running provision."""
    if node.ssh.hostname.startswith("@local") or node.name.startswith("@local"):
        return "it is reached through the @local connector, i.e. it is this machine"
    if host_machine_id and host_machine_id == controller_id:
        return f"its /etc/machine-id ({host_machine_id[:8]}...) is this machine's"
    return None


@dataclass(frozen=True)
class RebootPlan:
    """Which hosts reboot, and which would but may not."""

    reboot: dict[str, str]  # host -> why it reboots
    refused: dict[str, str]  # host -> why it needs one but is not rebooted here


def plan(
    nodes: list[Node],
    probes: dict[str, RebootState],
    gpus: dict[str, Gpus],
    changed: dict[str, bool],
    controller_id: str,
) -> RebootPlan:
    """The pure decision over all hosts."""
    reboot, refused = {}, {}
    for node in nodes:
        probe = probes.get(node.name)
        if probe is None:
            continue
        why = needs_reboot(probe, changed.get(node.name, False), bool(gpus[node.name].gpus))
        if not why:
            continue
        no = refuse_reason(node, probe.machine_id, controller_id)
        if no:
            refused[node.name] = f"{why}, but not rebooted: {no}; reboot it by hand"
        else:
            reboot[node.name] = why
    return RebootPlan(reboot, refused)


def _reboot_deploy() -> Callable[..., object]:
    @deploy("Reboot")
    def reboot() -> None:
        node = engine.current_node()
        settings = node.settings
        # The wait for jobs and the reboot share one step's deadline (step_timeout_s): the
        # wait gets what the reboot leaves of it, so the step is never cut off midway.
        wait_s = max(
            0, min(settings.slurm_drain_wait_s, settings.step_timeout_s - settings.reboot_timeout_s - STEP_MARGIN_S)
        )
        # On a Slurm node: drained first, and its running jobs waited for (bounded); the
        # host fails here, still drained and its jobs named, rather than reboot under them.
        server.shell(
            name="Slurm: drain, wait for the node's jobs",
            commands=[slurm.drain_for_reboot(node.name, wait_s)],
            _timeout=wait_s + 4 * slurm.SLURM_CALL_S + 60,
        )
        server.reboot(
            name="reboot and wait for SSH",
            delay=RECONNECT_DELAY_S,
            interval=2,
            reboot_timeout=node.settings.reboot_timeout_s,
            # The wait for SSH is one command to pyinfra: its deadline is the reboot's own,
            # not command_timeout_s (a host may take longer to boot than any command runs).
            _timeout=node.settings.reboot_timeout_s + RECONNECT_DELAY_S + 60,
        )

    return reboot


REBOOT_STEP = engine.Step("reboot", _reboot_deploy(), "reboot hosts that need it, a batch at a time")


def _resume_deploy() -> Callable[..., object]:
    @deploy("Resume in Slurm")
    def resume() -> None:
        node = engine.current_node()
        server.shell(
            name="Slurm: resume the node the reboot drained",
            commands=[slurm.resume_after_reboot(node.name)],
            _timeout=4 * (slurm.SLURM_CALL_S + 5) + slurm.SLURM_CALL_S + 30,
        )

    return resume


RESUME_STEP = engine.Step("reboot", _resume_deploy(), "resume rebooted hosts in Slurm once their driver checks out")


def candidates(nodes: list[Node], results: dict[str, engine.HostResult]) -> list[Node]:
    """Healthy hosts the nvidia step ran on in this run. A host it did not run on (nvidia:
    skip, --skip nvidia, no GPU: engine.skip keeps it out of the host's steps) is not this
    run's to reboot, even when its module and driver disagree (an admin's own driver upgrade)."""
    return [n for n in nodes if results[n.name].ok and "nvidia" in results[n.name].steps]


def reboot_where_needed(
    nodes: list[Node],
    results: dict[str, engine.HostResult],
    changed: dict[str, bool],
    batch: int | None,
    on_event: Callable[[str, str], None] = lambda host, text: None,
) -> None:
    """Decide, reboot in batches, verify the driver after each batch; record into results."""
    alive = candidates(nodes, results)
    if not alive:
        return
    wanted: dict[str, tuple[type, dict[str, Any]]] = {
        "probe": (RebootProbe, {}),
        "gpus": (NvidiaDevices, {}),
        "slurm": (SlurmDrainReason, {}),
    }
    facts = engine.gather_facts(alive, wanted)
    # A host that cannot be asked whether it needs a reboot has not converged: it fails here
    # rather than passing as "no reboot needed".
    for name, why in facts.failed.items():
        results[name].fail("reboot check", why)
    alive = [n for n in alive if n.name in facts.facts]
    probes = {h: v["probe"] for h, v in facts.facts.items()}
    gpus = {h: v["gpus"] for h, v in facts.facts.items()}
    decision = plan(alive, probes, gpus, changed, controller_machine_id())
    for name, why in decision.refused.items():
        results[name].notes.append(f"reboot: {why}")
    # A reboot's drain left from an earlier run (its reboot failed, or an admin rebooted the
    # host since) has no other owner: a host that needs no reboot now is resumed from it. One
    # that needs a reboot it may not get here (refused: the controller's own machine) stays
    # drained: its driver and libraries still disagree.
    leftover = [
        n
        for n in alive
        if n.name not in decision.reboot
        and n.name not in decision.refused
        and (facts.facts[n.name].get("slurm") or "").startswith(slurm.REBOOT_PREFIX)
    ]
    if leftover:
        for n in leftover:
            results[n.name].notes.append("slurm: resumed from an earlier run's reboot drain (no reboot needed now)")
        engine.run_step(RESUME_STEP, leftover, results, on_event)
    groups = batches(list(decision.reboot), batch_size(len(nodes), batch))
    reboot_batches(groups, {n.name: n for n in alive}, decision, results, on_event)


def reboot_batches(
    groups: list[list[str]],
    by_name: dict[str, Node],
    decision: RebootPlan,
    results: dict[str, engine.HostResult],
    on_event: Callable[[str, str], None],
) -> None:
    """One batch after another. A batch with a host that did not come back with the pinned
    driver stops the rest: whatever broke it would likely break the next batch too."""
    for index, group in enumerate(groups):
        for name in group:
            on_event(name, f"reboot: {decision.reboot[name]}")
        engine.run_step(REBOOT_STEP, [by_name[n] for n in group], results, on_event)
        for name in group:
            results[name].rebooted = results[name].ok
        verify_driver([by_name[n] for n in group if results[n].ok], results)
        # Back in Slurm only once the driver checks out; a host that failed stays drained.
        checked = [by_name[n] for n in group if results[n].ok]
        if checked:
            engine.run_step(RESUME_STEP, checked, results, on_event)
        failed = [n for n in group if not results[n].ok]
        if failed:
            for name in (n for later in groups[index + 1 :] for n in later):
                results[name].fail(
                    "reboot",
                    f"not rebooted because an earlier batch failed ({', '.join(failed)}); "
                    f"it still needs one ({decision.reboot[name]}): fix those hosts and re-run",
                )
                on_event(name, "reboot: not rebooted (an earlier batch failed)")
            return


def verify_driver(nodes: list[Node], results: dict[str, engine.HostResult]) -> None:
    """After a reboot: nvidia-smi must answer with the pinned driver version."""
    if not nodes:
        return
    facts = engine.gather_facts(nodes, {"probe": (RebootProbe, {})})
    for node in nodes:
        probe = facts.facts.get(node.name, {}).get("probe")
        settings = node.settings
        pinned = settings.nvidia_driver_version or f"{settings.nvidia_driver_branch}.*"
        if probe is None:
            results[node.name].fail("reboot", facts.failed.get(node.name, "no answer"))
        elif not probe.smi_version:
            results[node.name].fail("reboot", f"nvidia-smi does not answer after the reboot (driver {pinned} expected)")
        elif not driver_version_ok(probe.smi_version, settings.nvidia_driver_branch, settings.nvidia_driver_version):
            results[node.name].fail("reboot", f"nvidia-smi reports driver {probe.smi_version}, {pinned} is pinned")
