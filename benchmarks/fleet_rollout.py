"""Staged rollouts of `provision up` on simulated fleets: how far a canary and waves let a
bad change get, and what the staging costs in wall time against one unstaged pass
measured in the same run.

Hosts are the fleet stand-in (tests/standins/fleet_standin.py): pyinfra's ssh connector
replaced by one that answers from outputs captured on a real Debian 12 host after a set
latency, with a share of hosts that fail every command or hang. The step is the stand-in
step `fact_only_step` (one captured fact a host, nothing changed): the real steps'
commands were never captured, so this measures the rollout machinery and the engine, not
the deploys. Every figure is from the real pipeline (`provision.up.pipeline.up`).

    .venv/bin/python benchmarks/fleet_rollout.py                 # 1,000 hosts
    .venv/bin/python benchmarks/fleet_rollout.py --hosts 300 --fail 0.02
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provision import inventory  # noqa: E402
from provision.up import pipeline  # noqa: E402
from provision.up.rollout import Rollout  # noqa: E402
from tests.standins.fleet_standin import FleetShares, SimulatedFleet, fact_only_step, simulated  # noqa: E402

DEADLINES = {"connect_timeout_s": 2, "command_timeout_s": 2, "step_timeout_s": 20}


def scenarios(hosts: int) -> list[tuple[str, Rollout]]:
    wave = max(1, hosts // 10)
    return [
        ("unstaged (reference)", Rollout()),
        (f"--wave-size {wave} --max-fail 5%", Rollout(wave_size=wave, max_fail=0.05)),
        (f"--canary 10 --wave-size {wave} --max-fail 5%", Rollout(canary=10, wave_size=wave, max_fail=0.05)),
        (f"--canary 10 --wave-size {wave} (--max-fail 0)", Rollout(canary=10, wave_size=wave)),
    ]


def run(fleet: SimulatedFleet, inv: Path, rollout: Rollout) -> dict[str, float]:
    events: list[tuple[str, str]] = []
    start = time.monotonic()
    report = pipeline.up(inventory.load(inv), [fact_only_step()], lambda h, t: events.append((h, t)), rollout=rollout)
    wall = time.monotonic() - start
    not_run = sum(any(f.step == "rollout" for f in h.failures) for h in report.hosts.values())
    waves = len({t for _, t in events if t.startswith("rollout: ") and "not run" not in t}) or 1
    failed = sum(not h.ok for h in report.hosts.values()) - not_run
    return {
        "wall": wall,
        "waves": waves,
        "contacted": len(report.hosts) - not_run,
        "failed": failed,
        "not_run": not_run,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--fail", type=float, default=0.01, help="share of hosts failing every command")
    parser.add_argument("--hang", type=float, default=0.002, help="share of hosts that hang")
    parser.add_argument("--latency-s", type=float, default=0.05)
    parser.add_argument("--bad-canary", action="store_true", help="a failing host among the canary's")
    args = parser.parse_args()
    spread = SimulatedFleet.spread(args.hosts, FleetShares(fail=args.fail, hang=args.hang))
    # Misbehaving hosts spread evenly, none among the first 5 %: the canary (the first hosts)
    # passes and the waves meet the failures; --bad-canary keeps one at the very first host.
    names, behaviours = list(spread.behaviour), list(spread.behaviour.values())
    shift = 0 if args.bad_canary else max(1, args.hosts // 20)
    behaviours = behaviours[-shift:] + behaviours[:-shift] if shift else behaviours
    fleet = SimulatedFleet(dict(zip(names, behaviours, strict=True)), latency_s=args.latency_s)
    print(
        f"{args.hosts} simulated hosts, {len(fleet.named('fail'))} failing, {len(fleet.named('hang'))} hanging, "
        f"{args.latency_s * 1000:.0f} ms a command; deadlines {DEADLINES}"
    )
    print("| rollout | waves run | hosts contacted | failed | not run | wall s | wall vs unstaged |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp, simulated(fleet):
        inv = fleet.write_inventory(Path(tmp) / "fleet.py", **DEADLINES)
        reference = None
        for label, rollout in scenarios(args.hosts):
            r = run(fleet, inv, rollout)
            reference = reference or r["wall"]
            print(
                f"| {label} | {r['waves']:.0f} | {r['contacted']:.0f} | {r['failed']:.0f} | {r['not_run']:.0f} "
                f"| {r['wall']:.1f} | x{r['wall'] / reference:.2f} |"
            )


if __name__ == "__main__":
    main()
