"""`--recipe NAME` and the flag of every knob: the recipe gives the defaults, a typed flag always wins."""

import dataclasses
import re

import pytest

from keras_cait.cli import runs
from keras_cait.training.recipe import RECIPES, Recipe, flag

COMMANDS = ("train", "finetune")
# A valid value of each knob that no recipe has, so that every knob is typed at least once with
# a value the recipe would not give.
OTHER = dict(batch_size=16, lr=3e-4, lr_batch=256, weight_decay=0.02, opt_betas=(0.8, 0.99), opt_eps=1e-7,
             clip_grad=1.0, epochs=7, warmup_epochs=2.0, warmup_lr=1e-7, min_lr=1e-6, sched="step", head_epochs=3,
             head_lr=1e-4, keep_head=True, randaugment=5.0, reprob=0.5, mixup=0.2, cutmix=0.3,
             mixup_switch_prob=0.3, repeated_aug=2, smoothing=0.2, drop_path=0.2, model_ema=False,
             model_ema_decay=0.999, distillation_type="hard", distillation_alpha=0.25, distillation_tau=2.0)


def knobs(command):
    return [field.name for field in dataclasses.fields(Recipe)
            if not (command == "train" and field.name in runs._HEAD_KNOBS)]


def typed(name, value):
    if isinstance(value, bool):
        return [flag(name)] if value else ["--no-" + flag(name)[2:]]
    if isinstance(value, tuple):
        return [flag(name), *map(str, value)]
    return [flag(name), str(value)]


def test_every_knob_has_another_value_here():
    assert set(OTHER) == {field.name for field in dataclasses.fields(Recipe)}
    assert all(OTHER[name] != getattr(RECIPES["deit"], name) for name in OTHER)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", RECIPES)
def test_a_typed_flag_wins_over_the_recipe_even_when_it_equals_a_default(command, name):
    """Every value another recipe (or the default recipe) gives a knob, typed beside --recipe NAME,
    before or after it, is the value of the run's recipe; untyped knobs keep NAME's values."""
    required = ["--data", "folder", "--output-dir", "out"]
    for knob in knobs(command):
        values = {getattr(recipe, knob) for recipe in RECIPES.values()} | {OTHER[knob]}
        for value in values - {None}:
            for argv in ([*required, "--recipe", name, *typed(knob, value)],
                         [*typed(knob, value), *required, "--recipe", name]):
                recipe = runs.recipe_of(runs.parse_arguments(command, argv))
                assert getattr(recipe, knob) == value, (argv, getattr(recipe, knob))
                assert recipe == RECIPES[name].replace(**{knob: value}), argv


@pytest.mark.parametrize("command", COMMANDS)
def test_without_recipe_the_command_runs_its_own(command):
    args = runs.parse_arguments(command, ["--data", "folder", "--output-dir", "out"])
    assert args.recipe == runs.DEFAULT_RECIPES[command]
    # train has no head flags: its head knobs stay the recipe's too.
    assert runs.recipe_of(args) == RECIPES[runs.DEFAULT_RECIPES[command]]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", RECIPES)
def test_help_shows_the_recipe_values(command, name, capsys):
    with pytest.raises(SystemExit):
        runs.main(command, ["--recipe", name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"recipe {name}:" in text
    for knob in knobs(command):
        if getattr(RECIPES[name], knob) is None:  # no default: the help says what leaving it out does
            assert re.search(re.escape(flag(knob)) + r" [A-Z0-9_]+ (?:(?! --[a-z]).)*?when not given", text), knob
            continue
        # The option's own line: the flag, then its metavar, choices or --no- form (not a mention
        # of the flag in another option's help, nor the usage line's "[--flag ...]").
        listed = re.search(r"(?<!\[)" + re.escape(flag(knob)) + r"(?: [A-Z0-9_]+| \{[^}]*\}|, --no-[a-z-]+)+ "
                           r"(.*?)\(default: ", text)
        assert listed, knob
        shown = text[listed.end():]
        assert shown.startswith(f"{getattr(RECIPES[name], knob)})"), (knob, shown[:40])
    if command == "train":
        assert "--head-epochs" not in text


def test_an_unknown_recipe_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        runs.main("finetune", ["--data", "folder", "--output-dir", "out", "--recipe", "deit-lowres"])
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--recipe" in error[0] and "deit-highres" in error[0], error


@pytest.mark.parametrize("argv, message", [
    (["--reprob", "1.5"], "--reprob 1.5: must be between 0 and 1; e.g. --reprob 0.25\n"),
    (["--opt-betas", "0.9", "1.5"], "--opt-betas 0.9 1.5: must be at least 0 and below 1; e.g. --opt-betas 0.9 0.999\n"),
    # 1 itself was taken, then refused by adamw as beta_1=1.0 / ema_momentum=1.0, no flags of the command.
    (["--opt-betas", "1", "1"], "--opt-betas 1 1: must be at least 0 and below 1; e.g. --opt-betas 0.9 0.999\n"),
    (["--model-ema-decay", "1"], "--model-ema-decay 1: must be at least 0 and below 1; e.g. --model-ema-decay 0.99996\n"),
    (["--distillation-tau", "0"], "--distillation-tau 0: must be positive; e.g. --distillation-tau 1\n"),
    (["--lr=-1e-3"], "--lr -0.001: must be at least 0; e.g. --lr 1e-05\n"),
])
def test_a_knob_out_of_range_is_refused_naming_its_flag(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        runs.main("finetune", ["--data", str(tmp_path), "--output-dir", str(tmp_path / "out"), *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("words, recipe", [
    (["--weights", "none"], "scratch"),  # the Python run's choice for weights=None
    (["--weights=None"], "scratch"),
    (["--weights", "none", "--recipe", "transfer"], "transfer"),  # a recipe typed wins
    (["--weights", "none", "--model", "run/best.keras"], "transfer"),  # a .keras holds its weights
    (["--weights", "imagenet"], "transfer"),
    ([], "transfer"),
])
def test_finetune_from_random_weights_runs_the_scratch_recipe_unless_one_is_typed(words, recipe, capsys, monkeypatch):
    args = runs.parse_arguments("finetune", ["--data", "folder", "--output-dir", "out", *words])
    assert args.recipe == recipe
    assert runs.recipe_of(args) == RECIPES[recipe]
    given = {}

    class Ran(Exception):
        pass

    def finetune(**arguments):
        given.update(arguments)
        raise Ran

    monkeypatch.setattr(runs.run, "finetune", finetune)
    with pytest.raises(Ran):
        runs.finetune_run(args)
    assert given["recipe"] == RECIPES[recipe]
    said = capsys.readouterr().out
    chosen = recipe == "scratch"
    assert ("--weights none: random weights, so the run trains with --recipe scratch" in said) == chosen, said
