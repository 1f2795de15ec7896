"""tune/space: the sweep's search-space file, read and checked before any node is contacted."""

from __future__ import annotations

import argparse

import pytest

from provision.tune import space
from tests.unit.test_train_ddp import load_trainer

GOOD = """
[lr]
low = 1e-4
high = 3e-3
log = true

[warmup-steps]
low = 0
high = 50
step = 5

[model]
choices = ["tiny", "small"]

[global-batch]
choices = [16, 32]
"""


@pytest.fixture(scope="module")
def trainer():
    return load_trainer()


@pytest.fixture
def trainer_parser(trainer, monkeypatch):
    """The trainer's own argparse parser, kept as the trainer parses its defaults."""
    parsers: list[argparse.ArgumentParser] = []
    parse = argparse.ArgumentParser.parse_args

    def keep(self, *args, **kwargs):
        parsers.append(self)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep)
    trainer.parse_args([])
    return parsers[0]


def test_every_tunable_flag_is_the_trainers_with_the_same_type(trainer, trainer_parser):
    actions = {a.option_strings[0]: a for a in trainer_parser._actions if a.option_strings}
    for flag, kind in space.TUNABLE.items():
        action = actions.get(f"--{flag}")
        assert action is not None, flag
        if kind == "choice":
            assert tuple(action.choices) == space.model_presets() == tuple(sorted(trainer.MODEL_SIZES))
        else:
            assert action.type is {"int": int, "float": float}[kind], flag
    assert set(space.BOUNDS) == {f for f, k in space.TUNABLE.items() if k != "choice"}


def test_a_good_file_gives_each_flag_its_range_or_choices_and_the_trainer_takes_them(trainer):
    parsed = space.parse(GOOD, "good.toml", trials=10, sampler="tpe")
    assert parsed.params == (
        space.Param("lr", "float", 1e-4, 3e-3, log=True),
        space.Param("warmup-steps", "int", 0, 50, step=5),
        space.Param("model", "choice", choices=("tiny", "small")),
        space.Param("global-batch", "choice", choices=(16, 32)),
    )
    argv = [w for p, v in zip(parsed.params, (2e-4, 10, "small", 32), strict=True) for w in p.argv(v)]
    args = trainer.parse_args(argv)
    assert (args.lr, args.warmup_steps, args.model, args.global_batch) == (2e-4, 10, "small", 32)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[learning-rate]\nlow = 1\nhigh = 2\n", "learning-rate: not a flag a sweep can set"),
        ("[weight_decay]\nlow = 0.0\nhigh = 0.1\n", "weight_decay: not a flag a sweep can set (write flags"),
        ("[steps]\nlow = 1\nhigh = 2\n", "steps: not a flag a sweep can set"),
        ("lr = 0.001\n", "lr: give a table"),
        ("[lr]\nlow = 0.1\nhigh = 0.1\n", "lr: empty range: low 0.1 is not below high 0.1"),
        ("[lr]\nlow = 0.2\nhigh = 0.1\n", "lr: empty range"),
        ("[lr]\nhigh = 0.1\n", "lr: give low (or choices)"),
        ("[lr]\nlow = 'small'\nhigh = 0.1\n", "lr: low must be a number, not 'small'"),
        ("[lr]\nlow = true\nhigh = 0.1\n", "lr: low must be a number, not True"),
        ("[lr]\nlow = nan\nhigh = 0.1\n", "lr: low must be a number, not nan"),
        ("[lr]\nlow = 0.001\nhigh = inf\n", "lr: high must be a number, not inf"),
        ("[lr]\nlow = 0.0\nhigh = 0.1\nlog = true\n", "lr: a log scale needs low above 0"),
        ("[lr]\nlow = 0.01\nhigh = 0.1\nlog = 'yes'\n", "lr: log must be true or false"),
        ("[lr]\nlow = 0.01\nhigh = 0.1\nlog = true\nstep = 0.01\n", "lr: step and log do not go together"),
        ("[lr]\nlow = 0.01\nhigh = 0.1\nscale = 'log'\n", "lr: unknown key scale"),
        ("[lr]\nlow = -0.1\nhigh = 0.1\n", "lr: -0.1..0.1 is outside 0.0 or more"),
        ("[dropout]\nlow = 0.0\nhigh = 1.5\n", "dropout: 0.0..1.5 is outside 0.0..1.0"),
        ("[warmup-steps]\nlow = 0\nhigh = 10.5\n", "warmup-steps: high must be a whole number, not 10.5"),
        ("[warmup-steps]\nlow = 0\nhigh = 10\nstep = 0\n", "warmup-steps: step must be above 0"),
        ("[warmup-steps]\nlow = 0\nhigh = 10\nstep = 20\n", "warmup-steps: step 20 is wider than the range"),
        ("[global-batch]\nlow = 0\nhigh = 64\n", "global-batch: 0..64 is outside 1 or more"),
        ("[model]\nlow = 1\nhigh = 2\n", "model: give choices"),
        ("[model]\nchoices = ['tiny', 'huge']\n", "model: choices must be one of gpt2, medium, small, tiny; not"),
        ("[model]\nchoices = []\n", "model: choices must be a non-empty list"),
        ("[model]\nchoices = 'tiny'\n", "model: choices must be a non-empty list"),
        ("[global-batch]\nchoices = [16, 16]\n", "global-batch: a value is listed twice"),
        ("[global-batch]\nchoices = [16, 32.5]\n", "global-batch: choices must be whole numbers; not 32.5"),
        ("[global-batch]\nchoices = [0, 16]\n", "global-batch: 0 is outside 1 or more"),
        ("[lr]\nchoices = [0.001]\nlow = 0.1\n", "lr: choices is a list of values; low, high"),
        ("[seed]\nchoices = [" + ", ".join(str(i) for i in range(1001)) + "]\n", "seed: 1001 choices; at most 1000"),
        ("", "no parameters"),
        ("[lr\nlow = 1\n", "not TOML"),
    ],
)
def test_each_bad_space_is_refused_with_one_line_naming_the_parameter(text, problem):
    with pytest.raises(space.SpaceError) as refused:
        space.parse(text, "space.toml", trials=100, sampler="tpe")
    assert len(refused.value.problems) == 1
    assert refused.value.problems[0].startswith(problem), refused.value.problems
    assert str(refused.value).startswith("space.toml: ")


def test_every_problem_in_a_file_is_reported_at_once():
    text = "[lr]\nlow = 1\nhigh = 0\n[foo]\nlow = 1\n[model]\nchoices = ['huge']\n[dropout]\nlow = 0\nhigh = 2\n"
    with pytest.raises(space.SpaceError) as refused:
        space.parse(text, "space.toml", trials=10, sampler="tpe")
    assert [p.split(":")[0] for p in refused.value.problems] == ["lr", "foo", "model", "dropout"]


def test_a_grid_needs_a_finite_space_no_larger_than_the_trials():
    continuous = "[lr]\nlow = 0.001\nhigh = 0.01\n"
    with pytest.raises(space.SpaceError, match="lr: a grid needs a step or choices"):
        space.parse(continuous, "s", trials=100, sampler="grid")
    assert space.parse(continuous, "s", trials=100, sampler="random").grid_size() is None

    finite = "[lr]\nlow = 0.001\nhigh = 0.005\nstep = 0.001\n[warmup-steps]\nlow = 0\nhigh = 10\nstep = 5\n"
    assert space.parse(finite, "s", trials=16, sampler="grid").grid_size() == 5 * 3  # the defaults, then 15
    with pytest.raises(space.SpaceError, match="the grid has 15 points and --trials is 15: the defaults run first"):
        space.parse(finite, "s", trials=15, sampler="grid")
    models = "[model]\nchoices = ['tiny', 'small']\n[n-layer]\nlow = 1\nhigh = 4\n"
    assert space.parse(models, "s", trials=9, sampler="grid").grid_size() == 2 * 4


def test_a_file_that_cannot_be_read_is_a_space_error(tmp_path):
    with pytest.raises(space.SpaceError, match="cannot read it"):
        space.load(tmp_path / "missing.toml", trials=8, sampler="tpe")
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe[lr]")
    with pytest.raises(space.SpaceError, match="cannot read it"):
        space.load(tmp_path / "binary.toml", trials=8, sampler="tpe")
    (tmp_path / "good.toml").write_text(GOOD)
    assert len(space.load(tmp_path / "good.toml", trials=8, sampler="tpe").params) == 4
