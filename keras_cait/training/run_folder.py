"""The folder of a run: its record (`run.json`, `recipe.json`), its stages' resumable fits, its files
and the summary a run returns.

`_Run` holds what `train` and `finetune` share: the record opened (a rerun with other settings
refused), the batch plan, the compile, the validation data and each stage's resumable `fit`.
"""

import contextlib
import json
import os
import shlex
import sys

import keras

from keras_cait.errors import Named, counted, report, say
from keras_cait.io.atomic import unwritable
from keras_cait.training import image_checks, resume, stream
from keras_cait.training.callbacks import BestModelCheckpoint, best_record_path, run_callbacks, tensorboard_installed
from keras_cait.training.recipe import RECIPES
from keras_cait.training.run_errors import RunError
from keras_cait.training.run_plan import Plan, batch_fitted, compile_for


def check_output_dir(output_dir):
    """`output_dir` of a run, checked before anything is read: a folder, or one that can be made, this
    process writes in (the nearest part of it that exists decides); else a `RunError` naming it."""
    if not isinstance(output_dir, (str, os.PathLike)):
        raise RunError("output_dir", output_dir, f"must be a folder's path, not {type(output_dir).__name__}",
                       ["e.g. ", Named("output_dir", "runs/flowers")], usage=True)
    if not os.fspath(output_dir).strip():  # '' wrote the run's files into the working folder
        raise RunError("output_dir", os.fspath(output_dir), "is empty, no folder's path",
                       ["e.g. ", Named("output_dir", "runs/flowers"), ", or '.' for the working folder"], usage=True)
    problem = unwritable(output_dir)
    if problem:
        raise RunError("output_dir", os.fspath(output_dir), *problem)


class Run:
    """One run's folder, record, plan and stages: what train and finetune share."""

    def __init__(self, command, settings, recipe, data, distribution, output_dir, verbose, fit_batch_to_data):
        notice = None
        if fit_batch_to_data:
            recipe, notice = batch_fitted(recipe, distribution, data)
        self.command, self.recipe, self.data, self.distribution, self.verbose = (
            command, recipe, data, distribution, verbose)
        self.plan = Plan.of(recipe, distribution, data)
        # Every worker saves (Keras' multi-worker rule); only the chief's files are the run's.
        self.output_dir = os.fspath(output_dir) if distribution.is_chief else os.path.join(
            output_dir, "workers", str(distribution.worker_index))
        arguments = list(settings)
        settings = {**settings, "classes": list(self.data.train.class_names),
                    "global batch size": self.plan.global_batch}
        self.record = resume.RunRecord.open(self.output_dir, command, settings, recipe=recipe,
                                            recipe_name=_recipe_name(recipe), arguments=arguments)
        if notice:  # once the folder took the run: said at verbose=0 too, as the files not read are
            print(notice, flush=True)
        self.resumed = {}

    def announce(self):
        if not tensorboard_installed():
            report('No TensorBoard logs: the tensorboard package is not installed (pip install '
                   '"keras-cait[train]" to have them in logs/).')
        replicas, steps = self.distribution.replicas, self.plan.steps
        say(f"{counted(replicas, 'replica')} (", Named("strategy", self.distribution.name),
            f"), global batch {self.plan.global_batch} ({self.recipe.batch_size} per replica), "
            f"{counted(steps, 'step')} per epoch, {self._peak_learning_rates()}")

    def _peak_learning_rates(self):
        """The peak learning rate of each stage the run trains: a finetune's head stage has its own
        (`head_lr`; the whole network's alone was said, also for a run of the head alone)."""
        batch = self.plan.global_batch
        whole = f"{self.recipe.peak_lr(batch):.3g}"
        if self.command != "finetune" or not self.recipe.head_epochs:
            return f"peak learning rate {whole}"
        head = f"{self.recipe.peak_lr(batch, head=True):.3g}"
        if not self.recipe.epochs:
            return f"peak learning rate {head} (the head)"
        return f"peak learning rate {head} for the head (stage 1), {whole} in stage 2"

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
        monitor = "val_accuracy" if validation is not None else "loss"
        callbacks, backup = run_callbacks(
            self.output_dir, os.path.join(self.output_dir, "backup", stage), backup_every,
            monitor=monitor, stage=stage)
        # best.keras is the best of the whole run: a later stage starts from an earlier one's best
        # (before, its first epoch replaced the head stage's better model whatever its accuracy).
        earlier = _best_record(self.output_dir)
        if earlier and earlier.get("monitor") == monitor:
            checkpoint = next(callback for callback in callbacks if isinstance(callback, BestModelCheckpoint))
            checkpoint.best = earlier["value"]
        augmentation = self.recipe.augmentation(image_size, self.data.train.num_classes)

        def stream_from(step):
            if step and stage not in self.resumed:  # the first stream of the fit: where it resumes
                self.resumed[stage] = step
                # A notice, said at verbose=0 too: the run goes on from a backup, not from the start.
                print(f"Resuming {stage} from the backup at step {step} of "
                      f"{epochs * self.plan.steps} in {backup.backup_dir}", flush=True)
            return stream.training_stream(
                self.data.train, augmentation, self.plan.global_batch, epochs, seed=seed, start_step=step,
                shuffle_buffer=shuffle_buffer, cache=cache)

        with (image_checks.undecodable_named(self.data.named, RunError),
              self._said_if_interrupted(stage, backup, epochs)):
            history = resume.fit(
                model, stream_from, epochs, self.plan.steps, backup=backup, callbacks=callbacks,
                validation_data=validation, verbose=self.verbose,
                plan={"data": self.data.spec, "classes": self.data.train.num_classes, "image size": image_size,
                      "global batch size": self.plan.global_batch},
            )
        with contextlib.suppress(OSError):  # the backups' folder, once no run needs it
            os.rmdir(os.path.dirname(backup.backup_dir))
        return history

    @contextlib.contextmanager
    def _said_if_interrupted(self, stage, backup, epochs):
        """A KeyboardInterrupt (Ctrl-C) in a stage's fit says in one line, before it goes on, where the
        run stopped and that the same call again resumes it."""
        try:
            yield
        except KeyboardInterrupt:
            epoch = min(backup.step // self.plan.steps + 1, epochs)
            if backup.saved_step is None:
                kept = "nothing backed up yet, the same call again starts the stage over"
            else:
                kept = (f"backed up at step {backup.saved_step} in {backup.backup_dir}, where the same call again "
                        "resumes it")
            print(f"\nInterrupted in the {stage} stage at step {backup.step} of {epochs * self.plan.steps} (epoch "
                  f"{epoch} of {epochs}); {kept}.", flush=True)  # a notice, said at verbose=0 too
            raise

    def summary(self, finished_earlier=False):
        """The run's summary (`summary`), printed by the chief."""
        summary = _summary(self.output_dir, finished_earlier, self.resumed)
        if self.distribution.is_chief:
            _print_summary(summary)
        return summary

    def finished_earlier(self, model_path):
        """The model at `model_path` of a run that finished before, said, and the run's summary."""
        print(f"{self.output_dir} holds this run, finished earlier with the same settings: nothing to train. "
              "Give another output folder (or delete this one) to train again.", flush=True)  # a notice too
        import keras_cait  # noqa: F401  registers CaiT's layers with Keras

        return keras.models.load_model(model_path), self.summary(finished_earlier=True)


def check_lora_can_start(output_dir):
    """A LoRA stage cannot resume: Keras saves LoRA merged into the kernel and zeroes A and B on loading."""
    backup = os.path.join(output_dir, "backup", "lora")
    if os.path.exists(backup):
        raise resume.BackupError(
            f"{backup} holds a backup of an interrupted LoRA stage, which cannot be resumed (Keras "
            "saves the LoRA update merged into the kernel, and A = B = 0 would not train); "
            f"remove {backup} to run the LoRA stage again from the trained head."
        )


def _recipe_name(recipe):
    return next((name for name, named in RECIPES.items() if named == recipe), None)


def settings(**values):
    """What a rerun in the same output folder must give again, by argument (as run.json and the
    refusal of a rerun name them; `resume.recorded`)."""
    return dict(sorted(values.items()))


FILES = {
    "best.keras": "the model of the best epoch",
    "final.keras": "the model at the end",
    "ema.keras": "the moving average of the weights",
    "head.weights.h5": "the model after its head-only stage",
    "recipe.json": "the training recipe of the run, every knob (Recipe.load reads it)",
    "run.json": "the other settings of the run and the stages it finished",
    "logs": "TensorBoard logs",
}


def _best_record(output_dir):
    """What best.keras is the best of (`BestModelCheckpoint`'s best.json), or None."""
    with contextlib.suppress(OSError, ValueError):
        with open(best_record_path(os.path.join(output_dir, "best.keras"))) as file:
            record = json.load(file)
        return record if isinstance(record, dict) else None
    return None


def _summary(output_dir, finished_earlier=False, resumed=None):
    best = _best_record(output_dir)
    return {
        "output_dir": output_dir,
        "files": {name: what for name, what in FILES.items() if os.path.exists(os.path.join(output_dir, name))},
        "best": best,
        "finished_earlier": finished_earlier,
        "resumed": dict(resumed or {}),
    }


def _print_summary(summary):
    """Where the files went, and the best validation accuracy."""
    output_dir = summary["output_dir"]
    report(f"\nDone. In {output_dir}:")
    for name, what in summary["files"].items():
        if name == "logs":
            what += " (tensorboard --logdir " + shlex.quote(os.path.join(output_dir, "logs")) + ")"
        elif name == "best.keras":
            what += " (below)"
        report(f"  {name:<16} {what}")
    best = summary["best"]
    if best and "monitor" in best:
        stage = {"head": " of the head-only stage", "full": " of the whole-network stage",
                 "lora": " of the LoRA stage"}.get(best.get("stage"), "")
        name = {"val_accuracy": "validation accuracy", "loss": "training loss (no validation data)"}.get(
            best["monitor"], best["monitor"])
        value = f"{best['value']:.2%}" if best["monitor"].endswith("accuracy") else f"{best['value']:.4g}"
        report(f"Best {name}: {value} at epoch {best['epoch']}{stage} (best.keras).")
    sys.stdout.flush()
