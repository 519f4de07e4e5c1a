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
  are checked (`sources.check_images`: every file's first and last bytes, a decode bounded in
  time) and every one that cannot be decoded is named; files of other formats in the class
  folders are said by name; a class of 1 image is refused where a validation fraction is held
  out. The image decoders' own lines (libjpeg's) are kept off standard error (`decoder_messages`).

A mistake in what a run is given raises `RunError` (a ValueError) naming the argument as
Python writes it (`data='photos': ...`); `keras_cait.training.resume.BackupError` when the
output folder holds a run it cannot continue.
"""

import contextlib
import dataclasses
import functools
import json
import os
import shlex

import keras

from keras_cait import variants
from keras_cait.atomic import written_atomically
from keras_cait.layers import PatchEmbedding
from keras_cait.decoder_messages import decoder_messages_dropped
from keras_cait.model import build_cait, class_count, with_class_names
from keras_cait.training import distribute, lora, resume, sources, stream, transfer
from keras_cait.training.callbacks import best_record_path, run_callbacks, save_model, tensorboard_installed
from keras_cait.training.distillation import Distiller
from keras_cait.training.recipe import RECIPES
from keras_cait.variants import cait

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


class RunError(ValueError):
    """What a run is given cannot work (bad data, a batch larger than the data, a missing extra).

    `argument` names the run's argument at fault (e.g. "data", "weights"), or is None; the
    message names it as Python writes it (`data='photos': no such folder ...`).
    """

    def __init__(self, message, argument=None, usage=False, value=None):
        super().__init__(message)
        self.argument, self.value = argument, value
        self.usage = usage  # the arguments cannot work together or alone, whatever the files hold


@dataclasses.dataclass
class RunResult:
    """What a run returns: the trained model (class names attached) and its summary.

    `summary` holds `output_dir`, `files` ({name: what it is} of the files in it), `best` (the
    best epoch's record, or None), `finished_earlier` (a rerun of a finished run: nothing was
    trained) and `resumed` (the stages that resumed from a backup, with their step).
    """

    model: keras.Model
    summary: dict


@contextlib.contextmanager
def _about(argument, value, *types):
    """The library's errors of type `types` while reading `argument` as a `RunError` naming it."""
    try:
        yield
    except RunError:
        raise
    except types as error:
        text = str(error).strip() or type(error).__name__
        raise RunError(f"{argument}={value!r}: {text}" if argument else text, argument, value=value) from error


def _configure(precision, seed, deterministic=False):
    keras.utils.set_random_seed(seed)
    if deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(precision)


def _check_precision(precision, auto=False):
    """`precision`, with "auto" (where allowed) resolved by `default_precision` and said."""
    allowed = ("auto", *PRECISIONS) if auto else PRECISIONS
    if precision not in allowed:
        raise RunError(f"precision={precision!r}: must be one of {', '.join(allowed)}.", "precision", usage=True)
    if precision != "auto":
        return precision
    precision, why = default_precision()
    print(f"Precision {precision} ({why}; --precision or precision= chooses another).", flush=True)
    return precision


def default_precision(gpus=None, cpu_flags=None):
    """(policy, why): the dtype policy a run trains in unless told: "mixed_float16" where Keras'
    backend sees a GPU, "mixed_bfloat16" on a CPU with bfloat16 units (AVX512_BF16 or AMX), else
    "float32" (a CPU without them emulates half precision, slower than float32)."""
    gpus = _gpus() if gpus is None else gpus
    if gpus:
        return "mixed_float16", f"{gpus} GPU(s)"
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    units = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if units:
        return "mixed_bfloat16", f"a CPU with bfloat16 units: {', '.join(unit.upper() for unit in units)}"
    return "float32", "a CPU without bfloat16 units and no GPU"


def _gpus():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return sum(device.platform == "gpu" for device in jax.devices())
    if backend == "torch":
        import torch

        return torch.cuda.device_count()
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _cpu_flags():
    """The CPU's feature flags (Linux's /proc/cpuinfo); none where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as file:
            return {flag for line in file if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    except OSError:
        return set()


# === The data ===


@dataclasses.dataclass
class _Data:
    """The sources of a run, and its training data as the run record keeps them (`spec`)."""

    train: sources.ImageSource
    validation: sources.ImageSource | None
    spec: str


def _spec(data):
    """`data` as the run record keeps it: a folder's absolute path, tfrecord:/tfds: as given."""
    data = os.fspath(data)
    return data if ":" in data or not os.path.exists(data) else os.path.abspath(data)


def _open(argument, data, class_names, tfds_dir):
    """The source of `data`; the files of its class folders that are not read, said."""
    if isinstance(data, sources.ImageSource):
        return data
    with _about(argument, os.fspath(data), ValueError, ImportError, FileNotFoundError):
        source = sources.source(data, class_names, tfds_dir)
    skipped = sources.skipped_files(f"{argument}={_shown(data)!r}", source)
    if skipped:
        print(skipped, flush=True)
    return source


def _shown(data):
    """`data` as a message names it: the path or spec as given."""
    return "<ImageSource>" if isinstance(data, sources.ImageSource) else os.fspath(data)


def _open_data(data, val_data, val_fraction, class_names, tfds_dir, seed):
    """The sources of a run, their images checked (`_check_images`), and `val_fraction` of `data`
    held out where `val_data` is not given."""
    train = _open("data", data, class_names, tfds_dir)
    validation = None if val_data is None else _open("val_data", val_data, class_names, tfds_dir)
    _check_images({"data": (data, train), "val_data": (val_data, validation)})
    if validation is not None:
        return _Data(train, validation, _given(data))
    if val_fraction:
        _check_classes_can_be_split(data, train, val_fraction)
        with _about("val_fraction", val_fraction, ValueError):
            train, validation = sources.split(train, val_fraction, seed=seed)
        return _Data(train, validation, _given(data))
    return _Data(train, None, _given(data))


def _check_images(named):
    """Refuses the data whose images cannot be decoded (`sources.check_images`), naming every one
    found in one `RunError`, before any model is built or file written; `named`: {argument:
    (value, source or None)}. Says so where a large folder was decoded only in part."""
    found, complete = {}, True
    for argument, (value, source) in named.items():
        if source is None:
            continue
        what = f"{argument}={_shown(value)!r}"
        check = sources.check_images(source)
        if not check.complete:
            print(f"{what}: {check.said()}", flush=True)
        complete = complete and check.complete
        if check.undecodable:
            found[what] = (argument, value, check.undecodable)
    if not found:
        return
    for what, (_, _, bad) in found.items():
        if len(bad) > sources.BAD_IMAGES_SHOWN:  # the message names the first; here are all
            print(f"{what}: the {len(bad)} files that cannot be decoded:", flush=True)
            for undecodable in bad:
                print(f"  {undecodable.name} ({undecodable.reason})", flush=True)
    argument, value, _ = next(iter(found.values()))
    message = sources.undecodable_message({what: bad for what, (_, _, bad) in found.items()}, complete)
    raise RunError(message, argument, value=value)


def _check_classes_can_be_split(data, source, val_fraction):
    """A class of 1 image cannot give an image to validation and keep one to train on: refused by name."""
    counts = sources.class_counts(source)
    if counts is None or source.folder is None:
        return
    alone = [os.path.join(source.folder, str(name)) for name, count in zip(source.class_names, counts)
             if count < 2]
    if not alone:
        return
    folders = ", ".join(repr(folder) for folder in alone[:5]) + (f" and {len(alone) - 5} more"
                                                                 if len(alone) > 5 else "")
    which = f"the class folder {folders} holds" if len(alone) == 1 else f"the class folders {folders} hold"
    raise RunError(
        f"data={_shown(data)!r}: {which} 1 image, but val_fraction={val_fraction:g} holds a part of each "
        "class out for validation, and 1 image cannot be both trained on and validated: each class needs at "
        "least 2 images; add images, or give val_fraction=0 (no validation) or val_data=FOLDER (validation "
        "images of their own).", "data", value=data)


def _validation_fraction(val_data, val_fraction):
    """`val_fraction` as the run holds it out: 0.1 when neither is given, none with `val_data`."""
    if val_data is None:
        return 0.1 if val_fraction is None else val_fraction
    if val_fraction is not None:
        raise RunError(
            f"val_data={_shown(val_data)!r} and val_fraction={val_fraction:g} are both given: with val_data, "
            "its images validate and no part of data is held out; give one of them.", "val_fraction", usage=True)
    return None


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The batches of a run: decided once, from the recipe, the replicas and the data."""

    global_batch: int
    steps: int

    @classmethod
    def of(cls, recipe, distribution, data):
        global_batch = distribution.global_batch_size(recipe.batch_size)
        if global_batch > data.train.num_examples:
            fits = _batch_that_fits(distribution, data)
            raise RunError(
                f"batch_size={recipe.batch_size} (global batch {global_batch}) is larger than the "
                f"{data.train.num_examples} training images of data={data.spec!r}; give batch_size={fits} "
                "or less, or more images.", "batch_size", usage=True)
        return cls(global_batch, stream.steps_per_epoch(data.train, global_batch))


def _batch_that_fits(distribution, data):
    return max(1, data.train.num_examples // distribution.replicas)


def _fit_batch(recipe, distribution, data):
    """The recipe with its batch lowered to what the training images fill, said; unchanged if they do."""
    if distribution.global_batch_size(recipe.batch_size) <= data.train.num_examples:
        return recipe
    fits = _batch_that_fits(distribution, data)
    print(f"Batch {recipe.batch_size} per replica is more than the {data.train.num_examples} training images "
          f"fill: batch {fits} instead (the learning rate scales with it).", flush=True)
    return recipe.replace(batch_size=fits)


def _metrics(num_classes):
    metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
    if num_classes > 5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(5, name="top5"))
    return metrics


def compile_for(model, recipe, global_batch, steps_per_epoch, head=False, jit_compile=True):
    """`model` compiled as a run compiles it: the recipe's AdamW and schedule (the head stage's
    with `head`), categorical cross-entropy weighted by sample (rows of weight 0 fill a last,
    partial batch across hosts) and accuracy (top-5 too above 5 classes)."""
    model.compile(
        optimizer=recipe.optimizer(model, global_batch, steps_per_epoch, head=head),
        loss=keras.losses.CategoricalCrossentropy(reduction="mean_with_sample_weight"),
        weighted_metrics=_metrics(getattr(model, "student", model).output_shape[-1]),
        jit_compile="auto" if jit_compile else False,
    )


# === Teacher, models ===


def _check_recipe(recipe, teacher, command):
    """What the recipe and the run's arguments cannot do together, refused before any data are read."""
    if command == "finetune" and recipe.epochs == 0 and recipe.head_epochs == 0:
        raise RunError("epochs=0 and head_epochs=0: nothing to train; give epochs or head_epochs of at "
                       "least 1.", "epochs", usage=True)
    if command == "train" and recipe.epochs == 0:
        raise RunError("epochs=0: nothing to train; give epochs=1 or more.", "epochs", usage=True)
    if recipe.epochs and not 0 <= recipe.warmup_epochs < recipe.epochs:
        raise RunError(f"warmup_epochs={recipe.warmup_epochs:g} with epochs={recipe.epochs}: the warmup must be "
                       f"shorter than the run; give epochs={int(recipe.warmup_epochs) + 1} or more, or "
                       f"warmup_epochs={max(0, recipe.epochs - 1)} or less.", "warmup_epochs", usage=True)
    if recipe.distillation_type == "none" and teacher is not None:
        raise RunError(f"teacher={_given(teacher)} is given but distillation_type='none'; give "
                       "distillation_type='hard' (the paper's) or 'soft'.", "teacher", usage=True)
    if recipe.distillation_type != "none" and teacher is None:
        raise RunError(f"distillation_type={recipe.distillation_type!r} needs a teacher: teacher=PATH.keras or "
                       "a keras.applications name, e.g. teacher=RegNetY160.", "teacher", usage=True)
    if _is_file(teacher) and not os.path.isfile(teacher):
        raise RunError(f"teacher={os.fspath(teacher)}: no such file; give a .keras model or a keras.applications "
                       "name, e.g. RegNetY160.", "teacher")
    if isinstance(teacher, str) and not _is_file(teacher) and not hasattr(keras.applications, teacher):
        raise RunError(f"teacher={teacher}: neither a .keras file nor a keras.applications model; e.g. "
                       "teacher=RegNetY160 or teacher=teacher.keras.", "teacher", usage=True)


def _teacher(teacher, recipe, num_classes):
    """The frozen teacher of a distilling recipe, or None."""
    if recipe.distillation_type == "none":
        return None
    if isinstance(teacher, keras.Model):
        model = teacher
    elif str(teacher).endswith(".keras"):
        model = _load_keras("teacher", teacher)
    else:
        model = getattr(keras.applications, teacher)(weights="imagenet")
    if model.output_shape[-1] != num_classes:
        raise RunError(f"teacher={teacher!r} predicts {model.output_shape[-1]} classes but the data has "
                       f"{num_classes}; give a teacher trained on the same classes.", "teacher")
    return model


def _fitted(model, recipe, teacher):
    """What `fit` trains: the model, or a `Distiller` of it from the teacher."""
    if teacher is None:
        return model
    # A softmax head gives probabilities; anything else is taken as logits.
    softmax = getattr(teacher.layers[-1], "activation", None) is keras.activations.softmax
    return Distiller(model, teacher, recipe.distillation_type, recipe.distillation_alpha,
                     recipe.distillation_tau, teacher_from_logits=not softmax)


def _load_keras(argument, path):
    import zipfile

    import keras_cait  # noqa: F401  registers CaiT's layers with Keras

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RunError(f"{argument}={path!r}: no such file (a .keras model or a CaiT variant).", argument)
    if not zipfile.is_zipfile(path):
        raise RunError(f"{argument}={path!r} is not a .keras model (a .keras file is a zip archive); give a "
                       "model saved with model.save('name.keras'), or a CaiT variant.", argument)
    try:
        return keras.models.load_model(path)
    except (OSError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunError(f"{argument}={path!r} is not a readable .keras model: {first}", argument) from error


def _is_file(model):
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".keras")


def default_image_size(model):
    """The input side a run uses for `model` when `image_size` is not given: a .keras model's
    own, else the side of the checkpoint the model name loads."""
    if isinstance(model, keras.Model):
        return _square_side(model)
    return variants.default_image_size(model)


def _square_side(model, given=None):
    """The side of the square images `model` takes; `given`: the model argument it came from (a path)."""
    if not isinstance(model.input_shape, tuple) or len(model.input_shape) != 4:
        named = f"model={os.fspath(given)!r}" if isinstance(given, (str, os.PathLike)) else f"model {model.name!r}"
        raise RunError(f"{named} takes inputs of shape {model.input_shape}, not images (batch, height, width, 3); "
                       "give an image classifier: a CaiT saved as .keras, or a CaiT variant.", "model")
    height, width = model.input_shape[1:3]
    if height != width:
        raise RunError(f"model takes {height}x{width} images; give image_size for a square size to run "
                       "it at.", "image_size", usage=True)
    return height


def _weights(weights):
    return None if weights is None or str(weights).lower() == "none" else weights


def _variant(model, weights, **options):
    with _about("weights", weights, ConnectionError, OSError, ValueError, ImportError):
        return cait(model, weights=_weights(weights), **options)


def _new_model(model, recipe, image_size, classes):
    shape = dict(input_shape=(image_size, image_size, 3), classes=classes, drop_path_rate=recipe.drop_path)
    if isinstance(model, dict):
        with _about("model", model, ValueError, TypeError):
            return build_cait(**model, **shape)
    with _about("model", model, ValueError):
        return cait(model, weights=None, **shape)


def _backbone(model, weights, recipe, image_size, precision, keep_head):
    """A CaiT at `image_size`: a variant with its weights, or a .keras model (rebuilt under
    `precision`); without its head unless `keep_head`."""
    if _is_file(model):
        # The file keeps the dtype policy it was saved with; the run's precision decides.
        loaded = transfer.with_dtype_policy(_load_keras("model", model), precision)
        image_size = image_size or _square_side(loaded, model)
        if loaded.input_shape[1:3] != (image_size, image_size):
            if not any(isinstance(layer, PatchEmbedding) for layer in loaded.layers):
                raise RunError(f"image_size={image_size}: model={os.fspath(model)!r} takes {_square_side(loaded)}-pixel "
                               "images and is not a CaiT, whose position embedding could be resized; leave out "
                               f"image_size={image_size}.", "image_size", usage=True)
            loaded = transfer.at_resolution(loaded, image_size)
        return loaded
    head = dict(include_top=True) if keep_head else dict(include_top=False, pooling="token")
    return _variant(model, weights, **head, input_shape=(image_size, image_size, 3),
                    drop_path_rate=recipe.drop_path)


def _classifier(model, weights, recipe, image_size, precision, class_names):
    """The model to fine-tune, named `class_names`: the loaded one with its own head when it
    predicts that many classes and the recipe keeps heads (deit-highres, as DeiT's --finetune),
    else a new head."""
    backbone = _backbone(model, weights, recipe, image_size, precision, recipe.keep_head)
    if recipe.keep_head and backbone.output_shape[-1] == len(class_names) and transfer.HEAD_NAME in [
        layer.name for layer in backbone.layers
    ]:
        return with_class_names(backbone, class_names)  # a .keras file may hold a plain keras.Model
    try:
        return transfer.with_new_head(backbone, len(class_names), name="cait_finetuned", class_names=class_names)
    except ValueError as error:  # no pooled features to put the head on: a .keras file of another model
        raise RunError(f"model={os.fspath(model)!r} holds {backbone.name!r}, not a CaiT, and has no pooled features (a "
                       "'token_pool' or 'avg_pool' layer) to put a new head on; give a CaiT saved as .keras (e.g. "
                       "best.keras of a finetune run) or a CaiT variant, e.g. model='XXS24'.", "model") from error


# === The run's folder ===


class _Run:
    """One run's folder, record, plan and stages: what train and finetune share."""

    def __init__(self, command, settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data):
        if fit_batch_to_data:
            recipe = _fit_batch(recipe, distribution, data)
        self.recipe, self.data, self.distribution, self.verbose = recipe, data, distribution, verbose
        self.plan = _Plan.of(recipe, distribution, data)
        # Every worker saves (Keras' multi-worker rule); only the chief's files are the run's.
        self.output_dir = os.fspath(output_dir) if distribution.is_chief else os.path.join(
            output_dir, "workers", str(distribution.worker_index))
        settings = {**settings, "classes": list(self.data.train.class_names),
                    "global batch size": self.plan.global_batch}
        self.record = resume.RunRecord.open(self.output_dir, command, settings, recipe=recipe,
                                            recipe_name=_recipe_name(recipe))
        self.resumed = {}

    def announce(self):
        if not tensorboard_installed():
            print('No TensorBoard logs: the tensorboard package is not installed (pip install '
                  '"keras-cait[train]" to have them in logs/).', flush=True)
        print(f"{self.distribution.name}: {self.distribution.replicas} replica(s), global batch "
              f"{self.plan.global_batch} ({self.recipe.batch_size} per replica), {self.plan.steps} steps per "
              f"epoch, peak learning rate {self.recipe.peak_lr(self.plan.global_batch):.3g}", flush=True)

    def compile(self, model, head=False, jit_compile=True):
        with self.distribution.scope():
            compile_for(model, self.recipe, self.plan.global_batch, self.plan.steps, head=head,
                        jit_compile=jit_compile)

    def validation(self, image_size, crop_pct):
        if self.data.validation is None:
            return None
        return stream.evaluation_dataset(self.data.validation, image_size, self.plan.global_batch, crop_pct,
                                         one_hot=True, cache=True)

    def fit(self, model, stage, epochs, seed, image_size, validation, backup_every, shuffle_buffer, cache):
        """One resumable `fit` of `epochs` epochs, backed up as `stage`."""
        self.record.begin()
        callbacks, backup = run_callbacks(
            self.output_dir, os.path.join(self.output_dir, "backup", stage), backup_every,
            monitor="val_accuracy" if validation is not None else "loss", stage=stage)
        augmentation = self.recipe.augmentation(image_size, self.data.train.num_classes)

        def stream_from(step):
            if step and stage not in self.resumed:  # the first stream of the fit: where it resumes
                self.resumed[stage] = step
                print(f"Resuming {stage} from the backup at step {step} of "
                      f"{epochs * self.plan.steps} in {backup.backup_dir}", flush=True)
            return stream.training_stream(
                self.data.train, augmentation, self.plan.global_batch, epochs, seed=seed, start_step=step,
                shuffle_buffer=shuffle_buffer, cache=cache)

        history = resume.fit(
            model, stream_from, epochs, self.plan.steps, backup=backup, callbacks=callbacks,
            validation_data=validation, verbose=self.verbose,
            plan={"data": self.data.spec, "classes": self.data.train.num_classes, "image size": image_size,
                  "global batch size": self.plan.global_batch},
        )
        with contextlib.suppress(OSError):  # the backups' folder, once no run needs it
            os.rmdir(os.path.dirname(backup.backup_dir))
        return history

    def result(self, model, finished_earlier=False):
        summary = _summary(self.output_dir, finished_earlier, self.resumed)
        if self.distribution.is_chief:
            _print_summary(summary)
        return RunResult(model, summary)


def _recipe_name(recipe):
    return next((name for name, named in RECIPES.items() if named == recipe), None)


def _settings(**values):
    """What a rerun in the same output folder must give again (by its command-line flag, as
    run.json and the refusal of a rerun name them)."""
    return {"--" + name.replace("_", "-"): value for name, value in sorted(values.items())}


def _finished_earlier(run, model_path):
    print(f"{run.output_dir} holds this run, finished earlier with the same settings: nothing to train. "
          "Give another output folder (or delete this one) to train again.", flush=True)
    import keras_cait  # noqa: F401  registers CaiT's layers with Keras

    return run.result(keras.models.load_model(model_path), finished_earlier=True)


_FILES = {
    "best.keras": "the model of the best epoch",
    "final.keras": "the model at the end",
    "ema.keras": "the moving average of the weights",
    "head.weights.h5": "the model after its head-only stage",
    "recipe.json": "the training recipe of the run, every knob (Recipe.load reads it)",
    "run.json": "the other settings of the run and the stages it finished",
    "logs": "TensorBoard logs",
}


def _summary(output_dir, finished_earlier=False, resumed=None):
    best = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(best_record_path(os.path.join(output_dir, "best.keras"))) as file:
            best = json.load(file)
    return {
        "output_dir": output_dir,
        "files": {name: what for name, what in _FILES.items() if os.path.exists(os.path.join(output_dir, name))},
        "best": best,
        "finished_earlier": finished_earlier,
        "resumed": dict(resumed or {}),
    }


def _print_summary(summary):
    """Where the files went, the best validation accuracy, and what to run next."""
    output_dir = summary["output_dir"]
    print(f"\nDone. In {output_dir}:")
    for name, what in summary["files"].items():
        if name == "logs":
            what += " (tensorboard --logdir " + shlex.quote(os.path.join(output_dir, "logs")) + ")"
        elif name == "best.keras":
            what += " (below)"
        print(f"  {name:<16} {what}")
    best = summary["best"]
    if best and "monitor" in best:
        stage = {"head": " of the head-only stage", "full": " of the whole-network stage",
                 "lora": " of the LoRA stage"}.get(best.get("stage"), "")
        name = {"val_accuracy": "validation accuracy", "loss": "training loss (no validation data)"}.get(
            best["monitor"], best["monitor"])
        value = f"{best['value']:.2%}" if best["monitor"].endswith("accuracy") else f"{best['value']:.4g}"
        print(f"Best {name}: {value} at epoch {best['epoch']}{stage} (best.keras).")
    model = shlex.quote(os.path.join(output_dir, "best.keras"))
    serving = shlex.quote(os.path.join("serving", os.path.basename(os.path.abspath(output_dir)), "1"))
    print("Next:")
    print(f"  keras-cait predict IMAGE... --model {model}")
    print(f"  keras-cait evaluate --model {model} --data TEST_FOLDER")
    print(f"  keras-cait export {serving} --model {model}    (TF Serving; or a .onnx, .tflite, .xml file)",
          flush=True)


def _distribution(strategy):
    with _about("strategy", strategy, ValueError):
        return distribute.distribution(strategy)


# === The runs ===


def _decoder_messages_dropped(run_function):
    """`run_function` with the image decoders' own lines (libjpeg's "Corrupt JPEG data: ...") kept off
    standard error while it runs: a bad file is named in keras_cait's words (`keras_cait.decoder_messages`)."""

    @functools.wraps(run_function)
    def quiet(*args, **kwargs):
        with decoder_messages_dropped():
            return run_function(*args, **kwargs)

    return quiet


@_decoder_messages_dropped
def train(model, data, output_dir, *, recipe=None, val_data=None, class_names=None, tfds_dir=None,
          image_size=224, crop_pct=1.0, precision="auto", strategy="none", seed=0,
          deterministic=False, jit_compile=True, teacher=None, backup_every=1000, cache=False,
          shuffle_buffer=None, verbose=1, fit_batch_to_data=False):
    """Trains a CaiT from scratch with `recipe` (default `RECIPES["deit"]`, the paper's).

    Args:
        model: a variant name ("S24", "cait_s24_224") or a dict of `build_cait` arguments.
        data, val_data: "folder" of class subfolders, "tfrecord:PATTERN", "tfds:NAME:SPLIT", or a
            `sources.ImageSource`.
        output_dir: where the run's files go; the same call again resumes a killed run.
        class_names: the names of the classes, in label order (TFRecords need them).
        image_size: the side of the training images; crop_pct: the validation centre crop.
        precision: a Keras dtype policy: "float32", "mixed_float16" or "mixed_bfloat16"; "auto" (the
            default): `default_precision()`, the fast one where the run is (said as it starts).
        strategy: "none", "mirrored", "multiworker" or "dataparallel" (`training.distribute`).
        teacher: with a distilling recipe, a .keras path, a keras.applications name or a model.
        backup_every: steps between backups of the whole training state.
        fit_batch_to_data: lower a recipe's batch larger than the training images to what they
            fill (said), rather than raise; the command line does this when --batch-size is not given.

    Returns:
        a `RunResult`: the model (final weights, class names attached) and the summary.
    """
    recipe = RECIPES["deit"] if recipe is None else recipe
    _check_recipe(recipe, teacher, "train")
    precision = _check_precision(precision, auto=True)
    settings = _settings(model=model, data=_given(data), val_data=_given(val_data), class_names=class_names,
                         tfds_dir=tfds_dir, image_size=image_size, crop_pct=crop_pct, precision=precision,
                         seed=seed, teacher=_given(teacher), shuffle_buffer=shuffle_buffer)
    _configure(precision, seed, deterministic)
    distribution = _distribution(strategy)
    data = _open_data(data, val_data, 0, class_names, tfds_dir, seed)
    run = _Run("train", settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data)
    final = os.path.join(run.output_dir, "final.keras")
    if run.record.finished("train"):
        return _finished_earlier(run, final)
    with distribution.scope():
        classifier = with_class_names(_new_model(model, recipe, image_size, data.train.num_classes),
                                      data.train.class_names)
        fitted = _fitted(classifier, recipe, _teacher(teacher, recipe, data.train.num_classes))
    run.compile(fitted, jit_compile=jit_compile)
    run.announce()
    run.fit(fitted, "train", recipe.epochs, seed, image_size, run.validation(image_size, crop_pct),
            backup_every, shuffle_buffer, cache)
    save_model(classifier, final)
    run.record.finish("train")
    return run.result(classifier)


def _given(value):
    """A path as the run record keeps it (absolute where it exists), a name or JSON as given."""
    if isinstance(value, (str, os.PathLike)):
        return _spec(value)
    if isinstance(value, sources.ImageSource):
        return "<ImageSource>"
    if isinstance(value, keras.Model):
        return f"<model {value.name}>"
    return value


@_decoder_messages_dropped
def finetune(model, data, output_dir, *, recipe=None, weights="imagenet", val_data=None, val_fraction=None,
             class_names=None, tfds_dir=None, image_size=None, crop_pct=1.0, precision="auto",
             strategy="none", seed=0, deterministic=False, jit_compile=True, lora_rank=0, teacher=None,
             backup_every=200, cache=False, shuffle_buffer=None, verbose=1, fit_batch_to_data=False):
    """Fine-tunes a CaiT on new classes with `recipe` (default `RECIPES["transfer"]`): a new head
    alone for `recipe.head_epochs`, the backbone frozen, then the whole network (or, with
    `lora_rank`, rank-R LoRA updates of the attention projections and the head) for
    `recipe.epochs`, at any `image_size` (the position embedding is resized).

    Args:
        model: a variant name ("XXS24", "cait_xxs24_384") with `weights` ("imagenet", None or a
            file), or the path of a .keras model.
        data, val_data: as in `train`; without `val_data`, `val_fraction` of `data` is held out
            (default 0.1; 0: no validation), about that part of each class and never a class's
            last image, so each class needs 2 images or more; with `val_data`, `val_fraction`
            must not be given.
        image_size: default: the .keras model's own side, or the side of the checkpoint the name loads.
        The other arguments are `train`'s.

    Returns:
        a `RunResult`: the model (final weights, class names attached) and the summary.
    """
    recipe = RECIPES["transfer"] if recipe is None else recipe
    _check_recipe(recipe, teacher, "finetune")
    val_fraction = _validation_fraction(val_data, val_fraction)
    precision = _check_precision(precision, auto=True)
    settings = _settings(model=_given(model), weights=_given(weights), data=_given(data),
                         val_data=_given(val_data), val_fraction=val_fraction, class_names=class_names,
                         tfds_dir=tfds_dir, image_size=image_size, crop_pct=crop_pct, precision=precision,
                         seed=seed, lora_rank=lora_rank, teacher=_given(teacher), shuffle_buffer=shuffle_buffer)
    _configure(precision, seed, deterministic)
    distribution = _distribution(strategy)
    data = _open_data(data, val_data, val_fraction, class_names, tfds_dir, seed)
    run = _Run("finetune", settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data)
    head_weights = os.path.join(run.output_dir, "head.weights.h5")
    last_stage = ("lora" if lora_rank else "full") if recipe.epochs else "head"
    if run.record.finished(last_stage):
        return _finished_earlier(run, os.path.join(run.output_dir, "final.keras"))

    if image_size is None and not _is_file(model):
        image_size = default_image_size(model)
    with distribution.scope():
        classifier = _classifier(model, weights, recipe, image_size, precision, data.train.class_names)
        teacher = _teacher(teacher, recipe, data.train.num_classes)
    image_size = classifier.input_shape[1]
    validation = run.validation(image_size, crop_pct)
    run.announce()
    if recipe.head_epochs:
        print(f"Stage 1 of 2: the new head alone, backbone frozen, {recipe.head_epochs} epoch(s)", flush=True)
        if run.record.finished("head") and os.path.exists(head_weights):
            print(f"Stage 1 done in an earlier run: the head is loaded from {head_weights}, not trained again.",
                  flush=True)
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
        print(f"Stage 2 of 2: {stage}, {recipe.epochs} epoch(s)", flush=True)
        with distribution.scope():
            if lora_rank:
                _check_lora_can_start(run.output_dir)
                lora.enable_lora(classifier, lora_rank)
            else:
                transfer.set_backbone_trainable(classifier, True)
            fitted = _fitted(classifier, recipe, teacher)
        run.compile(fitted, jit_compile=jit_compile)
        run.fit(fitted, last_stage, recipe.epochs, seed + 1, image_size, validation, backup_every,
                shuffle_buffer, cache)
    if lora_rank:
        classifier = lora.merge_lora(classifier)
    save_model(classifier, os.path.join(run.output_dir, "final.keras"))
    run.record.finish(last_stage)
    return run.result(classifier)


def _check_lora_can_start(output_dir):
    """A LoRA stage cannot resume: Keras saves LoRA merged into the kernel and zeroes A and B on loading."""
    backup = os.path.join(output_dir, "backup", "lora")
    if os.path.exists(backup):
        raise resume.BackupError(
            f"{backup} holds a backup of an interrupted LoRA stage, which cannot be resumed (Keras "
            "saves the LoRA update merged into the kernel, and A = B = 0 would not train); "
            f"remove {backup} to run the LoRA stage again from the trained head."
        )


@_decoder_messages_dropped
def evaluate(model, data, *, weights="imagenet", class_names=None, tfds_dir=None, image_size=None,
             crop_pct=1.0, batch_size=64, precision="float32", verbose=1):
    """Top-1 (and, from 5 classes, top-5) accuracy of a CaiT on `data`, as CaiT is evaluated
    (resize to `image_size / crop_pct`, centre crop `image_size`).

    Args:
        model: a variant name with `weights`, the path of a .keras model, or a Keras model.
        data: as in `train`; its classes must be the model's, in the model's order.
        image_size: default: the model's own side, or the side of the checkpoint the name loads.

    Returns:
        {"top1": ..., "top5": ..., "images": N}.
    """
    _check_precision(precision)
    keras.mixed_precision.set_global_policy(precision)
    source = _open("data", data, class_names, tfds_dir)
    _check_images({"data": (data, source)})
    if isinstance(model, keras.Model) or _is_file(model):
        classifier = model if isinstance(model, keras.Model) else _load_keras("model", model)
        side = _square_side(classifier, model)
        if image_size is not None and image_size != side:
            raise RunError(f"image_size={image_size}: the model takes {side}x{side} images; leave image_size "
                           "out to use the model's size.", "image_size", usage=True)
        image_size = side
    else:
        image_size = image_size or default_image_size(model)
        classifier = _variant(model, weights, input_shape=(image_size, image_size, 3))
    named = model if isinstance(model, (str, os.PathLike)) else classifier.name
    with _about("model", named, ValueError):
        classes = class_count(classifier)
    if classes != source.num_classes:
        raise RunError(f"model={named!r} predicts {classes} classes but data={_given(data)!r} has "
                       f"{source.num_classes}; evaluate on data with the model's classes in the same (sorted) "
                       "order.", "data")
    names = getattr(classifier, "class_names", None)
    if names is not None and list(names) != [str(name) for name in source.class_names]:
        raise RunError(f"data={_given(data)!r} has the classes {_listed(source.class_names)} but model={named!r} "
                       f"was trained on {_listed(names)}; evaluate on data of the model's classes (folder names "
                       "are classes, in sorted order).", "data")
    metrics = [keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1")]
    if classes >= 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"))
    # Keras evaluates a loss in any case; only the accuracies are reported.
    classifier.compile(loss="sparse_categorical_crossentropy", metrics=metrics, jit_compile=False)
    dataset = stream.evaluation_dataset(source, image_size, batch_size, crop_pct)
    results = classifier.evaluate(dataset, return_dict=True, verbose=verbose)
    report = {name: float(value) for name, value in results.items() if name != "loss"}
    report["images"] = source.num_examples
    return report


def _listed(names):
    names = [str(name) for name in names]
    return ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:5])}, … ({len(names)} in all)"
