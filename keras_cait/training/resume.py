"""Resumable training: a step-exact backup callback and the `fit` that resumes from it."""

import contextlib
import json
import os
import re
import shutil
import warnings
import zipfile

import keras
import numpy as np

from keras_cait.errors import ArgumentError, Named, Said, checked_count, listed, quietly_caused, spoken
from keras_cait.io import atomic

_POINTER = "latest.json"


def differences(saved, current, arguments=()):
    """The parts of 'epochs 3 then, 5 now; ...' for each entry of `current` that `saved` records
    otherwise ([] if none): the one wording of what a rerun changed, for run.json's settings,
    recipe.json's knobs and a backup's plan; `arguments`: the keys that are arguments of a run
    (a `Named` each, which the command line writes as its flag). Entries `saved` lacks, from runs
    before they were recorded, count as unchanged."""
    changed = [key for key, value in current.items() if key in saved and saved[key] != value]
    return [part for index, key in enumerate(changed)
            for part in ("; " if index else "", Named(key) if key in arguments else key,
                         f" {_shown(saved[key])} then, {_shown(current[key])} now")]


def recorded(settings):
    """A run's settings as run.json keeps and compares them: keyed by the run's arguments as Python
    names them (a record written before, keyed by the command line's flags, `--val-data`, read
    as `val_data`), each value as a value, not a spelling: `weights` None, "none" and "None" are
    one value, None."""
    settings = {key[2:].replace("-", "_") if key.startswith("--") else key: value for key, value in settings.items()}
    if isinstance(settings.get("weights"), str) and settings["weights"].lower() == "none":
        settings["weights"] = None
    return settings


class RunRecord:
    """`run.json` in a run's folder: the settings of the run and the stages it has finished.

    Written as the first stage starts training (`begin`) and after each stage ends, so that a
    rerun in the same folder knows what it would resume. `RunRecord.open`
    refuses a rerun whose settings differ from the recorded ones (naming each
    one) once the run has something to lose: a finished stage or a backup; a
    folder with neither is started over. `finished(stage)` tells which stages
    a rerun skips. The settings are keyed by the run's arguments (`recorded`),
    so a run started from Python resumes from the command line and the other
    way round.

        {"command": "finetune", "settings": {"data": "/photos", "weights": null, ...}, "finished": ["head"]}
    """

    FILENAME = "run.json"

    def __init__(self, path, command, settings, finished=()):
        self.path, self.command, self.settings = path, command, dict(settings)
        self._finished = list(finished)
        self._recipe = None  # (recipe, name) to write with a new record

    def begin(self):
        """Writes a new record (and its recipe.json) as the run starts training; a no-op for a
        record read back. Nothing is written before, so a run refused while starting leaves
        nothing behind."""
        if self._recipe is None:
            return
        recipe, name = self._recipe
        if recipe is not None:
            recipe.save(os.path.join(os.path.dirname(self.path), RECIPE_FILENAME), name)
        self._recipe = None
        self._write()

    @classmethod
    def open(cls, output_dir, command, settings, recipe=None, recipe_name=None, arguments=()):
        """The record of the run in `output_dir`, started anew where there is none (a `BackupError`
        when the folder holds a run of another command, other settings or, given a
        `training.recipe.Recipe`, another recipe: its knobs are in `recipe.json` beside run.json).
        `arguments`: the keys of `settings` that are the run's arguments, which a refusal names as such
        (`Named`: the command line writes its flag); the others (`classes`) as they are."""
        path = os.path.join(output_dir, cls.FILENAME)
        settings = recorded(json.loads(json.dumps(settings)))  # as a rerun reads them back: lists, not tuples
        try:
            with open(path) as file:
                saved = json.load(file)
        except FileNotFoundError:
            saved = None
        except (OSError, ValueError) as error:
            raise quietly_caused(BackupError(f"{path} is unreadable ({error}); delete it to start the run over, or "
                                             "give another ", Named("output_dir"), "."), error) from None
        if saved is not None and not saved.get("finished") and not os.path.isdir(
                os.path.join(output_dir, "backup")):
            # Started, but nothing trained that a rerun would lose (refused or stopped before its
            # first backup): not a run to protect; this one starts in its place.
            saved = None
        if saved is None:  # written by `begin`, when the run starts training
            record = cls(path, command, settings)
            record._recipe = (recipe, recipe_name)
            return record
        if saved.get("command") != command:
            raise BackupError(f"{output_dir} holds a {saved.get('command')} run; give this {command} run another ",
                              Named("output_dir"), ".")
        changed = differences(_legacy_sources_kept(recorded(saved.get("settings", {})), settings), settings, arguments)
        if recipe is not None:
            knobs = _recipe_differences(output_dir, recipe)
            changed = [*changed, "; ", *knobs] if changed and knobs else changed or knobs
        if changed:
            raise BackupError(
                f"{output_dir} holds a run with other settings (", changed, "). Rerun with that run's "
                "settings to resume it, give another ", Named("output_dir"), ", or delete the folder to start "
                f"over: rm -r {output_dir}"
            )
        return cls(path, command, settings, saved.get("finished", []))

    def finished(self, stage):
        return stage in self._finished

    def finish(self, stage):
        self.begin()
        if stage not in self._finished:
            self._finished.append(stage)
            self._write()

    def _write(self):
        record = {"command": self.command, "settings": self.settings, "finished": self._finished}
        atomic.write_text(self.path, json.dumps(record, indent=2) + "\n")


RECIPE_FILENAME = "recipe.json"


LEGACY_SOURCE = "<ImageSource>"  # how run.json recorded any ImageSource before `run_data.recorded_source`
# How run.json recorded a Keras model before `run_data.recorded_model`: "<model NAME>", no weights.
LEGACY_MODEL = re.compile(r"<model [^,<>]*>")


def _legacy_sources_kept(saved, settings):
    """`saved` with each ImageSource that an older run.json recorded as "<ImageSource>", and each
    Keras model it recorded by its name alone (which say nothing of which it was), taken as the one
    given now (a model of that name), so that such a run still resumes."""
    def kept(key, value):
        now = str(settings.get(key, ""))
        if value == LEGACY_SOURCE and now.startswith("<ImageSource"):
            return settings[key]
        if isinstance(value, str) and LEGACY_MODEL.fullmatch(value) and now.startswith(f"{value[:-1]}, weights "):
            return settings[key]
        return value

    return {key: kept(key, value) for key, value in saved.items()}


def _recipe_differences(output_dir, recipe):
    """The parts naming the knobs in which `recipe` differs from the recipe the run in `output_dir` ran."""
    from keras_cait.training.recipe import Recipe

    path = os.path.join(output_dir, RECIPE_FILENAME)
    try:
        saved = Recipe.load(path)
    except FileNotFoundError:
        return [f"{path} missing"]
    except (OSError, ValueError, TypeError) as error:
        raise quietly_caused(BackupError(f"{path} is unreadable ({error}); delete the folder to start the run over, "
                                         "or give another ", Named("output_dir"), "."), error) from None
    knobs = recipe.as_dict()
    return differences(saved.as_dict(), knobs, arguments=knobs)


def _shown(value):
    """A setting as a message shows it: a long list of class names shortened."""
    return f"[{listed(value, 3)}]" if isinstance(value, list) else value


class BackupError(Said, ValueError):
    """The backups cannot be resumed from: none is usable, or they are of another plan; or the
    output folder holds a run this one cannot continue. Its text names the run's arguments as
    Python writes them (`output_dir`), `render(name)` as another caller spells them (a `Said`)."""


class _ChangedPlan(BackupError):
    """The backup is of a run with other epochs, steps per epoch or batch size."""


class ResumableBackup(keras.callbacks.Callback):
    """Backs up the whole training state every `save_freq` steps and at each epoch end.

    A backup holds the model weights with the optimizer state (one
    `.weights.h5`: step count, hence the learning-rate schedule's position,
    Adam moments, EMA weights, loss scale), the states of the model's random
    generators (stochastic depth), the `best` of the given ModelCheckpoints, the
    number of training steps done and the run's plan (epochs, steps per epoch,
    batch size). It is written into a new folder and published by atomically
    replacing `latest.json`; the backup before it is kept, so a kill at any
    moment, or a latest backup found unreadable, leaves one to resume from.

    Keras' `BackupAndRestore` restarts an interrupted epoch from its first batch
    on top of the weights of its last backed-up batch, so a resumed run trains
    on part of that epoch twice, and it overwrites its files in place. This
    callback resumes at the very step instead (see `fit`), which with
    `data.training_stream` reproduces the uninterrupted run exactly.

    Args:
        backup_dir: folder of the backups (one per run; removed by `fit` when the
            run completes).
        save_freq: steps between backups (an epoch end always backs up).
        checkpoints: ModelCheckpoint callbacks whose best value to keep.
    """

    def __init__(self, backup_dir, save_freq=500, checkpoints=()):
        super().__init__()
        save_freq = checked_count("save_freq", save_freq, 500, note=", the steps between backups")
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ArgumentError("backup_dir", backup_dir, "must be the path of a folder for the backups",
                                ["e.g. ", Named("backup_dir", "run/backup")], usage=True)
        if os.path.exists(backup_dir) and not os.path.isdir(backup_dir):
            raise ArgumentError("backup_dir", os.fspath(backup_dir), "is a file, not a folder",
                                "give a folder for the backups (it is made where missing)", usage=True)
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.checkpoints = list(checkpoints)
        self.step = 0
        self.saved_step = None  # the step of the newest backup written or resumed from
        self.plan = {}

    @staticmethod
    def _random_states(model):
        weights = {id(w) for w in model.weights}
        return [v for v in model.variables if id(v) not in weights]

    def _complete_backups(self):
        """The complete backup folders, newest first: the one `latest.json` names, then by step."""
        try:
            entries = os.listdir(self.backup_dir)
        except FileNotFoundError:
            return [], None
        folders = sorted(
            (e for e in entries if re.fullmatch(r"step-\d+", e)),
            key=lambda e: int(e.removeprefix("step-")), reverse=True,
        )
        try:
            with open(os.path.join(self.backup_dir, _POINTER)) as file:
                latest = json.load(file)["folder"]
        except FileNotFoundError:
            return folders, None
        except (ValueError, KeyError, TypeError) as error:
            return folders, f"{_POINTER} is unreadable ({error!r})"
        if latest not in folders:
            return folders, f"{_POINTER} names {latest}, which is missing"
        return [latest] + [f for f in folders if f != latest], None

    def _check_plan(self, saved):
        changed = spoken(differences(saved, self.plan))
        if changed:
            raise _ChangedPlan(
                f"The backup in {self.backup_dir} is of a run with another plan ({changed}), "
                "so resuming would continue on another schedule. Rerun with the backup's "
                f"settings to resume it, or delete the folder to start over: rm -r {self.backup_dir}"
            )

    def _load(self, model, folder):
        """Loads one backup folder into `model`; returns its step."""
        folder = os.path.join(self.backup_dir, folder)
        with open(os.path.join(folder, "progress.json")) as file:
            progress = json.load(file)
        self._check_plan(progress.get("plan", {}))
        random_states = self._random_states(model)
        with np.load(os.path.join(folder, "random.npz")) as random:
            values = [random[f"state_{index}"] for index in range(len(random_states))]
        model.load_weights(os.path.join(folder, "state.weights.h5"))
        for variable, value in zip(random_states, values):
            variable.assign(value)
        for checkpoint, best in zip(self.checkpoints, progress["checkpoint_best"]):
            checkpoint.best = best
        return int(progress["step"])

    def restore(self, model):
        """Loads the newest usable backup into `model` (built and compiled); returns the steps done.

        0 when there is none. An unreadable backup is skipped for the one before
        it, with a warning saying so; a ValueError names the folder when a
        backup exists but none is usable, or when it is of another plan.
        """
        folders, problem = self._complete_backups()
        if not folders and problem is None:
            self.step, self.saved_step = 0, None
            return 0
        build_optimizer(model)
        unusable = [problem] if problem else []
        for folder in folders:
            try:
                self.step = self._load(model, folder)
            except _ChangedPlan:
                raise
            except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
                unusable.append(f"{folder} is unreadable ({error!r})")
                continue
            if unusable:
                warnings.warn(
                    f"Resuming from the backup {folder} (step {self.step}) in {self.backup_dir}: "
                    + "; ".join(unusable) + ".",
                    stacklevel=2,
                )
            self.saved_step = self.step
            return self.step
        raise BackupError(
            f"No usable backup in {self.backup_dir} to resume from: " + "; ".join(unusable)
            + f". Delete the folder to start the run over: rm -r {self.backup_dir}"
        )

    def save(self):
        """Writes a backup of `self.model` at the current step; keeps the one before it."""
        folder_name = f"step-{self.step}"
        with atomic.written_atomically(os.path.join(self.backup_dir, folder_name)) as partial:
            os.makedirs(partial)
            self.model.save_weights(os.path.join(partial, "state.weights.h5"))
            np.savez(
                os.path.join(partial, "random.npz"),
                **{f"state_{i}": np.asarray(v) for i, v in enumerate(self._random_states(self.model))},
            )
            progress = {
                "step": self.step,
                "plan": self.plan,
                "checkpoint_best": [
                    None if c.best is None else float(c.best) for c in self.checkpoints
                ],
            }
            with open(os.path.join(partial, "progress.json"), "w") as file:
                json.dump(progress, file)
        atomic.write_text(
            os.path.join(self.backup_dir, _POINTER), json.dumps({"folder": folder_name, "step": self.step})
        )
        self.saved_step = self.step
        folders, _ = self._complete_backups()
        for entry in folders[2:]:
            shutil.rmtree(os.path.join(self.backup_dir, entry), ignore_errors=True)

    def remove(self):
        """Deletes the backups (the run is complete)."""
        shutil.rmtree(self.backup_dir, ignore_errors=True)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.save_freq == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        # After ModelCheckpoint has updated its best (callbacks run in order).
        self.save()


class _FinishEpochOnly(keras.callbacks.Callback):
    """Ends a `model.fit` after its first epoch, leaving the weights as training left them.

    `fit` replaces the weights by the optimizer's moving average when it ends
    (with `use_ema=True`); after the remainder of an interrupted epoch the run
    goes on, so that must be undone.
    """

    def __init__(self):
        super().__init__()
        self.weights = None

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True
        self.weights = [keras.ops.copy(w.value) for w in self.model.trainable_weights]

    def on_train_end(self, logs=None):
        for variable, value in zip(self.model.trainable_weights, self.weights or ()):
            variable.assign(value)


def build_optimizer(model):
    """Creates the optimizer's variables (moments, moving averages) before the first step.

    Keras builds them in the first training step when no distribution strategy is set;
    TensorFlow traces a function that creates variables twice, and on the CPU each trace
    of CaiT's step is most of the time to the first step.
    """
    if model.optimizer is None or model.optimizer.built:
        return
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's Trainer only
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model.optimizer.build(model.trainable_variables)


def fit(
    model,
    stream_from,
    epochs,
    steps_per_epoch,
    backup=None,
    callbacks=(),
    validation_data=None,
    verbose="auto",
    plan=None,
):
    """`model.fit` for `epochs` epochs, resuming where `backup` last saved.

    Args:
        model: a compiled model.
        stream_from: `step -> tf.data.Dataset` of the training batches from that
            global step on (e.g. `data.training_stream(..., start_step=step)`).
        epochs, steps_per_epoch: the length of the whole run.
        backup: a `ResumableBackup`, or None for no backups.
        callbacks: further Keras callbacks (progress, TensorBoard, checkpoints);
            put the backup's ModelCheckpoints before it so that it saves their
            best value of the epoch.
        validation_data: evaluated at the end of each epoch.
        verbose: as in `model.fit`.
        plan: further settings a resumed run must share with the backup, e.g.
            `{"global batch size": 512}` (epochs and steps per epoch always).

    Returns:
        the `History` of the last `model.fit` call; None when the backup is
        already at the end of the run (nothing is trained again).

    A run killed in epoch e after k of its steps resumes with a `model.fit` over
    the remaining steps of epoch e, then one over epochs e+1 ... `epochs`.
    """
    epochs, steps_per_epoch = _checked_plan(model, stream_from, epochs, steps_per_epoch, backup)
    callbacks = list(callbacks)
    _check_validated(callbacks, validation_data)
    callbacks += [backup] if backup is not None else []
    build_optimizer(model)
    start = 0
    if backup is not None:
        backup.plan = {"epochs": epochs, "steps per epoch": steps_per_epoch, **(plan or {})}
        start = backup.restore(model)
    epoch, batch = divmod(start, steps_per_epoch)
    history = None
    # The stream is shuffled already (Keras warns that it ignores shuffle=True on a dataset).
    common = dict(validation_data=validation_data, verbose=verbose, shuffle=False)
    if batch:
        history = model.fit(
            stream_from(start),
            initial_epoch=epoch,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch - batch,
            callbacks=callbacks + [_FinishEpochOnly()],
            **common,
        )
        epoch += 1
    if epoch < epochs:
        history = model.fit(
            stream_from(epoch * steps_per_epoch),
            initial_epoch=epoch,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            **common,
        )
    if backup is not None:
        backup.remove()
    return history


def _checked_plan(model, stream_from, epochs, steps_per_epoch, backup):
    """`fit`'s arguments refused before anything trains or is restored, each naming itself (they used to
    fail as an AttributeError on `optimizer`, a `'Dataset' object is not callable`, a ZeroDivisionError,
    a TypeError on `<`); returns epochs and steps_per_epoch as ints."""
    if not isinstance(model, keras.Model):
        raise ArgumentError("model", model, f"must be a Keras model, not a {type(model).__name__}",
                            "e.g. keras_cait.CaiT_S24(weights=None)", usage=True, shown=f"<{type(model).__name__}>")
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ArgumentError("model", model, "is not compiled", "call model.compile(optimizer=..., loss=...) "
                            "before fit", usage=True, shown=f"<{type(model).__name__} {model.name}>")
    if not callable(stream_from) or isinstance(stream_from, keras.Model):
        raise ArgumentError("stream_from", stream_from, f"must be a function of the global step, not a "
                            f"{type(stream_from).__name__}", "e.g. lambda step: training_stream(source, "
                            "batch_size, epochs, start_step=step), which a resumed run starts at its step",
                            usage=True, shown=f"<{type(stream_from).__name__}>")
    epochs = checked_count("epochs", epochs, 300, note=", the epochs of the whole run")
    steps_per_epoch = checked_count("steps_per_epoch", steps_per_epoch, 100)
    if backup is not None and not isinstance(backup, ResumableBackup):
        raise ArgumentError("backup", backup, f"must be a ResumableBackup or None, not a {type(backup).__name__}",
                            ["e.g. ", Named("backup", "ResumableBackup('run/backup')", shown="ResumableBackup('run/backup')")],
                            usage=True)
    return epochs, steps_per_epoch


def _check_validated(callbacks, validation_data):
    """Each callback with a `check_fit(validation_data)` (`BestModelCheckpoint`: a validation metric
    without validation data) refuses before the first epoch, not at its end. Keras' own callbacks are
    left to Keras, which warns and goes on (`EarlyStopping`, a `ModelCheckpoint` of every epoch)."""
    for callback in callbacks:
        check = getattr(callback, "check_fit", None)
        if callable(check):
            check(validation_data)
