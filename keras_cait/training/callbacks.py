"""The callbacks of a training run: best-model checkpoint, TensorBoard, backups."""

import importlib.util
import json
import os
import shutil
import zipfile

import keras

from keras_cait.errors import ArgumentError, Named, checked_count
from keras_cait.io.atomic import write_text, written_atomically
from keras_cait.models.architecture import with_class_names
from keras_cait.training.resume import ResumableBackup


def save_model(model, path):
    """Writes `model` to a `.keras` file with its architecture and weights only.

    No optimizer state and no compile settings: the file is the model's size
    (a quarter of what `model.save` writes for an AdamW-trained model) and
    loads without optimizer warnings; the resumable backup keeps the training
    state. Written under a temporary name and renamed, so never half-written.
    """
    path = os.fspath(path)
    if not path.endswith(".keras"):
        raise ValueError(f"path={path!r}: must end in .keras, e.g. best.keras.")
    model = getattr(model, "student", model)  # a Distiller saves the model it trains
    # The same layers and variables in an uncompiled model of the same class: nothing copied.
    bare = with_class_names(type(model)(inputs=model.inputs, outputs=model.outputs, name=model.name),
                            getattr(model, "class_names", None))
    with written_atomically(path) as partial:
        bare.save(partial)
        _unfrozen(partial)


def _unfrozen(path):
    """Rewrites the `.keras` file at `path` with every layer's `trainable` flag True in its config: the
    file holds the model, not the stage it was saved in (the head stage's frozen backbone came back
    frozen from `load_model`, and a later `fit` trained the head alone, silently). LoRA's frozen
    kernels are the variables' own flags, not the config's, and stay frozen."""
    def thawed(value):
        if isinstance(value, dict):
            return {key: True if key == "trainable" else thawed(item) for key, item in value.items()}
        return [thawed(item) for item in value] if isinstance(value, list) else value

    rewritten = f"{path}.thawed"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as target:
        for entry in source.infolist():
            if entry.filename == "config.json":
                target.writestr(entry, json.dumps(thawed(json.loads(source.read(entry)))))
                continue
            with source.open(entry) as reading, target.open(entry, "w") as writing:
                shutil.copyfileobj(reading, writing, 1 << 20)
    os.replace(rewritten, path)


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves the model with the best `monitor` so far to `filepath` (`save_model`).

    Like `keras.callbacks.ModelCheckpoint(save_best_only=True)`, but the file
    holds the model only (no optimizer state) and a kill during the save never
    destroys the previous best. `best` is the best value so far (None before
    the first epoch); `ResumableBackup` keeps it across resumptions. Beside the
    model, `<name>.json` says what it is the best of: `{"monitor":
    "val_accuracy", "value": 0.91, "epoch": 3, "stage": "full"}` (epochs from 1).
    """

    def __init__(self, filepath, monitor="val_accuracy", mode="max", stage=None):
        super().__init__()
        _check_monitor(monitor)
        if not isinstance(mode, str) or mode not in ("min", "max"):
            raise ArgumentError("mode", mode, "must be 'min' (a loss) or 'max' (an accuracy)",
                                ["e.g. ", Named("mode", "max")], usage=True)
        self.filepath, self.monitor, self.mode = _model_path(filepath, "best.keras"), monitor, mode
        self.stage = stage
        self.best = None

    def check_fit(self, validation_data):
        """Refuses a validation metric to monitor without `validation_data`, before `resume.fit` trains (in
        a plain `model.fit` the first epoch's end says it, a KeyError after an epoch of training)."""
        if validation_data is None and self.monitor.startswith("val_"):
            raise ArgumentError("validation_data", None, f"is None, but {type(self).__name__} monitors "
                                f"{self.monitor!r}, a metric of the validation data",
                                f"give validation_data, or monitor {self.monitor.removeprefix('val_')!r}", usage=True)

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            unvalidated = self.monitor.startswith("val_") and not any(key.startswith("val_") for key in logs or {})
            raise _MonitorMissing(
                "monitor", self.monitor, f"the epoch's logs lack it (they have {', '.join(sorted(logs or {}))})"
                + (": fit was given no validation_data" if unvalidated else ""),
                "give fit validation_data" if unvalidated else "monitor one of them", usage=True)
        value = float(value)
        if self.best is None or (value < self.best if self.mode == "min" else value > self.best):
            self.best = value
            save_model(self.model, self.filepath)
            record = {"monitor": self.monitor, "value": value, "epoch": epoch + 1, "stage": self.stage}
            write_text(best_record_path(self.filepath), json.dumps(record) + "\n")


class _MonitorMissing(ArgumentError, KeyError):
    """The monitored metric is not in an epoch's logs (a KeyError, as it was, and an ArgumentError naming
    `monitor`)."""


def _model_path(filepath, example):
    # Checked when the callback is made: 'best.h5' used to be refused by save_model only when the first
    # epoch (or, for the moving average, the whole training) had run, and None as a bare TypeError.
    if not isinstance(filepath, (str, os.PathLike)) or not os.fspath(filepath).endswith(".keras"):
        raise ArgumentError("filepath", filepath, "must be the path of a .keras file",
                            ["e.g. ", Named("filepath", example)], usage=True)
    return os.fspath(filepath)


def _check_monitor(monitor):
    # None used to be taken, and refused only at the end of the first epoch, as a KeyError
    # (run_callbacks: an AttributeError on `endswith`).
    if not isinstance(monitor, str) or not monitor:
        raise ArgumentError("monitor", monitor, "must be the name of a metric in the epoch's logs",
                            ["e.g. ", Named("monitor", "val_accuracy"), " or ", Named("monitor", "val_loss")],
                            usage=True)


def best_record_path(model_path):
    """Where `BestModelCheckpoint` says what `model_path` is the best of: best.keras -> best.json."""
    return os.fspath(model_path).removesuffix(".keras") + ".json"


class MovingAverageFile(keras.callbacks.Callback):
    """DeiT's EMA semantics: the model keeps its trained (raw) weights, the average gets its own file.

    With `use_ema=True` Keras' `fit` replaces the weights by the optimizer's
    moving average when it ends. DeiT evaluates and picks the best model on the
    raw weights and keeps the average apart (`model_ema`); here the average is
    saved to `filepath` (e.g. ema.keras) and the raw weights are put back.
    """

    def __init__(self, filepath):
        super().__init__()
        self.filepath = _model_path(filepath, "ema.keras")
        self.raw = None

    def on_epoch_end(self, epoch, logs=None):
        self.raw = [keras.ops.copy(w.value) for w in self.model.trainable_weights]

    def on_train_end(self, logs=None):
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        if self.raw is None or not getattr(optimizer, "use_ema", False):
            return
        save_model(self.model, self.filepath)
        for variable, value in zip(self.model.trainable_weights, self.raw):
            variable.assign(value)


def run_callbacks(output_dir, backup_dir, backup_every, monitor="val_accuracy", stage=None):
    """Callbacks of `keras-cait train` and `keras-cait finetune` writing under `output_dir`.

    - `best.keras`: the model with the best `monitor` so far (`BestModelCheckpoint`;
      the lowest value for a loss, else the highest), on the raw weights;
    - `ema.keras`: with an EMA optimizer, the moving average at the end
      (`MovingAverageFile`), while the model keeps its raw weights;
    - `logs/`: TensorBoard scalars of the losses and metrics per epoch, where the
      tensorboard package is installed (`pip install "keras-cait[train]"`);
    - `backup_dir`: a `ResumableBackup` every `backup_every` steps.

    Returns:
        (callbacks to pass to `resume.fit`, the `ResumableBackup`).
    """
    _check_monitor(monitor)
    backup_every = checked_count("backup_every", backup_every, 1000)  # not as ResumableBackup's save_freq
    checkpoint = BestModelCheckpoint(
        os.path.join(output_dir, "best.keras"),
        monitor=monitor,
        mode="min" if monitor.endswith("loss") else "max",
        stage=stage,
    )
    backup = ResumableBackup(backup_dir, save_freq=backup_every, checkpoints=[checkpoint])
    moving_average = MovingAverageFile(os.path.join(output_dir, "ema.keras"))
    if not tensorboard_installed():
        return [checkpoint, moving_average], backup
    tensorboard = keras.callbacks.TensorBoard(os.path.join(output_dir, "logs"))
    return [checkpoint, tensorboard, moving_average], backup


def tensorboard_installed():
    """Whether the runs can write TensorBoard logs (the `train` extra); they run without them."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # an import hook that refuses it, a broken install
        return False
