"""A whole training run as one call: `train`, `finetune` and `evaluate`, resumable and recorded.

    from keras_cait.training import RECIPES, run

    result = run.finetune("XXS24", "flowers/", "runs/flowers", recipe=RECIPES["transfer"])
    result.model                      # the trained classifier, its class names attached
    result.summary["best"]            # {"monitor": "val_accuracy", "value": 0.93, "epoch": 7, ...}

What a run does beyond `model.fit`, the same from Python and from `keras-cait train | finetune |
evaluate` (which only parse their flags and call these functions):

- **Stages.** `finetune` trains a new head with the backbone frozen (`recipe.head_epochs` at
  `recipe.head_lr`), then the whole network, or LoRA updates of it (`lora_rank`).
- **Resume.** Every `backup_every` steps and at each epoch end the whole training state is
  backed up in `output_dir/backup/`; calling the same run again resumes at the very step, and
  gives the weights an uninterrupted run gives (`keras_cait.training.resume`).
- **The run record.** `run.json` (the settings and the finished stages) and `recipe.json` (every
  knob) are written when the first stage starts; a rerun with another setting or knob is
  refused, naming each, and a rerun of a finished run trains nothing.
- **Files.** `best.keras` (best epoch), `final.keras`, `ema.keras` (the moving average, with
  `recipe.model_ema`), `head.weights.h5` (after the head stage) and TensorBoard `logs/`.
- **Class names** of the data travel in every saved model (`model.class_names`).
- **The data checked.** Once listed, before a model is built or a file written, the images
  are checked (`image_checks.check_images`: every file's first and last bytes, a decode bounded in
  time) and every one that cannot be decoded is named; files of other formats in the class
  folders are said by name; a class of 1 image is refused where a validation fraction is held
  out. The image decoders' own lines (libjpeg's) are kept off standard error (`decoder_messages`).

A mistake in what a run is given raises `RunError` (a ValueError) naming the argument as
Python writes it (`data='photos': ...`); `keras_cait.training.resume.BackupError` when the
output folder holds a run it cannot continue.

This module holds the three runs; their pieces live beside it: `precision` (the dtype policy a
run trains in), `run_data` (the data a run reads, their checks, the validation split),
`run_plan` (what the recipe allows, the batches, the compile), `run_models` (the model, its
side, the teacher), `run_folder` (the folder, `run.json`, the stages' resumable fits and the
summary) and `run_errors` (`RunError`).
"""

import dataclasses
import functools
import inspect
import logging
import os
import warnings

import keras

from keras_cait.errors import Named, counted, quiet, report, say
from keras_cait.images.decoder_messages import decoder_messages_dropped
from keras_cait.images.evaluation_transform import check_crop_pct
from keras_cait.io.atomic import written_atomically
from keras_cait.models.architecture import with_class_names
from keras_cait.models.inputs import checked_image_size
from keras_cait.models.loader import is_keras_file
from keras_cait.models.variants import checked_weights, default_image_size
from keras_cait.training import (
    image_checks,
    lora,
    resume,
    run_data,
    run_folder,
    run_models,
    run_plan,
    run_state,
    stream,
    transfer,
)
from keras_cait.training.callbacks import save_model
from keras_cait.training.knobs import knobs
from keras_cait.training.precision import (
    PRECISIONS,
    check_precision,
    chosen_precision,
    default_precision,
    resolved_precision,  # noqa: F401  run.resolved_precision, as before
    say_chosen,
)
from keras_cait.training.recipe import RECIPES, RecipeName
from keras_cait.training.run_errors import RunError, about
from keras_cait.training.run_plan import compile_for

__all__ = ["PRECISIONS", "RunError", "RunResult", "compile_for", "default_image_size", "default_precision",
           "evaluate", "finetune", "train"]


@dataclasses.dataclass
class RunResult:
    """What a run returns: the model (class names attached) and its summary.

    Of `train` and `finetune`: the trained model; `summary` holds `output_dir`, `files` ({name:
    what it is} of the files in it), `best` (the best epoch's record, or None),
    `finished_earlier` (a rerun of a finished run: nothing was trained) and `resumed` (the stages
    that resumed from a backup, with their step). Of `evaluate`: the model evaluated (in the
    precision asked for); `summary` holds `top1`, `top5` (above 5 classes) and `images`.

    `result["top1"]`, the dict `evaluate` returned before, reads the summary, with a
    DeprecationWarning: give `result.summary["top1"]`.
    """

    model: keras.Model
    summary: dict

    def _as_dict(self):
        warnings.warn("A run's result is a RunResult, no longer a dict: read result.summary[...] (result[...], "
                      "keys(), items(), get() and `in` go there, for now).", DeprecationWarning, stacklevel=3)
        return self.summary

    def __getitem__(self, key):
        return self._as_dict()[key]

    def __contains__(self, key):
        return key in self._as_dict()

    def get(self, key, default=None):
        return self._as_dict().get(key, default)

    def keys(self):
        return self._as_dict().keys()

    def items(self):
        return self._as_dict().items()


# === The runs ===


def _decoder_messages_dropped(run_function):
    """`run_function` with the image decoders' own lines (libjpeg's "Corrupt JPEG data: ...") kept off
    standard error while it runs: a bad file is named in keras_cait's words (`keras_cait.decoder_messages`)."""

    @functools.wraps(run_function)
    def decoders_quiet(*args, **kwargs):
        with decoder_messages_dropped():
            return run_function(*args, **kwargs)

    return decoders_quiet


class _NoRetracingWarning(logging.Filter):
    """Drops TensorFlow's "5 out of the last 13 calls to <function ...> triggered tf.function
    retracing" warning: a run's stages, and a notebook's next run or evaluation, compile new models,
    as Keras' `fit` and `evaluate` of a new model do, and its advice (a tf.function made in a loop)
    is for code of one's own, not the run's."""

    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


def _retracing_warnings_dropped(run_function):
    """`run_function` with TensorFlow's retracing warning left out while it runs (`_NoRetracingWarning`)."""

    @functools.wraps(run_function)
    def without_retracing_warnings(*args, **kwargs):
        logger, dropped = logging.getLogger("tensorflow"), _NoRetracingWarning()
        logger.addFilter(dropped)
        try:
            return run_function(*args, **kwargs)
        finally:
            logger.removeFilter(dropped)

    return without_retracing_warnings


# The recipe a run takes when given none, by run: what a knob typed as an argument is the knob of.
DEFAULT_RECIPES = {"train": "deit", "finetune": "transfer"}


def _refuse_knobs_as_arguments(run_function, signature, kwargs):
    """A knob of the recipe typed as an argument of the run (`finetune(..., epochs=1)`, as the command
    line's --epochs) is Python's TypeError, saying where the knob goes."""
    default = DEFAULT_RECIPES.get(run_function.__name__)
    typed = [name for name in kwargs if name not in signature.parameters and name in knobs()]
    if default and typed:
        name = typed[0]
        raise TypeError(f"{run_function.__name__}() got an unexpected keyword argument {name!r}: {name} is a knob of "
                        f"the recipe; give recipe=RECIPES[{default!r}].replace({name}={kwargs[name]!r}), or another "
                        "recipe with it") from None


VERBOSE = (0, 1, 2, "auto")  # what Keras' fit and evaluate take: silent, a bar, a line per epoch, Keras' choice


def _said_at_verbose(run_function):
    """`run_function` with its `verbose` checked first, and at verbose=0 none of its lines said."""
    signature = inspect.signature(run_function)

    @functools.wraps(run_function)
    def said(*args, **kwargs):
        try:
            verbose = signature.bind(*args, **kwargs).arguments.get("verbose", signature.parameters["verbose"].default)
        except TypeError:  # arguments the function refuses itself, as Python does
            verbose = None
        if verbose is None:  # out of the except: Python's own TypeError alone, not chained to bind's
            _refuse_knobs_as_arguments(run_function, signature, kwargs)
            return run_function(*args, **kwargs)
        if isinstance(verbose, bool) or verbose not in VERBOSE:
            raise RunError("verbose", verbose, "must be 0 (silent), 1 (a progress bar), 2 (a line per epoch) or 'auto'",
                           ["e.g. ", Named("verbose", 2)], usage=True)
        with quiet(verbose == 0):
            return run_function(*args, **kwargs)

    return said


@_decoder_messages_dropped
@_retracing_warnings_dropped
@_said_at_verbose
@run_state.process_state_kept
def train(model, data, output_dir, *, recipe=None, val_data=None, class_names=None, tfds_dir=None,
          image_size=224, crop_pct=1.0, precision="auto", strategy="none", seed=0,
          deterministic=False, jit_compile=True, teacher=None, backup_every=1000, cache=False,
          shuffle_buffer=None, verbose=1, fit_batch_to_data=None):
    """Trains a CaiT from scratch with `recipe`, a `Recipe` or a name of `RECIPES` (default "deit",
    the paper's).

    Args:
        model: a variant name ("S24", "cait_s24_224") or a dict of `build_cait` arguments.
        data, val_data: "folder" of class subfolders, "tfrecord:PATTERN", "tfds:NAME:SPLIT", or a
            `sources.ImageSource`.
        output_dir: where the run's files go; the same call again resumes a killed run.
        recipe: a `Recipe`, or a name of `RECIPES`; every knob of the run (epochs, batch, rates,
            augmentation) is the recipe's.
        class_names: the names of the classes, in label order (TFRecords need them).
        tfds_dir: TensorFlow Datasets' data_dir, for "tfds:NAME:SPLIT" data.
        image_size: the side of the training images; crop_pct: the validation centre crop.
        precision: a Keras dtype policy: "float32", "mixed_float16" or "mixed_bfloat16"; "auto" (the
            default): `default_precision()`, the fast one where the run is (said as it starts).
        strategy: "none", "mirrored", "multiworker" or "dataparallel" (`training.distribute`).
        seed: of the initial weights, the data order and every augmentation draw;
            `deterministic=True` makes TensorFlow's ops deterministic too, for the run only.
        jit_compile: XLA for the training step (Keras' `jit_compile`).
        teacher: with a distilling recipe, a .keras path, a keras.applications name or a model.
        backup_every: steps between backups of the whole training state.
        cache: keep the encoded training images in memory after the first epoch.
        shuffle_buffer: examples shuffled together; None: the whole epoch of a folder, blocks of
            10,000 records of TFRecords and TFDS (`stream.training_stream`).
        verbose: Keras' (0: silent, 1: a progress bar, 2: a line per epoch, "auto"); at 0 the run
            says none of its own lines either (its plan, stages, precision), only the notices of
            what it does otherwise than asked (a batch lowered, files it does not read, a run
            resumed from its backup, interrupted, or finished earlier).
        fit_batch_to_data: lower a recipe's batch larger than the training images to what they
            fill (said), rather than raise `RunError`. None (the default): when `recipe` is not
            given, as the command line does when --batch-size is not typed; a recipe given keeps
            its batch.

    Returns:
        a `RunResult`: the model (final weights, class names attached) and the summary.
    """
    if isinstance(model, dict):  # build_cait's arguments, or a variant name (or a model), checked first
        run_models.check_architecture(model)
    elif isinstance(model, keras.Model) or is_keras_file(model):  # else "weights=None: applies to a name"
        raise RunError("model", model if is_keras_file(model) else None, "train builds a CaiT from random weights: "
                       "give a variant name or a dict of build_cait arguments",
                       "to train a saved model further, finetune it: run.finetune(model, data, output_dir)",
                       usage=True, shown=None if is_keras_file(model) else f"<{type(model).__name__}>")
    else:
        run_models.check_model(model)
    run_data.check_data("data", data)
    if val_data is not None:
        run_data.check_data("val_data", val_data)
    run_data.check_tfds_dir(tfds_dir, data, val_data)
    run_folder.check_output_dir(output_dir)
    deterministic, jit_compile, cache, fit_batch_to_data = run_plan.checked_switches(
        deterministic=deterministic, jit_compile=jit_compile, cache=cache, fit_batch_to_data=fit_batch_to_data)
    fit_batch_to_data = recipe is None if fit_batch_to_data is None else fit_batch_to_data
    recipe = run_plan.checked_recipe(recipe, RECIPES["deit"])
    with about("crop_pct", crop_pct):
        check_crop_pct(crop_pct)
    with about("image_size", image_size):
        image_size = checked_image_size(image_size, model.get("patch_size", 16) if isinstance(model, dict) else 16)
    run_plan.check_counts(seed=seed, backup_every=backup_every, shuffle_buffer=shuffle_buffer)
    run_plan.check_recipe(recipe, teacher, "train")
    run_models.check_teacher(teacher, recipe)
    precision, chosen = chosen_precision(check_precision(precision, auto=True))  # said once nothing refuses the run
    given = run_data.given
    settings = run_folder.settings(model=model, data=given(data), val_data=given(val_data), class_names=class_names,
                                   tfds_dir=tfds_dir, image_size=image_size, crop_pct=crop_pct, precision=precision,
                                   seed=seed, teacher=given(teacher), shuffle_buffer=shuffle_buffer)
    distribution = run_plan.distribution(strategy)  # first: Keras' JAX process group reseeds Python's generator
    run_state.seed(seed, deterministic)
    data = run_data.open_data(data, val_data, 0, class_names, tfds_dir, seed)
    run = run_folder.Run("train", settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data)
    say_chosen(precision, chosen)
    final = os.path.join(run.output_dir, "final.keras")
    if run.record.finished("train"):
        return RunResult(*run.finished_earlier(final))
    with distribution.scope():
        classifier = with_class_names(
            run_models.new_model(model, recipe, image_size, data.train.num_classes, precision), data.train.class_names)
        teacher = run_models.teacher_model(teacher, recipe, data, precision)
        fitted = run_models.fitted(classifier, recipe, teacher)
    run.compile(fitted, jit_compile=jit_compile)
    train_images = data.train
    report(f"Training {classifier.name} ({classifier.count_params() / 1e6:.1f}M parameters) from random weights at "
           f"{image_size}x{image_size} on {counted(train_images.num_examples, 'image')} of "
           f"{counted(train_images.num_classes, 'class', 'classes')}, {counted(recipe.epochs, 'epoch')}.")
    run.announce()
    run.fit(fitted, "train", recipe.epochs, seed, image_size, run.validation(image_size, crop_pct),
            backup_every, shuffle_buffer, cache)
    save_model(classifier, final)
    run.record.finish("train")
    return RunResult(classifier, run.summary())


def say_scratch_chosen():
    """Says that `finetune` from random weights, given no recipe, trains with the scratch recipe."""
    say(Named("weights", None), ": random weights, so the run trains with ", Named("recipe", RecipeName("scratch")),
        ", the recipe that learns from them on a small folder (", Named("recipe", RecipeName("transfer")),
        " fine-tunes pretrained ones; give ", Named("recipe"), " to choose another).")


@_decoder_messages_dropped
@_retracing_warnings_dropped
@_said_at_verbose
@run_state.process_state_kept
def finetune(model, data, output_dir, *, recipe=None, weights="imagenet", val_data=None, val_fraction=None,
             class_names=None, tfds_dir=None, image_size=None, crop_pct=1.0, precision="auto",
             strategy="none", seed=0, deterministic=False, jit_compile=True, lora_rank=0, teacher=None,
             backup_every=200, cache=False, shuffle_buffer=None, verbose=1, fit_batch_to_data=None):
    """Fine-tunes a CaiT on new classes with `recipe`, a `Recipe` or a name of `RECIPES` (default
    "transfer"; with `weights=None`, random weights, "scratch", which says so): a new head alone
    for `recipe.head_epochs`, the backbone frozen, then the whole network (or, with `lora_rank`,
    rank-R LoRA updates of the attention projections and the head) for `recipe.epochs`, at any
    `image_size` (the position embedding is resized).

    Args:
        model: a variant name ("XXS24", "cait_xxs24_384") with `weights` ("imagenet", None or a
            file), the path of a .keras model, or a Keras model (a CaiT), which the run trains as
            a copy: yours stays as it is, and the run record knows it by its weights.
        data, val_data: as in `train`; without `val_data`, `val_fraction` of `data` is held out
            (default 0.1; 0: no validation), about that part of each class and never a class's
            last image, so each class needs 2 images or more; with `val_data`, `val_fraction`
            must not be given.
        image_size: default: the .keras model's own side, or the side of the checkpoint the name loads.
        The other arguments are `train`'s.

    Returns:
        a `RunResult`: the model (final weights, class names attached) and the summary.
    """
    run_models.check_model(model)  # first, as the arguments come, and before anything is read
    run_data.check_data("data", data)
    if val_data is not None:
        run_data.check_data("val_data", val_data)
    run_data.check_tfds_dir(tfds_dir, data, val_data)
    run_folder.check_output_dir(output_dir)
    deterministic, jit_compile, cache, fit_batch_to_data = run_plan.checked_switches(
        deterministic=deterministic, jit_compile=jit_compile, cache=cache, fit_batch_to_data=fit_batch_to_data)
    fit_batch_to_data = recipe is None if fit_batch_to_data is None else fit_batch_to_data
    with about("weights", weights):
        random_weights = not isinstance(model, keras.Model) and not is_keras_file(model) and (
            checked_weights(weights) is None)
    scratch_chosen = recipe is None and random_weights
    recipe = run_plan.checked_recipe(RECIPES["scratch"] if scratch_chosen else recipe, RECIPES["transfer"])
    with about("crop_pct", crop_pct):
        check_crop_pct(crop_pct)
    with about("image_size", image_size):
        image_size = None if image_size is None else checked_image_size(image_size)
    run_plan.check_counts(seed=seed, backup_every=backup_every, shuffle_buffer=shuffle_buffer, lora_rank=lora_rank)
    run_plan.check_recipe(recipe, teacher, "finetune")
    run_models.check_teacher(teacher, recipe)
    val_fraction = run_data.validation_fraction(val_data, val_fraction)
    precision, chosen = chosen_precision(check_precision(precision, auto=True))  # said once nothing refuses the run
    given = run_data.given
    settings = run_folder.settings(model=given(model), weights=given(weights), data=given(data),
                                   val_data=given(val_data), val_fraction=val_fraction, class_names=class_names,
                                   tfds_dir=tfds_dir, image_size=image_size, crop_pct=crop_pct, precision=precision,
                                   seed=seed, lora_rank=lora_rank, teacher=given(teacher),
                                   shuffle_buffer=shuffle_buffer)
    distribution = run_plan.distribution(strategy)  # first: Keras' JAX process group reseeds Python's generator
    run_state.seed(seed, deterministic)
    data = run_data.open_data(data, val_data, val_fraction, class_names, tfds_dir, seed)
    run = run_folder.Run("finetune", settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data)
    if scratch_chosen:  # nothing can refuse the run now: what it chose is said
        say_scratch_chosen()
    say_chosen(precision, chosen)
    head_weights = os.path.join(run.output_dir, "head.weights.h5")
    last_stage = ("lora" if lora_rank else "full") if recipe.epochs else "head"
    if run.record.finished(last_stage):
        return RunResult(*run.finished_earlier(os.path.join(run.output_dir, "final.keras")))

    with distribution.scope():
        classifier = run_models.classifier(model, weights, recipe, image_size, precision, data.train.class_names)
        teacher = run_models.teacher_model(teacher, recipe, data, precision)
    image_size = classifier.input_shape[1]
    validation = run.validation(image_size, crop_pct)
    run.announce()
    stages = bool(recipe.head_epochs) + bool(recipe.epochs)
    if recipe.head_epochs:
        report(f"Stage 1 of {stages}: the new head alone, backbone frozen, {counted(recipe.head_epochs, 'epoch')}")
        if run.record.finished("head") and os.path.exists(head_weights):
            print(f"Stage 1 done in an earlier run: the head is loaded from {head_weights}, not trained again.",
                  flush=True)  # a notice of the resumed run, said at verbose=0 too
            classifier.load_weights(head_weights)
        else:
            transfer.set_backbone_trainable(classifier, False)
            run.compile(classifier, head=True, jit_compile=jit_compile)
            run.fit(classifier, "head", recipe.head_epochs, seed, image_size, validation, backup_every,
                    shuffle_buffer, cache)
            classifier.optimizer = None
            with written_atomically(head_weights) as partial:
                classifier.save_weights(partial)
        run.record.finish("head")
    if recipe.epochs:
        stage = (f"LoRA of rank {lora_rank} on the attention projections, and the head" if lora_rank
                 else "the whole network")
        report(f"Stage {stages} of {stages}: {stage}, {counted(recipe.epochs, 'epoch')}")
        with distribution.scope():
            if lora_rank:
                run_folder.check_lora_can_start(run.output_dir)
                lora.enable_lora(classifier, lora_rank)
            else:
                transfer.set_backbone_trainable(classifier, True)
            fitted = run_models.fitted(classifier, recipe, teacher)
        run.compile(fitted, jit_compile=jit_compile)
        run.fit(fitted, last_stage, recipe.epochs, seed + 1, image_size, validation, backup_every,
                shuffle_buffer, cache)
    if lora_rank:
        classifier = lora.merge_lora(classifier)
    if not recipe.epochs:  # a head-only run: the model returned, as its file, is frozen no more
        transfer.set_backbone_trainable(classifier, True)
    save_model(classifier, os.path.join(run.output_dir, "final.keras"))
    run.record.finish(last_stage)
    return RunResult(classifier, run.summary())


@_decoder_messages_dropped
@_retracing_warnings_dropped
@_said_at_verbose
@run_state.process_state_kept
def evaluate(model, data, *, weights="imagenet", class_names=None, tfds_dir=None, image_size=None,
             crop_pct=1.0, batch_size=64, precision="float32", verbose=1):
    """Top-1 (and, above 5 classes, top-5) accuracy of a CaiT on `data`, as CaiT is evaluated
    (resize to `image_size / crop_pct`, centre crop `image_size`).

    Args:
        model: a variant name with `weights`, the path of a .keras model, or a Keras model; a
            .keras file or a model built under another policy is rebuilt to compute in `precision`.
        data: as in `train`; its classes must be the model's, in the model's order.
        weights: for a variant name, as `finetune`'s ("imagenet", None or a file).
        class_names, tfds_dir: as in `train`.
        image_size: default: the model's own side, or the side of the checkpoint the name loads.
        crop_pct: the centre crop (resize to `image_size / crop_pct`, crop `image_size`).
        batch_size: images per batch.
        precision: the dtype policy it computes in: "float32" (the default), "mixed_float16" or
            "mixed_bfloat16".
        verbose: Keras' (0: silent, 1: a progress bar, 2: one line, "auto").

    Returns:
        a `RunResult`: the model evaluated (under `precision`) and the summary `{"top1": ...,
        "top5": ... (above 5 classes), "images": N}`.
    """
    run_models.check_model(model)
    run_data.check_data("data", data)
    run_data.check_tfds_dir(tfds_dir, data)
    check_precision(precision)
    with about("crop_pct", crop_pct):
        check_crop_pct(crop_pct)
    run_plan.check_counts(batch_size=batch_size)
    with about("image_size", image_size):
        image_size = None if image_size is None else checked_image_size(image_size)
    source = run_data.open_source("data", data, class_names, tfds_dir)
    run_data.check_images({"data": (data, source)})
    own_size = isinstance(model, keras.Model) or is_keras_file(model)  # a CaiT's accuracy at its own size
    classifier = run_models.load(model, weights=weights, image_size=None if own_size else image_size, dtype=precision)
    side = classifier.input_shape[1]
    if image_size is not None and image_size != side:
        raise RunError("image_size", image_size, f"the model takes {side}x{side} images",
                       ["leave ", Named("image_size"), " out to use the model's size"], usage=True)
    image_size = side
    named = model if isinstance(model, (str, os.PathLike)) else classifier.name
    run_models.check_classes(classifier, "model", named, run_data.given(data), source, blamed="data",
                             advice="evaluate on data of the model's classes, in the model's order (folder "
                                    "names are classes, in sorted order)")
    metrics = [keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1")]
    if run_plan.reports_top5(source.num_classes):
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"))
    # Compiled is a model over the same layers, not the caller's (whose optimizer, loss and metrics
    # stay theirs); Keras evaluates a loss in any case, only the accuracies are reported.
    evaluated = keras.Model(classifier.inputs, classifier.outputs, name=classifier.name)
    evaluated.compile(loss="sparse_categorical_crossentropy", metrics=metrics, jit_compile=False)
    dataset = stream.evaluation_dataset(source, image_size, batch_size, crop_pct)
    with image_checks.undecodable_named([("data", data, source)], RunError):  # a bad image the check did not reach
        results = evaluated.evaluate(dataset, return_dict=True, verbose=verbose)
    report = {name: float(value) for name, value in results.items() if name != "loss"}
    report["images"] = source.num_examples
    return RunResult(classifier, report)

