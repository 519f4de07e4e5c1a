"""The plan of a run: what its recipe allows, its replicas, its batches, and how it compiles a model."""

import dataclasses
import numbers

import keras

from keras_cait.errors import Named, checked_bool
from keras_cait.training import distribute, stream
from keras_cait.training.knobs import in_recipe
from keras_cait.training.recipe import RECIPES, Recipe
from keras_cait.training.run_errors import RunError, about


# The counts a run takes: {argument: (the least value, an example, whether None is allowed)}.
COUNTS = {
    "seed": (0, 0, False),
    "backup_every": (1, 1000, False),
    "shuffle_buffer": (1, 10000, True),  # None: every example
    "lora_rank": (0, 8, False),  # 0: the whole network
    "batch_size": (1, 64, False),
}


def check_counts(**given):
    """Each of `given` (argument=value, arguments of `COUNTS`) an integer of at least its least
    value, else a RunError naming it (usage), before the run reads anything."""
    for argument, value in given.items():
        least, example, none_allowed = COUNTS[argument]
        if value is None and none_allowed:
            continue
        integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not integer or value < least:
            raise RunError(argument, value, f"must be an integer of at least {least}" + (
                "" if integer else f", not {type(value).__name__}"), ["e.g. ", Named(argument, example)], usage=True)


def checked_recipe(recipe, default):
    """A run's `recipe` argument as a `Recipe`: `default` for None, a name of `RECIPES` ("deit"), or a
    `Recipe` as it is; anything else is refused."""
    if recipe is None:
        return default
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str) and recipe in RECIPES:
        return RECIPES[recipe]
    first_names = {}  # of each recipe (not the former names kept beside them)
    for name, named in RECIPES.items():
        first_names.setdefault(id(named), name)
    names = ", ".join(repr(name) for name in first_names.values())
    raise RunError("recipe", recipe, "no recipe of that name" if isinstance(recipe, str) else
                   "neither a Recipe nor a recipe's name",
                   f"give a name of RECIPES ({names}) or a Recipe, e.g. RECIPES['deit'].replace(epochs=30)", usage=True)


def check_recipe(recipe, teacher, command):
    """What the recipe and the run's arguments cannot do together, refused before any data are read."""
    if command == "finetune" and recipe.epochs == 0 and recipe.head_epochs == 0:
        raise RunError("recipe.epochs", 0, ["nothing to train, with ", in_recipe("head_epochs", 0)],
                       ["give ", in_recipe("epochs"), " or ", in_recipe("head_epochs"), " of at least 1"], usage=True)
    if command == "train" and recipe.epochs == 0:
        raise RunError("recipe.epochs", 0, "nothing to train", ["give ", in_recipe("epochs", 1), " or more"],
                       usage=True)
    if recipe.epochs and not 0 <= recipe.warmup_epochs < recipe.epochs:
        raise RunError("recipe.warmup_epochs", recipe.warmup_epochs,
                       ["the warmup must be shorter than the run of ", in_recipe("epochs", recipe.epochs)],
                       ["give ", in_recipe("epochs", int(recipe.warmup_epochs) + 1), " or more, or ",
                        in_recipe("warmup_epochs"), f" from 0 to below {recipe.epochs} (fractions too)"], usage=True)


def distribution(strategy):
    """The `distribute.Distribution` of `strategy` ("none", "mirrored", ...)."""
    with about("strategy", strategy, ValueError):
        return distribute.distribution(strategy)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The batches of a run: decided once, from the recipe, the replicas and the data."""

    global_batch: int
    steps: int

    @classmethod
    def of(cls, recipe, distribution, data):
        global_batch = distribution.global_batch_size(recipe.batch_size)
        if global_batch > data.train.num_examples:
            fits = _batch_that_fits(distribution, data)
            raise RunError(
                "recipe.batch_size", recipe.batch_size,
                f"the global batch of {global_batch} is larger than the {data.train.num_examples} training images "
                f"of {data.spec!r}", ["give ", in_recipe("batch_size", fits), " or less, or more images, or ",
                                      Named("fit_batch_to_data", True), " to have it lowered"], usage=True)
        return cls(global_batch, stream.steps_per_epoch(data.train, global_batch))


def _batch_that_fits(distribution, data):
    return max(1, data.train.num_examples // distribution.replicas)


def batch_fitted(recipe, distribution, data):
    """(the recipe with its batch lowered to what the training images fill, the notice that says so),
    or (the recipe, None) where they fill it."""
    if distribution.global_batch_size(recipe.batch_size) <= data.train.num_examples:
        return recipe, None
    fits = _batch_that_fits(distribution, data)
    return recipe.replace(batch_size=fits), (
        f"Batch {recipe.batch_size} per replica is more than the {data.train.num_examples} training images "
        f"fill: batch {fits} instead (the learning rate scales with it).")


def reports_top5(num_classes):
    """Whether a run reports top-5 accuracy for `num_classes` classes: above 5 (of 5 or fewer,
    every label is in the top 5 and top-5 accuracy is always 100 %); training and evaluation alike."""
    return num_classes > 5


def _metrics(num_classes):
    metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
    if reports_top5(num_classes):
        metrics.append(keras.metrics.TopKCategoricalAccuracy(5, name="top5"))
    return metrics


def _computes_in_float16(model):
    return any(layer.dtype_policy.compute_dtype == "float16" for layer in model.layers)


def compile_for(model, recipe, global_batch, steps_per_epoch, head=False, jit_compile=True):
    """`model` compiled as a run compiles it: the recipe's AdamW and schedule (the head stage's
    with `head`), categorical cross-entropy weighted by sample (rows of weight 0 fill a last,
    partial batch across hosts) and accuracy (top-5 too above 5 classes). A model computing in
    float16 gets Keras' dynamic loss scaling (`LossScaleOptimizer`) whatever the global policy,
    which is all Keras looks at."""
    optimizer = recipe.optimizer(model, global_batch, steps_per_epoch, head=head)
    if _computes_in_float16(getattr(model, "student", model)):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(reduction="mean_with_sample_weight"),
        weighted_metrics=_metrics(getattr(model, "student", model).output_shape[-1]),
        jit_compile="auto" if jit_compile else False,
    )


# What each switch of a run means, for its message (a str from a config, 'no', is truthy).
_SWITCHES = {
    "deterministic": "True (TensorFlow's deterministic ops) or False",
    "jit_compile": "True (XLA) or False",
    "cache": "True (the encoded images kept in memory after the first epoch) or False",
    "fit_batch_to_data": "True (a batch larger than the data lowered to it), False or None (True without a recipe)",
}


def checked_switches(**switches):
    """The run's True-or-False arguments in order, each checked as `errors.checked_bool` checks it
    (`fit_batch_to_data` may be None), as a `RunError` naming it before anything is read or written."""
    checked = []
    for name, value in switches.items():
        with about(name, value):
            checked.append(None if value is None and name == "fit_batch_to_data" else
                           checked_bool(name, value, _SWITCHES[name]))
    return checked
