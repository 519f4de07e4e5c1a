"""Every knob of a training run and its default, DeiT's: the values the pieces of
`keras_cait.training` (optimizer, schedule, augment) default to.

    Knobs    the knobs as one frozen object, with their help, group and range
    DEIT     Knobs(): DeiT's main.py with CaiT's 400 epochs

`keras_cait.training.recipe.Recipe` is `Knobs` with what a run builds from them. This module
imports none of those pieces, so they read their defaults here without an import circle.
"""

import dataclasses
import json
import math
import numbers
import os

import numpy

from keras_cait.io import atomic
from keras_cait.errors import ArgumentError, MissingPath, Named, quietly_caused

GROUPS = ("optimizer (AdamW)", "schedule", "augmentation", "regularisation", "distillation")


def knob(default, help, group, low=None, high=None, choices=None, positive=False, below=False):  # noqa: A002
    """A field of `Knobs`: its default is DeiT's; the rest is what the command line shows and checks
    (`low`/`high`: the allowed range, `high` itself out of it with `below`; `positive`: above 0)."""
    return dataclasses.field(default=default, metadata=dict(help=help, group=group, low=low, high=high,
                                                              choices=choices, positive=positive, below=below))


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Every knob of a training run. The defaults are DeiT's main.py (facebookresearch/deit), which
    CaiT's training reuses, with CaiT's 400 epochs; `keras_cait.training.recipe.Recipe` adds what a
    run builds from them, and its `RECIPES` say where each recipe's values come from.

    Learning rates are quoted for a global batch of `lr_batch` images and scaled linearly with
    the global batch of the run (DeiT's rule). A fine-tuning run with `head_epochs` first trains a
    new head alone at `head_lr`; `keep_head` keeps a loaded model's head when it predicts the
    run's classes (DeiT's `--finetune`).
    """

    # Optimizer: DeiT --opt adamw --lr 5e-4 (per 512 images) --weight-decay 0.05 --opt-eps 1e-8.
    batch_size: int = knob(64, "batch per replica (GPU); the global batch is this × replicas", "optimizer (AdamW)",
                           low=1)
    lr: float = knob(5e-4, "peak learning rate for a global batch of --lr-batch, scaled linearly with the batch",
                     "optimizer (AdamW)", low=0.0)
    lr_batch: int = knob(512, "the global batch --lr and --head-lr are quoted for", "optimizer (AdamW)", low=1)
    weight_decay: float = knob(0.05, "decoupled weight decay (none on biases, norms, LayerScale, pos_embed, "
                                     "cls_token)", "optimizer (AdamW)", low=0.0)
    opt_betas: tuple = knob((0.9, 0.999), "AdamW's beta_1 and beta_2", "optimizer (AdamW)", low=0.0, high=1.0,
                            below=True)
    opt_eps: float = knob(1e-8, "AdamW's epsilon (Keras' own default is 1e-7)", "optimizer (AdamW)", low=0.0)
    clip_grad: float = knob(None, "clip the norm of all gradients taken together (timm's clip_grad_norm_); off "
                                  "when not given", "optimizer (AdamW)", low=0.0)
    # Schedule: DeiT --sched cosine --warmup-epochs 5 --warmup-lr 1e-6 --min-lr 1e-5; CaiT 400 epochs.
    epochs: int = knob(400, "training epochs (after the head epochs)", "schedule", low=0)
    warmup_epochs: float = knob(5.0, "linear warmup epochs", "schedule", low=0.0)
    warmup_lr: float = knob(1e-6, "learning rate of the first step", "schedule", low=0.0)
    min_lr: float = knob(1e-5, "learning rate at the end of the cosine", "schedule", low=0.0)
    sched: str = knob("epoch", "epoch: one rate per epoch, the warmup laid over the cosine (timm's "
                               "CosineLRScheduler, DeiT's); step: per step, the warmup before the cosine",
                      "schedule", choices=("epoch", "step"))
    head_epochs: int = knob(0, "fine-tuning: epochs training a new head alone, the backbone frozen",
                            "schedule", low=0)
    head_lr: float = knob(1e-3, "fine-tuning: learning rate of the head epochs for a global batch of --lr-batch",
                          "schedule", low=0.0)
    keep_head: bool = knob(False, "fine-tuning: keep a loaded model's head when it predicts the data's classes",
                           "schedule")
    # Augmentation: DeiT --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0
    # --mixup-switch-prob 0.5 --smoothing 0.1 --repeated-aug (3 copies).
    randaugment: float = knob(9.0, "RandAugment magnitude of 10, 0 disables", "augmentation", low=0.0, high=10.0)
    reprob: float = knob(0.25, "random erasing probability", "augmentation", low=0.0, high=1.0)
    mixup: float = knob(0.8, "mixup alpha, 0 disables", "augmentation", low=0.0)
    cutmix: float = knob(1.0, "cutmix alpha, 0 disables", "augmentation", low=0.0)
    mixup_switch_prob: float = knob(0.5, "probability of cutmix when both are on", "augmentation", low=0.0, high=1.0)
    repeated_aug: int = knob(3, "augmented copies of each image per epoch, 1 disables", "augmentation", low=1)
    smoothing: float = knob(0.1, "label smoothing", "augmentation", low=0.0, high=0.99)
    # Regularisation: DeiT-S --drop-path 0.1 (CaiT's S models 0.1); --model-ema-decay 0.99996.
    drop_path: float = knob(0.1, "stochastic depth rate, the same in every block", "regularisation",
                            low=0.0, high=0.99)
    model_ema: bool = knob(True, "keep a moving average of the weights, saved as ema.keras; best.keras and "
                                 "final.keras keep the raw weights", "regularisation")
    model_ema_decay: float = knob(0.99996, "EMA decay per step", "regularisation", low=0.0, high=1.0, below=True)
    # Distillation: DeiT --distillation-type none --distillation-alpha 0.5 --distillation-tau 1.0.
    distillation_type: str = knob("none", "hard: cross-entropy with the teacher's class; soft: KL at "
                                          "--distillation-tau (needs --teacher)", "distillation",
                                  choices=("none", "soft", "hard"))
    distillation_alpha: float = knob(0.5, "weight of the distillation term", "distillation", low=0.0, high=1.0)
    distillation_tau: float = knob(1.0, "temperature of soft distillation", "distillation", positive=True)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            problem = out_of_range(field, getattr(self, field.name))
            if problem:
                raise KnobError(type(self).__name__, field.name, getattr(self, field.name), *problem)
            object.__setattr__(self, field.name, _python(field, getattr(self, field.name)))

    def replace(self, **changes):
        """A copy with `changes`, e.g. `RECIPES["deit"].replace(epochs=30)`; a knob out of its range
        is refused (`KnobError`) with this recipe's value as the example."""
        fields = {field.name: field for field in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no knob {', '.join(unknown)}; its knobs: "
                            f"{', '.join(knobs())}.")
        for name, value in changes.items():
            problem = out_of_range(fields[name], value, example=getattr(self, name) or None)
            if problem:
                raise KnobError(type(self).__name__, name, value, *problem)
        return dataclasses.replace(self, **changes)

    # === As a file ===

    def as_dict(self):
        return {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    def save(self, path, name=None):
        """Writes the recipe as readable JSON (`{"recipe": name, "lr": ...}`), put in place whole. A
        `path` that is a folder is refused (it was replaced, and all it held, by the file)."""
        path = _recipe_path(path)
        if os.path.isdir(path):
            raise ArgumentError("path", path, "is a folder, where save writes one JSON file",
                                f"give a file in it, e.g. {os.path.join(path, 'recipe.json')!r}", usage=True)
        if name is not None and not isinstance(name, str):
            raise ArgumentError("name", name, f"must be the name of a recipe (a str) or None, not "
                                f"{type(name).__name__}", "e.g. name='deit'", usage=True,
                                shown=f"<{type(name).__name__}>")
        atomic.write_text(path, json.dumps({"recipe": name, **self.as_dict()}, indent=2) + "\n")

    @classmethod
    def named(cls):
        """The named recipes ({name: recipe}) a recipe file may name; `Recipe`'s are `RECIPES`."""
        return {}

    @classmethod
    def load(cls, path):
        """The recipe of a `recipe.json` (a run's, or one written by `save`). A file written by hand
        may give some knobs only: the others are those of the recipe it names (`"recipe":
        "transfer"`), or DeiT's where it names none (`Recipe()`). Each refusal is an
        `ArgumentError` naming `path`: a missing file (a `FileNotFoundError` too:
        `keras_cait.errors.MissingPath`), a folder, a file that is no recipe (not JSON, an unknown
        knob, a value out of range, knobs missing and a recipe named that RECIPES has not)."""
        recipes = cls.named()
        path = _recipe_path(path)
        allowed = 'write it with Recipe.save(path), or as JSON {"recipe": "<name>", "<knob>": value, ...}'
        if os.path.isdir(path):
            raise ArgumentError("path", path, "is a folder, not a recipe file",
                                f"give the file, e.g. {os.path.join(path, 'recipe.json')!r}", usage=True)
        if not os.path.exists(path):
            raise MissingPath("path", path, "no such file", "give a recipe.json: a run's, or one written by "
                              "Recipe.save(path)")
        try:
            with open(path, encoding="utf-8") as file:
                values = json.loads(file.read())
        except ValueError as error:  # UnicodeDecodeError too
            raise ArgumentError("path", path, f"is no recipe file: not JSON text ({error})", allowed) from None
        if not isinstance(values, dict):
            raise ArgumentError("path", path, f"is no recipe file: a JSON {type(values).__name__}, not an object",
                                allowed)
        name = values.pop("recipe", None)
        if name is not None and not isinstance(name, str):  # a list was `unhashable type: 'list'`
            raise ArgumentError("path", path, f'names the recipe {name!r}, which is no name',
                                f'give "recipe": one of {", ".join(map(repr, recipes))}, or null')
        unknown = sorted(set(values) - set(knobs()))
        if unknown:
            raise ArgumentError("path", path, f"has no knob {', '.join(unknown)}", f"its knobs: {', '.join(knobs())}")
        missing = [knob for knob in knobs() if knob not in values]
        if missing and name is not None and name not in recipes:
            raise ArgumentError("path", path, f"lacks the knobs {', '.join(missing)} and names the recipe {name!r}, "
                                "which RECIPES has not, to take them from",
                                f'give "recipe": one of {", ".join(map(repr, recipes))}, or every knob')
        try:
            return cls(**{**(recipes[name].as_dict() if missing and name is not None else {}), **values})
        except KnobError as error:
            raise quietly_caused(ArgumentError("path", path, f"its {error}"), error) from None


def _recipe_path(path):
    """`path` of `save` and `load` as a str; None or a number is an `ArgumentError` naming it."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ArgumentError("path", path, "must be the path of a recipe file", "e.g. 'recipe.json'", usage=True)
    return os.fspath(path)


class KnobError(ArgumentError):
    """A knob of the wrong type or out of its range: `knob` (also `argument`), its `value`, the
    `problem` ('must be at least 0') and what is `allowed` ('e.g. lr=0.0005'); `owner`: the class
    of the recipe ("Recipe")."""

    def __init__(self, owner, knob, value, problem, allowed=None):
        self.owner, self.knob = owner, knob
        super().__init__(knob, value, problem, allowed, usage=True)


def knobs():
    return [field.name for field in dataclasses.fields(Knobs)]


def flag(name):
    """The command-line flag of a knob: `warmup_epochs` -> `--warmup-epochs`."""
    return "--" + name.replace("_", "-")


def in_recipe(name, *value, **named):
    """A knob inside a run's error, a `Named` part: `recipe.batch_size=8` from Python (a field of
    the run's `recipe`), `--batch-size 8` on the command line, where each knob is a flag."""
    return Named(f"recipe.{name}", *value, **named)


def out_of_range(field, value, example=None):
    """What is wrong with `value` for the knob `field`: `(problem, allowed)`, e.g. ('must be at
    least 0', ['e.g. ', Named('lr', 0.05)]) (the example: `example`, else DeiT's value); () if nothing."""
    example = field.default if example is None else example
    allowed = None if example is None else ["e.g. ", Named(field.name, example)]
    kind = _wrong_type(field, value)
    if kind:
        return kind, allowed
    low, high, choices = field.metadata["low"], field.metadata["high"], field.metadata["choices"]
    if choices is not None:
        return () if value in choices else (f"must be one of {', '.join(choices)}", None)
    positive = field.metadata["positive"]
    if value is None or isinstance(value, bool) or (low is None and high is None and not positive):
        return ()
    for item in value if isinstance(value, (tuple, list)) else (value,):
        below = field.metadata["below"]
        if not math.isfinite(item) or (positive and item <= 0) or (low is not None and item < low) or (
                high is not None and (item >= high if below else item > high)):
            # 1.0 for a beta or the EMA decay used to pass here and be refused by adamw, naming beta_1.
            limits = "positive" if positive else f"at least {low:g}" if high is None else \
                f"at least {low:g} and below {high:g}" if below else f"between {low:g} and {high:g}"
            return f"must be {limits}", allowed
    return ()


# What a knob's value may be, by the type its field declares (None: a knob off, e.g. clip_grad).
_TYPES = {int: ("an integer", numbers.Integral), float: ("a number", numbers.Real),
          bool: ("True or False", (bool, numpy.bool_)),  # numpy's too, as `errors.checked_bool` takes them
          str: ("a string", str)}


def _wrong_type(field, value):
    """'must be an integer, not str' where `value` is not of the knob's type, else ''."""
    if field.type is tuple:
        count = len(field.default)
        if isinstance(value, (tuple, list)) and len(value) == count and all(
                isinstance(item, numbers.Real) and not isinstance(item, bool) for item in value):
            return ""
        return f"must be {count} numbers, not {_kind(value)}"
    if value is None and field.default is None:
        return ""
    wanted, types = _TYPES[field.type]
    if isinstance(value, types) and (field.type is bool or not isinstance(value, bool)):
        return ""
    return f"must be {wanted}, not {_kind(value)}"


def _kind(value):
    """`str '3'`, `bool`: a value's type, and the value where it is short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 20 and not isinstance(value, (bool, type(None))) \
        else type(value).__name__


def shown(value):
    """A number or a pair of numbers as the command line takes it: 0.9 0.999."""
    return " ".join(f"{item:g}" for item in value) if isinstance(value, (tuple, list)) else f"{value:g}"


def _python(field, value):
    """A checked knob's value as the Python type its field declares: numpy's 3 as 3, a pair as JSON
    gives it back (a list) as a tuple, so that a recipe compares, prints and saves as one written by
    hand."""
    if value is None:
        return None
    if field.type is tuple:
        return tuple(float(item) for item in value)
    return field.type(value)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


DEIT = Knobs()
