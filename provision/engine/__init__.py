"""The engine: the ONLY package that builds pyinfra State/Config and runs deploys or facts.

- ``run``: the steps of `provision up`, one pyinfra pass per step, typed per-host results;
- ``plan``: the same steps prepared, not executed (`provision plan`);
- ``facts``: facts from every host in parallel;
- ``context``: the RunContext a run shares with its deploys, and the calls a deploy makes
  (current_node, note, skip, refuse, secret_upload, put_secret);
- ``results``: the records (HostResult, Failure, RunReport, HostPlan, FactsResult, Step).

docs/ARCHITECTURE.md places it in the layers.
"""

from provision.engine.context import (
    RunContext,
    current_cluster,
    current_node,
    current_run,
    current_steps,
    note,
    put_secret,
    refuse,
    secret_upload,
    skip,
)
from provision.engine.facts import gather_facts
from provision.engine.per_pass import each_connected_host, once_per_pass
from provision.engine.plan import plan_steps
from provision.engine.results import (
    FactsResult,
    Failure,
    HostPlan,
    HostResult,
    OnEvent,
    PlannedOp,
    RunReport,
    Step,
    TimedOut,
    no_events,
)
from provision.engine.run import run_step, run_steps

__all__ = [
    "FactsResult",
    "Failure",
    "HostPlan",
    "HostResult",
    "OnEvent",
    "PlannedOp",
    "RunContext",
    "RunReport",
    "Step",
    "TimedOut",
    "current_cluster",
    "current_node",
    "current_run",
    "current_steps",
    "each_connected_host",
    "gather_facts",
    "no_events",
    "note",
    "once_per_pass",
    "plan_steps",
    "put_secret",
    "refuse",
    "run_step",
    "run_steps",
    "secret_upload",
    "skip",
]
