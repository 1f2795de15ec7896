"""tune's Optuna glue (study.py), the reading of a trial's log (trial.Reporter) and the
keeping of the best checkpoint (results.py), against real Optuna with in-memory storage."""

from __future__ import annotations

import shlex
import types
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from provision.tune import results, space, study, sweep, trial
from provision.tune.space import Param, Space

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = """
[lr]
low = 1e-4
high = 1e-2
log = true
[warmup-steps]
low = 0
high = 20
step = 5
[dropout]
choices = [0.0, 0.1]
[model]
choices = ["tiny", "small"]
"""


def parsed(text: str = SPACE, sampler: str = "tpe", trials: int = 8) -> Space:
    return space.parse(text, "space.toml", trials=trials, sampler=sampler)


def test_distributions_follow_the_space():
    d = study.distributions(parsed())
    assert d["lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    assert d["warmup-steps"] == optuna.distributions.IntDistribution(0, 20, step=5)
    assert d["dropout"] == optuna.distributions.CategoricalDistribution([0.0, 0.1])
    assert d["model"] == optuna.distributions.CategoricalDistribution(["tiny", "small"])


def test_the_defaults_are_the_trainers_own_parser_defaults():
    """The enqueued first trial: what the trainer runs without the flag (its parser read
    for real here), or what tune passes every trial (model, batch)."""
    from tests.unit.test_train_ddp import load_trainer

    defaults = load_trainer().parse_args([])
    one = {"choice": '"tiny"', "int": "1", "float": "1"}
    every = "".join(f"[{flag}]\nchoices = [{one[kind]}]\n" for flag, kind in space.TUNABLE.items())
    got = study.defaults(parsed(every, trials=1), model="small", global_batch=16, micro_batch=8)
    for flag, const in study.DEFAULT_CONSTANTS.items():
        assert got[flag] == getattr(defaults, flag.replace("-", "_")), flag
        assert const in study.trainer_constants()
    sizes = study.plan.model_sizes()["small"]
    assert (got["n-layer"], got["n-head"], got["n-embd"]) == sizes[:3]
    assert (got["model"], got["global-batch"], got["micro-batch"]) == ("small", 16, 8)
    assert set(got) == set(space.TUNABLE)


def test_grid_values_cover_the_grid():
    text = "[warmup-steps]\nlow = 0\nhigh = 20\nstep = 5\n[lr]\nlow = 0.001\nhigh = 0.003\nstep = 0.001\n"
    s = parsed(text, "grid", 16)
    by_flag = {p.flag: study.grid_values(p) for p in s.params}
    assert by_flag == {"warmup-steps": [0, 5, 10, 15, 20], "lr": [0.001, 0.002, 0.003]}
    assert len(by_flag["warmup-steps"]) * len(by_flag["lr"]) == s.grid_size()


@pytest.mark.parametrize("name", study.SAMPLERS)
def test_every_sampler_suggests_inside_the_space(name):
    s = parsed('[warmup-steps]\nlow = 0\nhigh = 20\nstep = 5\n[model]\nchoices = ["tiny", "small"]\n', name, 11)
    st = optuna.create_study(sampler=study.sampler(name, s, seed=1))
    dists = study.distributions(s)
    seen = set()
    for _ in range(10):
        t = st.ask(dists)
        assert t.params["warmup-steps"] in range(0, 21, 5)
        assert t.params["model"] in ("tiny", "small")
        seen.add((t.params["warmup-steps"], t.params["model"]))
        st.tell(t, float(t.params["warmup-steps"]))
    if name == "grid":
        assert len(seen) == 10  # every point once


def test_the_median_pruner_stops_a_trial_worse_than_the_median():
    st = optuna.create_study(pruner=study.pruner("median", eval_interval=10, steps=40))
    for loss in (2.0, 2.2):  # two finished trials: the pruner's start-up
        t = st.ask()
        for step in (10, 20, 30, 40):
            t.report(loss, step)
        st.tell(t, loss)
    t = st.ask()
    t.report(3.0, 10)
    assert t.should_prune()
    assert isinstance(study.pruner("none", eval_interval=10, steps=40), optuna.pruners.NopPruner)
    assert isinstance(study.pruner("hyperband", eval_interval=10, steps=40), optuna.pruners.HyperbandPruner)


def test_the_journal_storage_reopens_with_its_trials(tmp_path):
    st = optuna.create_study(storage=study.storage(tmp_path), study_name="s")
    st.enqueue_trial({"x": 1.0})
    t = st.ask({"x": optuna.distributions.FloatDistribution(0, 2)})
    st.tell(t, 0.5)
    again = optuna.load_study(storage=study.storage(tmp_path), study_name="s")
    assert [(x.params, x.value) for x in again.trials] == [({"x": 1.0}, 0.5)]
    assert study.dashboard_command(tmp_path) == f"optuna-dashboard {shlex.quote(str(tmp_path / 'study.journal'))}"


class Prunes:
    """Stands in for an Optuna trial where only the pruner's answer matters."""

    number = 3

    def __init__(self, prune_at: int | None):
        self.reports: list[tuple[float, int]] = []
        self.prune_at = prune_at

    def report(self, value: float, step: int) -> None:
        self.reports.append((value, step))

    def should_prune(self) -> bool:
        return self.prune_at is not None and self.reports[-1][1] >= self.prune_at


def test_the_reporter_reports_each_evaluation_and_asks_to_stop_once():
    asked = []
    r = trial.Reporter(Prunes(prune_at=20), lambda step, why: asked.append((step, why)))
    for line in (
        "step 10/40 | train loss 4.0000 | lr 1e-3",
        "step 10/40 | val loss 4.5000",
        "step 20/40 | val loss 4.4",
    ):
        r.feed("rank0", line)
    r.feed("rank0", "step 20/40 | val loss 4.4")  # a repeated line is not a second report
    r.feed("rank0", "step 30/40 | val loss 4.3")
    assert r.trial.reports == [(4.5, 10), (4.4, 20), (4.3, 30)]
    assert asked == [(20, "pruned at step 20: val loss 4.4000")]
    assert r.last == (30, 4.3)


@pytest.mark.parametrize(
    "line",
    [
        "step 10/40 | val loss nan",
        "step 10/40 | val loss inf",
        "step 10/40 | val loss 1e999",
        "step 10/40 | val loss 4.5; rm -rf /",
        "step x/40 | val loss 4.5",
        "xx step 10/40 | val loss 4.5",
        "step 99999999999/40 | val loss 4.5",
    ],
)
def test_a_line_that_is_not_an_evaluation_reports_nothing(line):
    r = trial.Reporter(Prunes(None), lambda *_: None)
    r.feed("rank0", line)
    assert r.trial.reports == []
    assert r.last is None


def test_only_rank_0_reports_and_the_summary_is_read_as_data():
    from provision.launch import logs

    r = trial.Reporter(Prunes(None), lambda *_: None)
    r.feed("rank1", "step 10/40 | val loss 4.5")
    assert r.trial.reports == []
    curves = logs.Curves()  # the launch parses the summary line; the reporter reads its fields
    curves.feed('summary {"final_val_loss": 3.25, "checkpoint": "/ck/tune-s-t3-step00000040.pt", "stopped": null}')
    r.summary = curves.summary
    assert r.final_loss() == 3.25
    assert r.checkpoint() == "/ck/tune-s-t3-step00000040.pt"
    assert not r.stopped()
    curves.feed('summary {"final_val_loss": "NaN", "checkpoint": "relative.pt", "stopped": {"step": 20}}')
    r.summary = curves.summary
    assert r.final_loss() is None  # not a number: nothing was reported either
    assert r.checkpoint() is None  # not absolute
    assert r.stopped()
    for bad in (
        "summary {not json",
        "summary [1, 2]",
        "summary {" + '"x": 1, ' * 20_000 + "}",
        "summary " + "[" * 5000,
    ):
        curves.feed(bad)
    assert curves.summary == {"final_val_loss": "NaN", "checkpoint": "relative.pt", "stopped": {"step": 20}}


def test_trainer_flags_keep_full_precision():
    assert trial.trainer_flags({"lr": 0.1 + 0.2, "model": "tiny", "warmup-steps": 5}) == [
        "--lr", "0.30000000000000004", "--model", "tiny", "--warmup-steps", "5",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/shared/checkpoints/tune-s-t3-step00000040.pt", True),
        ("/w/checkpoints/tune-s-t3-step00000040.pt", True),
        ("/shared/checkpoints/tune-s-t4-step00000040.pt", False),  # another trial's
        ("/etc/shadow", False),
        ("/shared/../etc/tune-s-t3-step00000040.pt", False),
        ("shared/tune-s-t3-step00000040.pt", False),
        ("/shared/x y/tune-s-t3-step00000040.pt", False),
        ("/shared/tune-s-t3-step00000040.pt\n/etc/shadow", False),
        ("/shared/tune-s-t3-step40.pt", False),
    ],
)
def test_only_the_trials_own_checkpoint_is_copied(path, ok):
    assert results.checkpoint_ok(path, trial.ckpt_name("s", 3)) is ok


def test_finished_counts_complete_pruned_and_given_up():
    st = optuna.create_study()
    for state, attrs in (
        (TrialState.COMPLETE, {}),
        (TrialState.PRUNED, {}),
        (TrialState.FAIL, {}),  # retried: not finished
        (TrialState.FAIL, {"gave_up": True}),
        (TrialState.FAIL, {"interrupted": True}),
    ):
        t = st.ask()
        for k, v in attrs.items():
            t.set_user_attr(k, v)
        if state == TrialState.COMPLETE:
            st.tell(t, 1.0)
        else:
            st.tell(t, state=state)
    assert sweep.finished(st) == 3


def test_resume_asks_interrupted_and_orphaned_trials_again_once(tmp_path):
    st = optuna.create_study(storage=study.storage(tmp_path), study_name="s")
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    done = st.ask(dist)
    st.tell(done, 1.0)
    cut = st.ask(dist)
    cut.set_user_attr("interrupted", True)
    st.tell(cut, state=TrialState.FAIL)
    orphan = st.ask(dist)  # the controller died under it: still RUNNING in the journal
    assert sweep._requeue_interrupted(st) == 2
    assert st.trials[orphan.number].state == TrialState.FAIL
    waiting = st.get_trials(states=(TrialState.WAITING,))
    assert sorted(w.user_attrs["retry_of"] for w in waiting) == [cut.number, orphan.number]
    assert {w.system_attrs["fixed_params"]["lr"] for w in waiting} == {cut.params["lr"], orphan.params["lr"]}
    assert sweep._requeue_interrupted(st) == 0  # a second --resume does not ask them a third time


def test_a_new_study_starts_with_the_defaults_and_refuses_a_taken_name(tmp_path):
    s = parsed()
    opts = sweep.SweepOptions(
        trials=4, parallel=2, sampler="tpe", pruner="median", study="s", resume=False, retries=1, seed=1,
        per_gpu=True, study_dir=tmp_path,
        settings=trial.TrialSettings("s", 40, "tiny", 8, 10, 1, (), None, tmp_path / "trials", 60),
    )  # fmt: skip
    st = sweep.open_study(s, opts)
    (first,) = st.get_trials(states=(TrialState.WAITING,))
    assert first.user_attrs == {"default": True}
    assert first.system_attrs["fixed_params"] == {"lr": 1e-3, "warmup-steps": 5, "dropout": 0.0, "model": "tiny"}
    with pytest.raises(sweep.SweepError, match="add --resume"):
        sweep.open_study(s, opts)
    other = parsed(SPACE.replace("high = 20", "high = 30"))
    with pytest.raises(sweep.SweepError, match="another space"):
        sweep.open_study(other, opts.__class__(**{**opts.__dict__, "resume": True}))
    assert sweep.open_study(s, opts.__class__(**{**opts.__dict__, "resume": True})).study_name == "s"


def test_the_report_escapes_what_came_from_nodes(tmp_path):
    row = results.Row(0, "FAIL", None, {"model": "tiny"}, "n<1>", 3.0, True, None, "<script>x</script>")
    summary = results.Summary("s", str(tmp_path), [row], None, None, {"FAIL": 1}, "optuna-dashboard x")
    page = results.html_report(summary, {"history": "not drawn: ValueError: <b>"})
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "n&lt;1&gt;" in page


def test_param_defaults_hold_for_a_grid_of_one_param():
    p = Param("seed", "int", 0, 3, step=1)
    assert study.grid_values(p) == [0, 1, 2, 3]


def test_a_gpu_slot_sees_its_gpu_and_the_trainer_runs_alone():
    import io
    from dataclasses import replace

    from provision.launch import logs, plan
    from provision.tune.slots import Slot

    node_plan = plan.NodePlan("n1", "10.0.0.1", "eth0", "/py", 1, "/r", "/w", True)
    run = plan.RunPlan("tune-x", "10.0.0.1", 29500, (node_plan,), ("--steps", "5"), solo=True)
    assert trial._on_slot(run, Slot("n1")) is run
    on_gpu = trial._on_slot(run, Slot("n1", 2))
    assert plan.node_env(on_gpu, node_plan)["CUDA_VISIBLE_DEVICES"] == "2"
    alone = plan.node_command(on_gpu, node_plan)
    assert "CUDA_VISIBLE_DEVICES=2" in alone
    assert "torch.distributed.run" not in alone
    assert alone.endswith("/py /r/train_ddp.py --steps 5 2>&1")
    assert "PROVISION_RUN_ID=tune-x" in alone  # the reaper's markers, as for torchrun
    assert "torch.distributed.run" in plan.node_command(replace(run, solo=False), node_plan)
    # The lone trainer's lines carry no rank prefix: they are rank 0's, for the launch's
    # curves and the sweep's reporter alike; under torchrun such a line is torchrun's own.
    for solo, who in ((True, "rank0"), (False, "torchrun")):
        seen: list[tuple[str, str]] = []
        sink = logs.LineSink(
            "n1", io.StringIO(), lambda _h, w, t, seen=seen: seen.append((w, t)), replace(run, solo=solo).unprefixed
        )
        sink.write("step 3/5 | val loss 4.0\n[rank1]:hello\n")
        assert seen == [(who, "step 3/5 | val loss 4.0"), ("rank1", "hello")]


def test_defaults_outside_the_space_are_sampled_not_fixed(tmp_path):
    """A default that is not among the choices cannot be a fixed parameter (Optuna raises),
    nor 0 on a log scale: those are left to the sampler, and the study says so."""
    s = parsed(
        "[lr]\nchoices = [1e-4, 3e-4]\n"
        "[dropout]\nlow = 0.01\nhigh = 0.5\nlog = true\n"
        "[warmup-steps]\nlow = 0\nhigh = 9\n"
    )
    kept, outside = study.inside(s, {"lr": 1e-3, "dropout": 0.0, "warmup-steps": 5})
    assert kept == {"warmup-steps": 5}
    assert [line.split(":")[0] for line in outside] == ["lr", "dropout"]
    st = sweep.open_study(s, options(tmp_path))
    assert st.user_attrs["defaults_outside"] == outside
    t = st.ask(study.distributions(s))  # the defaults trial: asked without an error
    assert t.params["warmup-steps"] == 5
    assert t.params["lr"] in (1e-4, 3e-4)


def options(tmp_path: Path, **changes: object) -> sweep.SweepOptions:
    base = sweep.SweepOptions(
        trials=4, parallel=2, sampler="tpe", pruner="median", study="s", resume=False, retries=1, seed=1,
        per_gpu=True, study_dir=tmp_path,
        settings=trial.TrialSettings("s", 40, "tiny", 8, 10, 1, (), None, tmp_path / "trials", 60),
    )  # fmt: skip
    return base.__class__(**{**base.__dict__, **changes})


def sweep_of(st: optuna.Study, s: Space, opts: sweep.SweepOptions) -> sweep._Sweep:
    from provision.tune.slots import Slot, SlotQueue

    cluster = types.SimpleNamespace(storage_node=lambda: None)
    queue = SlotQueue([Slot("n1")], parallel=1, retries=opts.retries)
    return sweep._Sweep(cluster, {}, st, s, opts, queue, lambda *_: None, lambda *_: None)  # type: ignore[arg-type]


def test_asks_stop_at_trials_and_a_retry_is_not_a_new_trial(tmp_path):
    s = parsed()
    opts = options(tmp_path, trials=3)
    st = sweep.open_study(s, opts)
    sw = sweep_of(st, s, opts)
    first = sw._ask()
    assert first.user_attrs == {"default": True}
    sw._failed(first, first.number, "n1", trial.TrialEnd("failed", None, 0, "rank died"))  # asked again once
    again = sw._ask()
    assert again.user_attrs["retry_of"] == first.number
    assert again.params == first.params
    st.tell(again, 1.0)
    rest = [sw._ask(), sw._ask()]
    for t in rest:
        st.tell(t, 2.0)
    assert sw._ask() is None  # three trials: the defaults (with its retry) and two more
    assert sweep.finished(st) == 3


def test_resume_counts_retries_left_waiting_as_the_trials_they_repeat(tmp_path):
    """--trials 4: two complete; of two running at once, one fails (its retry enqueued,
    not yet asked) and the other is interrupted. The resumed sweep runs the retry and the
    interrupted one again, and nothing more: 4 trials, not 5."""
    s = parsed()
    opts = options(tmp_path, trials=4)
    st = sweep.open_study(s, opts)
    sw = sweep_of(st, s, opts)
    for _ in range(2):
        st.tell(sw._ask(), 1.0)
    failed, cut = sw._ask(), sw._ask()
    sw._failed(failed, failed.number, "n1", trial.TrialEnd("failed", None, 0, "rank died"))
    cut.set_user_attr("interrupted", True)
    st.tell(cut, state=TrialState.FAIL)
    resumed = options(tmp_path, trials=4, resume=True)
    st2 = sweep.open_study(s, resumed)
    assert sweep._requeue_interrupted(st2) == 1
    sw2 = sweep_of(st2, s, resumed)
    asked = []
    while (t := sw2._ask()) is not None:
        asked.append(t)
        st2.tell(t, 3.0)
    assert [t.user_attrs.get("retry_of") for t in asked] == [failed.number, cut.number]
    assert sweep.finished(st2) == 4


def test_a_trial_is_not_retried_past_its_stored_attempts(tmp_path):
    s = parsed()
    opts = options(tmp_path, trials=1, retries=1)
    st = sweep.open_study(s, opts)
    st.enqueue_trial({"lr": 1e-3}, user_attrs={"retry_of": 0, "attempt": 2})
    sw = sweep_of(st, s, opts)
    sw._ask()  # the defaults
    second = sw._ask()
    assert second.user_attrs["attempt"] == 2
    sw._failed(second, 0, "n1", trial.TrialEnd("failed", None, 0, "again"))
    assert st.trials[second.number].user_attrs["gave_up"] is True
    assert not st.get_trials(states=(TrialState.WAITING,))
