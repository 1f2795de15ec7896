"""A failing host never stops the others: the runner contains each host's errors."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import server

from provision import engine
from provision.settings import Settings
from tests.helpers.pyinfra_fake import fake_node, run_fake


@deploy("Raises on one host")
def raises_on_bad() -> None:
    # A controller-side error while this host's operations are prepared (e.g. a state
    # file that cannot be written): not a PyinfraError.
    if engine.current_node().name.endswith("/bad"):
        raise OSError("state directory is read-only")
    server.shell(name="say hello", commands=["echo hello"])


STEP = engine.Step("raising", raises_on_bad, "a step that raises on one host")


def test_an_error_preparing_one_host_fails_that_host_and_the_others_finish(monkeypatch) -> None:
    good = fake_node("good", Settings(), {})
    bad = fake_node("bad", Settings(), {})
    run = run_fake(STEP, [good, bad], monkeypatch)
    assert run.results[good.name].ok
    assert "raising" in run.results[good.name].steps
    assert run.ran(good.name, r"echo hello")
    assert not run.results[bad.name].ok
    assert [str(f) for f in run.results[bad.name].failures] == [
        "raising: internal error: OSError: state directory is read-only"
    ]
    assert not run.ran(bad.name, r"echo hello")


def test_an_error_on_every_host_is_recorded_for_each(monkeypatch) -> None:
    bad = fake_node("bad", Settings(), {})
    run = run_fake(STEP, [bad], monkeypatch)
    assert [str(f) for f in run.results[bad.name].failures] == [
        "raising: internal error: OSError: state directory is read-only"
    ]


@deploy("Skips itself on one host")
def skips_on_quiet() -> None:
    if engine.current_node().name.endswith("/quiet"):
        engine.skip("selfskip", "nothing here for it")
        return
    server.shell(name="say hello", commands=["echo hello"])


def test_a_step_that_skips_itself_is_noted_and_not_counted_as_run(monkeypatch) -> None:
    # reboots.candidates trusts a host's steps: a skipped nvidia step must not be listed.
    step = engine.Step("selfskip", skips_on_quiet, "a step that finds nothing to do on one host")
    busy = fake_node("busy", Settings(), {})
    quiet = fake_node("quiet", Settings(), {})
    run = run_fake(step, [busy, quiet], monkeypatch)
    assert run.results[busy.name].steps == ["selfskip"]
    assert run.results[busy.name].notes == []
    assert run.results[quiet.name].ok
    assert run.results[quiet.name].steps == []
    assert run.results[quiet.name].notes == ["selfskip: skipped (nothing here for it)"]
