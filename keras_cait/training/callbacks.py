"""The callbacks of a training run: best-model checkpoint, TensorBoard, backups."""

import importlib.util
import os

import keras

from keras_cait.atomic import written_atomically
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
    # The same layers and variables in an uncompiled model of the same class: nothing copied.
    bare = type(model)(inputs=model.inputs, outputs=model.outputs, name=model.name)
    with written_atomically(path) as partial:
        bare.save(partial)


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves the model with the best `monitor` so far to `filepath` (`save_model`).

    Like `keras.callbacks.ModelCheckpoint(save_best_only=True)`, but the file
    holds the model only (no optimizer state) and a kill during the save never
    destroys the previous best. `best` is the best value so far (None before
    the first epoch); `ResumableBackup` keeps it across resumptions.
    """

    def __init__(self, filepath, monitor="val_accuracy", mode="max"):
        super().__init__()
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: must be 'min' or 'max'.")
        self.filepath, self.monitor, self.mode = os.fspath(filepath), monitor, mode
        self.best = None

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            raise KeyError(
                f"BestModelCheckpoint monitors {self.monitor!r}, which the epoch's logs lack "
                f"(they have {sorted(logs or {})}); monitor one of them."
            )
        value = float(value)
        if self.best is None or (value < self.best if self.mode == "min" else value > self.best):
            self.best = value
            save_model(self.model, self.filepath)


def run_callbacks(output_dir, backup_dir, backup_every, monitor="val_accuracy"):
    """Callbacks of `scripts/train.py` and `scripts/finetune.py` writing under `output_dir`.

    - `best.keras`: the model with the best `monitor` so far (`BestModelCheckpoint`;
      the lowest value for a loss, else the highest);
    - `logs/`: TensorBoard scalars of the losses and metrics per epoch;
    - `backup_dir`: a `ResumableBackup` every `backup_every` steps.

    Returns:
        (callbacks to pass to `resume.fit`, the `ResumableBackup`).
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError(
            "The training runs write TensorBoard logs, which need the tensorboard package: "
            'pip install "keras-cait[train]" (or pip install tensorboard).'
        )
    checkpoint = BestModelCheckpoint(
        os.path.join(output_dir, "best.keras"),
        monitor=monitor,
        mode="min" if monitor.endswith("loss") else "max",
    )
    backup = ResumableBackup(backup_dir, save_freq=backup_every, checkpoints=[checkpoint])
    tensorboard = keras.callbacks.TensorBoard(os.path.join(output_dir, "logs"))
    return [checkpoint, tensorboard], backup
