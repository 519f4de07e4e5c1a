"""A killed run resumes at its last backup and ends exactly where an uninterrupted one ends."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_cait.training import adamw
from keras_cait.cli.errors import flag_name
from keras_cait.training.resume import BackupError, ResumableBackup, RunRecord, build_optimizer, fit

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS_PER_EPOCH = 90 // 8  # 100 digits, 10% held out, batches of 8


def compiled(tiny_cait):
    keras.utils.set_random_seed(0)
    model = tiny_cait(classes=10, drop_path_rate=0.2)
    model.compile(optimizer=adamw(model, 1e-3, use_ema=True), loss="categorical_crossentropy")
    return model


@pytest.mark.large
def test_a_backup_restores_weights_optimizer_random_state_and_best(tiny_cait, tmp_path):
    model = compiled(tiny_cait)
    images = np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    labels = np.eye(10)[np.arange(8)]
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), save_best_only=True)
    checkpoint.best = 0.25
    backup = ResumableBackup(tmp_path / "backup", save_freq=3, checkpoints=[checkpoint])
    saved = []

    def snapshot(epoch, logs):  # right after the backup of the last epoch, before fit's EMA swap
        saved[:] = [np.array(v) for v in model.variables + model.optimizer.variables]

    model.fit(images, labels, batch_size=4, epochs=2, verbose=0,
              callbacks=[backup, keras.callbacks.LambdaCallback(on_epoch_end=snapshot)])
    assert backup.step == 4

    other = compiled(tiny_cait)
    other_checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "x.keras"))
    restored = ResumableBackup(tmp_path / "backup", checkpoints=[other_checkpoint])
    assert restored.restore(other) == 4
    state = [np.array(v) for v in other.variables + other.optimizer.variables]
    assert len(state) == len(saved)
    for got, want in zip(state, saved):  # weights, seed states, Adam moments, EMA, step
        np.testing.assert_array_equal(got, want)
    assert other_checkpoint.best == 0.25


def backed_up_then_changed(tiny_cait, directory):
    """A model backed up at step 1, then changed at step 2: (model, its backup, weights at step 1)."""
    model = compiled(tiny_cait)
    backup = ResumableBackup(directory, save_freq=1)
    backup.set_model(model)
    backup.step = 1
    backup.save()
    first = [np.array(v) for v in model.weights]
    for variable in model.weights:
        variable.assign(variable + 1.0)
    backup.step = 2
    return model, backup, first


def test_a_kill_while_writing_a_backup_keeps_the_previous_one(tiny_cait, tmp_path, monkeypatch):
    model, backup, first = backed_up_then_changed(tiny_cait, tmp_path)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies in the middle of the write

    monkeypatch.setattr(model, "save_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        backup.save()
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 1
    assert ResumableBackup(tmp_path).restore(model) == 1
    for got, want in zip(model.weights, first):
        np.testing.assert_array_equal(np.array(got), want)


def finetune(model_path, data_dir, output_dir, *changes):
    command = [
        sys.executable, "-m", "keras_cait.cli", "finetune",
        "--model", model_path, "--data", data_dir, "--output-dir", output_dir,
        "--image-size", "32", "--batch-size", "8", "--precision", "float32",
        "--head-epochs", "0", "--epochs", "2", "--lr", "3e-4", "--backup-every", "2",
        "--mixup", "0.8", "--cutmix", "1.0", "--model-ema", "--model-ema-decay", "0.9",
        "--deterministic", "--seed", "3", "--verbose", "0", *changes,
    ]
    env = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


# === The run record ===


def test_a_record_keyed_by_flags_is_read_by_argument_and_none_is_one_value(tmp_path):
    """run.json was keyed by the command line's flags, and weights=None (Python) and --weights none
    (the command) were two values: a run started from one could not be resumed from the other."""
    settings = {"data": "/photos", "weights": None, "val_fraction": 0.1, "classes": ["a", "b"]}
    flags = {"--data": "/photos", "--weights": "none", "--val-fraction": 0.1, "classes": ["a", "b"]}
    (tmp_path / "run.json").write_text(json.dumps({"command": "finetune", "settings": flags, "finished": ["head"]}))
    for weights in (None, "none", "None"):  # every spelling of no weights resumes it
        record = RunRecord.open(str(tmp_path), "finetune", {**settings, "weights": weights}, arguments=settings)
        assert record.finished("head") and record.settings == settings
    with pytest.raises(BackupError) as refused:
        RunRecord.open(str(tmp_path), "finetune", {**settings, "weights": "imagenet"}, arguments=settings)
    assert "(weights None then, imagenet now)" in str(refused.value)
    assert "(--weights None then, imagenet now)" in refused.value.render(flag_name)
    assert "give another output_dir," in str(refused.value)
    assert "give another --output-dir," in refused.value.render(flag_name)
    record.finish("full")  # written back keyed by argument
    assert json.loads((tmp_path / "run.json").read_text())["settings"] == settings


def test_a_rerun_given_another_image_source_is_refused_and_a_legacy_record_still_resumes(digits, tmp_path):
    """Every ImageSource was recorded as "<ImageSource>", so a rerun given another one resumed the run."""
    from keras_cait.training import resume, run_data, sources

    digits(tmp_path / "first", per_class=2, classes=range(3))
    digits(tmp_path / "second", per_class=3, classes=range(3))
    first, second = (sources.image_folder(tmp_path / name) for name in ("first", "second"))
    run = str(tmp_path / "run")
    os.makedirs(run)
    given = run_data.given(first)
    assert given == f"<ImageSource of 6 images, 3 classes (0, 1, 2) in {tmp_path / 'first'}>"
    RunRecord.open(run, "finetune", {"data": given}, arguments={"data"}).finish("head")
    assert RunRecord.open(run, "finetune", {"data": run_data.given(sources.image_folder(tmp_path / "first"))},
                          arguments={"data"}).finished("head")
    with pytest.raises(BackupError) as refused:
        RunRecord.open(run, "finetune", {"data": run_data.given(second)}, arguments={"data"})
    assert f"(data <ImageSource of 6 images, 3 classes (0, 1, 2) in {tmp_path / 'first'}> then, " \
           f"<ImageSource of 9 images, 3 classes (0, 1, 2) in {tmp_path / 'second'}> now)" in str(refused.value)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    record["settings"]["data"] = resume.LEGACY_SOURCE  # as run.json recorded any source before
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    assert RunRecord.open(run, "finetune", {"data": run_data.given(second)}, arguments={"data"}).finished("head")


def test_a_folder_of_another_command_is_refused_in_python_words(tmp_path):
    RunRecord.open(str(tmp_path), "train", {"data": "a"}).finish("train")
    with pytest.raises(BackupError) as refused:
        RunRecord.open(str(tmp_path), "finetune", {"data": "a"})
    assert str(refused.value) == f"{tmp_path} holds a train run; give this finetune run another output_dir."
    assert refused.value.render(flag_name).endswith("give this finetune run another --output-dir.")


@pytest.mark.large
def test_a_run_started_from_python_resumes_from_the_command_and_the_other_way_round(digits, tmp_path, capsys):
    """weights=None from Python, --weights none from the command: one run. A folder written before,
    keyed by flags, resumes too."""
    from keras_cait.cli import main
    from keras_cait.training import RECIPES, run

    data = digits(tmp_path / "digits", per_class=2, size=32, classes=range(3))
    recipe = RECIPES["transfer"].replace(head_epochs=1, epochs=0, batch_size=6)
    python = dict(weights=None, image_size=32, val_fraction=0, recipe=recipe, precision="float32", verbose=0)
    command = ["--model", "XXS24", "--weights", "none", "--data", data, "--image-size", "32", "--val-fraction", "0",
               "--recipe", "transfer", "--head-epochs", "1", "--epochs", "0", "--batch-size", "6",
               "--precision", "float32", "--verbose", "0"]

    started = str(tmp_path / "from_python")
    run.finetune("XXS24", data, started, **python)
    record = json.loads(open(os.path.join(started, "run.json")).read())
    assert record["settings"]["weights"] is None and "--weights" not in record["settings"]
    flags = {(key if key in ("classes", "global batch size") else "--" + key.replace("_", "-")): value
             for key, value in record["settings"].items()}
    with open(os.path.join(started, "run.json"), "w") as file:  # as a run of the previous version wrote it
        json.dump({**record, "settings": {**flags, "--weights": "none"}}, file)
    capsys.readouterr()
    main(["finetune", *command, "--output-dir", started])
    assert "finished earlier with the same settings: nothing to train" in capsys.readouterr().out

    started = str(tmp_path / "from_the_command")
    main(["finetune", *command, "--output-dir", started])
    assert "Next:\n  keras-cait predict IMAGE... --model " in capsys.readouterr().out  # the command's
    again = run.finetune("XXS24", data, started, **python)
    assert again.summary["finished_earlier"]
    assert "keras-cait" not in capsys.readouterr().out


def kill_mid_epoch(victim, output_dir, steps_per_epoch=STEPS_PER_EPOCH):
    """SIGKILLs the finetune `victim` writing `output_dir` once its whole-network stage has backed up
    a step inside an epoch; returns that step."""
    pointer = os.path.join(output_dir, "backup", "full", "latest.json")
    deadline = time.time() + 300
    while victim.poll() is None and time.time() < deadline:
        if os.path.exists(pointer) and 0 < json.load(open(pointer))["step"] % steps_per_epoch:
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert victim.wait() == -signal.SIGKILL, "the run ended before a mid-epoch backup:\n" + victim.stdout.read()
    killed_at = json.load(open(pointer))["step"]
    assert 0 < killed_at % steps_per_epoch, "the kill must leave an epoch half done"
    assert not os.path.exists(os.path.join(output_dir, "final.keras"))
    return killed_at


def final_weights(output_dir):
    model = keras.models.load_model(os.path.join(output_dir, "final.keras"))
    return [np.array(w) for w in model.weights]


@pytest.mark.large
def test_a_finetune_killed_mid_epoch_resumes_to_the_same_weights(tiny_cait, digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=10)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10, drop_path_rate=0.2).save(model_path)
    uninterrupted, interrupted = str(tmp_path / "uninterrupted"), str(tmp_path / "interrupted")

    reference = finetune(model_path, data_dir, uninterrupted)
    kill_mid_epoch(finetune(model_path, data_dir, interrupted), interrupted)

    resumed = finetune(model_path, data_dir, interrupted)
    for process in (reference, resumed):
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
    assert not os.path.exists(os.path.join(interrupted, "backup", "full"))  # removed when done
    got, want = final_weights(interrupted), final_weights(uninterrupted)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got[0], np.array(keras.models.load_model(model_path).weights[0]))


# === A damaged backup, a changed plan, a run already done ===


def two_backups(tiny_cait, directory):
    """Backups at steps 1 and 2 of a compiled model; returns (model, weights at step 1)."""
    model, backup, first = backed_up_then_changed(tiny_cait, directory)
    backup.save()
    return model, first


def truncate(path):
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def test_each_save_keeps_the_backup_before_it_and_no_older(tiny_cait, tmp_path):
    model = compiled(tiny_cait)
    backup = ResumableBackup(tmp_path, save_freq=1)
    backup.set_model(model)
    for step in (1, 2, 3):
        backup.step = step
        backup.save()
    assert sorted(os.listdir(tmp_path)) == ["latest.json", "step-2", "step-3"]


DAMAGES = {
    "truncated_h5": lambda d: truncate(d / "step-2" / "state.weights.h5"),
    "truncated_npz": lambda d: truncate(d / "step-2" / "random.npz"),
    "bad_progress_json": lambda d: (d / "step-2" / "progress.json").write_text("{"),
    "missing_folder": lambda d: shutil.rmtree(d / "step-2"),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_latest_backup_falls_back_to_the_previous_one_and_says_so(
    tiny_cait, tmp_path, damage
):
    model, first = two_backups(tiny_cait, tmp_path)
    damage(tmp_path)

    with pytest.warns(UserWarning, match=r"Resuming from the backup step-1 \(step 1\) .*step-2"):
        assert ResumableBackup(tmp_path).restore(model) == 1

    for got, want in zip(model.weights, first):
        np.testing.assert_array_equal(np.array(got), want)


def test_an_unreadable_latest_json_resumes_from_the_newest_complete_folder(tiny_cait, tmp_path):
    model, first = two_backups(tiny_cait, tmp_path)
    (tmp_path / "latest.json").write_text("not json")

    with pytest.warns(UserWarning, match=r"step-2 \(step 2\).*latest.json is unreadable"):
        assert ResumableBackup(tmp_path).restore(model) == 2


def test_no_usable_backup_names_the_folder_and_how_to_start_over(tiny_cait, tmp_path):
    model, _ = two_backups(tiny_cait, tmp_path)
    truncate(tmp_path / "step-2" / "state.weights.h5")
    shutil.rmtree(tmp_path / "step-1")

    with pytest.raises(ValueError, match=r"No usable backup in .* step-2 is unreadable") as error:
        ResumableBackup(tmp_path).restore(model)

    assert f"rm -r {tmp_path}" in str(error.value)


def test_a_changed_batch_size_is_refused(tiny_cait, tmp_path):
    model = compiled(tiny_cait)
    backup = ResumableBackup(tmp_path)
    backup.set_model(model)
    backup.plan = {"epochs": 3, "steps per epoch": 10, "global batch size": 64}
    backup.step = 5
    backup.save()

    rerun = ResumableBackup(tmp_path)
    rerun.plan = {"epochs": 3, "steps per epoch": 20, "global batch size": 32}
    with pytest.raises(ValueError, match=r"another plan \(steps per epoch 10 then, 20 now; global "
                                         r"batch size 64 then, 32 now\).*rm -r"):
        rerun.restore(model)


def test_fewer_epochs_than_the_backup_has_done_are_refused(tiny_cait, tmp_path):
    model = compiled(tiny_cait)
    backup = ResumableBackup(tmp_path)
    backup.set_model(model)
    backup.plan = {"epochs": 10, "steps per epoch": 4}
    backup.step = 5 * 4 + 1
    backup.save()

    def no_data(step):
        raise AssertionError("nothing may be trained")

    with pytest.raises(ValueError, match=r"another plan \(epochs 10 then, 3 now\)"):
        fit(model, no_data, epochs=3, steps_per_epoch=4, backup=ResumableBackup(tmp_path))


def test_a_run_whose_backup_is_at_its_end_finishes_without_training(tiny_cait, tmp_path):
    model = compiled(tiny_cait)
    backup = ResumableBackup(tmp_path / "backup")
    backup.set_model(model)
    backup.plan = {"epochs": 2, "steps per epoch": 4}
    backup.step = 2 * 4
    backup.save()
    saved = [np.array(v) for v in model.weights]
    for variable in model.weights:
        variable.assign(variable * 0.0)

    def no_data(step):
        raise AssertionError("nothing may be trained")

    history = fit(model, no_data, epochs=2, steps_per_epoch=4,
                  backup=ResumableBackup(tmp_path / "backup"))

    assert history is None
    assert not os.path.exists(tmp_path / "backup")
    for got, want in zip(model.weights, saved):
        np.testing.assert_array_equal(np.array(got), want)


@pytest.mark.large
def test_a_rerun_with_another_batch_size_is_refused_naming_it(tiny_cait, digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=10)
    model_path = str(tmp_path / "pretrained.keras")
    model = tiny_cait(classes=10)
    model.save(model_path)
    backup = ResumableBackup(tmp_path / "run" / "backup" / "full")
    backup.set_model(model)
    backup.plan = {"epochs": 2, "steps per epoch": STEPS_PER_EPOCH, "global batch size": 8}
    backup.step = 3
    backup.save()

    rerun = finetune(model_path, data_dir, str(tmp_path / "run"), "--batch-size", "4")
    output, _ = rerun.communicate(timeout=300)

    assert rerun.returncode != 0
    assert (f"another plan (steps per epoch {STEPS_PER_EPOCH} then, {90 // 4} now; "
            "global batch size 8 then, 4 now)") in output
    assert json.loads((tmp_path / "run" / "backup" / "full" / "latest.json").read_text())["step"] == 3


@pytest.mark.large
def test_a_rerun_says_what_it_skips_and_refuses_a_changed_setting_without_a_backup(tiny_cait, digits, tmp_path):
    data = digits(tmp_path / "a", per_class=6, classes=range(3))
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)
    run = tmp_path / "run"
    first = finetune(model_path, data, str(run), "--head-epochs", "1", "--epochs", "1")
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    assert not (run / "backup").exists()  # nothing left to resume from
    files = {name: (run / name).read_bytes() for name in ("best.keras", "final.keras", "head.weights.h5")}

    # The same command again: nothing trained, nothing written, and it says so.
    again = finetune(model_path, data, str(run), "--head-epochs", "1", "--epochs", "1")
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0, output
    assert "finished earlier with the same settings: nothing to train" in output
    assert {name: (run / name).read_bytes() for name in files} == files

    # A changed setting, typed equal to nothing the run had, with no backup to compare against.
    changed = finetune(model_path, data, str(run), "--head-epochs", "1", "--epochs", "3", "--lr", "1e-4")
    output, _ = changed.communicate(timeout=300)
    assert changed.returncode == 1
    assert "--epochs 1 then, 3 now" in output and "--lr 0.0003 then, 0.0001 now" in output
    assert {name: (run / name).read_bytes() for name in files} == files

    # Killed after its head stage: the rerun announces the head it does not train again.
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "finished": ["head"]}))
    resumed = finetune(model_path, data, str(run), "--head-epochs", "1", "--epochs", "1")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert f"Stage 1 done in an earlier run: the head is loaded from {run / 'head.weights.h5'}" in output
    assert (run / "head.weights.h5").read_bytes() == files["head.weights.h5"]
    assert json.loads((run / "run.json").read_text())["finished"] == ["head", "full"]


@pytest.mark.large
def test_a_finetune_rerun_with_other_data_classes_or_head_epochs_is_refused(tiny_cait, digits, tmp_path):
    first_data = digits(tmp_path / "a", per_class=10)
    other_data = digits(tmp_path / "b", per_class=10, classes=range(3))
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)
    run = tmp_path / "run"
    first = finetune(model_path, first_data, str(run), "--head-epochs", "1", "--epochs", "0")
    assert first.wait(timeout=300) == 0, first.communicate()[0]
    head, final = (run / "head.weights.h5").read_bytes(), (run / "final.keras").read_bytes()

    rerun = finetune(model_path, other_data, str(run), "--head-epochs", "3", "--epochs", "0")
    output, _ = rerun.communicate(timeout=300)

    assert rerun.returncode != 0
    assert f"{run} holds a run with other settings (" in output
    for change in (f"--data {first_data} then, {other_data} now", "--head-epochs 1 then, 3 now",
                   "classes [0, 1, 2 and 7 more] then, [0, 1, 2] now"):
        assert change in output
    assert f"rm -r {run}" in output
    assert (run / "head.weights.h5").read_bytes() == head
    assert (run / "final.keras").read_bytes() == final


@pytest.mark.large
def test_fit_traces_the_training_step_once(tiny_cait):
    """The optimizer's variables exist before the first step: TensorFlow traces a step that creates
    variables twice, and the trace is most of a CPU run's time to its first step."""
    import tensorflow as tf

    model = compiled(tiny_cait)
    traces = []
    train_step = model.train_step
    model.train_step = lambda data: traces.append(1) or train_step(data)
    images = np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    stream = tf.data.Dataset.from_tensor_slices((images, np.eye(10, dtype="float32")[:8])).batch(4).repeat()
    fit(model, lambda step: stream, epochs=2, steps_per_epoch=2, verbose=0)
    assert len(traces) == 1
    assert model.optimizer.iterations.numpy() == 4


def test_a_resumed_fit_continues_at_the_backed_up_optimizer_step(tiny_cait, tmp_path):
    """The quick form of the large kill-and-resume tests: the first step after a resume is the
    optimizer's step of the backup (its schedule and Adam's bias correction go on from there)."""
    keras.utils.set_random_seed(0)
    model = tiny_cait(classes=4)
    model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy", jit_compile=False)
    backup = ResumableBackup(tmp_path / "backup")
    backup.set_model(model)
    backup.plan = {"epochs": 1, "steps per epoch": 8}
    fit_step = backup.step = 5
    build_optimizer(model)
    model.optimizer.iterations.assign(fit_step)
    backup.save()

    resumed = tiny_cait(classes=4)
    resumed.compile(optimizer=adamw(resumed, 1e-3), loss="categorical_crossentropy", jit_compile=False)
    asked, seen = [], []
    images = np.random.default_rng(0).uniform(0, 255, (6, 32, 32, 3)).astype("float32")
    labels = np.eye(4, dtype="float32")[np.arange(6) % 4]

    def stream_from(step):
        import tensorflow as tf

        asked.append(step)
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(2)

    step_seen = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: seen.append(int(resumed.optimizer.iterations)))
    fit(resumed, stream_from, epochs=1, steps_per_epoch=8, backup=ResumableBackup(tmp_path / "backup"),
        callbacks=[step_seen], verbose=0)

    assert asked == [fit_step], "the stream starts at the backup's step"
    assert seen == [5, 6, 7], "the optimizer goes on from the backup's step, not from 0"


def _stream_from(step):
    import tensorflow as tf

    images = np.zeros((4, 32, 32, 3), "float32")
    return tf.data.Dataset.from_tensor_slices((images, np.eye(4, dtype="float32"))).batch(2).repeat()


@pytest.mark.parametrize("change, argument, line", [
    ({"model": "uncompiled"}, "model", r"^model=<CaiTModel \w+>: is not compiled; call model\.compile\("),
    ({"stream_from": "dataset"}, "stream_from",
     r"^stream_from=<\w+Dataset>: must be a function of the global step, not a \w+Dataset; e\.g\. lambda step:"),
    ({"steps_per_epoch": 0}, "steps_per_epoch", r"^steps_per_epoch=0: must be a positive integer; e\.g\."),
    ({"epochs": "2"}, "epochs", r"^epochs='2': must be a positive integer, the epochs of the whole run, not str;"),
    ({"backup": "run/backup"}, "backup", r"^backup='run/backup': must be a ResumableBackup or None, not a str;"),
])
def test_fit_refuses_each_argument_naming_it_before_anything_runs(tiny_cait, tmp_path, change, argument, line):
    """They used to fail as an AttributeError on `optimizer`, a `'Dataset' object is not callable`, a
    ZeroDivisionError, a TypeError on `<` and an AttributeError on `plan`."""
    from keras_cait.errors import ArgumentError

    model = tiny_cait(classes=4)
    if change.get("model") != "uncompiled":
        model.compile(optimizer="adam", loss="categorical_crossentropy")
    arguments = {"stream_from": _stream_from, "epochs": 1, "steps_per_epoch": 2, "verbose": 0,
                 **{key: value for key, value in change.items() if key != "model"}}
    if arguments["stream_from"] == "dataset":
        arguments["stream_from"] = _stream_from(0)
    before = [np.array(weight) for weight in model.weights]
    with pytest.raises(ArgumentError, match=line) as caught:
        fit(model, **arguments)
    assert caught.value.argument == argument and caught.value.usage
    assert all(np.array_equal(a, np.array(b)) for a, b in zip(before, model.weights)), "nothing trained"


def test_a_backup_folder_that_is_none_or_a_file_is_refused_when_made(tmp_path):
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"^backup_dir=None: must be the path of a folder for the backups; "
                                            r"e\.g\. backup_dir='run/backup'$"):
        ResumableBackup(None)
    (tmp_path / "notes").write_text("x")
    with pytest.raises(ArgumentError, match=r"^backup_dir='.*notes': is a file, not a folder; give a folder"):
        ResumableBackup(tmp_path / "notes")
    assert (tmp_path / "notes").read_text() == "x"


def test_a_checkpoint_of_a_validation_metric_without_validation_data_is_refused(tiny_cait, tmp_path):
    """Refused by `fit` before training (it was a KeyError after the first epoch); in a plain
    `model.fit`, the checkpoint's error says that fit was given no validation data."""
    from keras_cait.errors import ArgumentError
    from keras_cait.training.callbacks import BestModelCheckpoint

    model = tiny_cait(classes=4)
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    checkpoint = BestModelCheckpoint(tmp_path / "best.keras")
    with pytest.raises(ArgumentError, match=r"^validation_data=None: is None, but BestModelCheckpoint monitors "
                                            r"'val_accuracy', .*; give validation_data, or monitor 'accuracy'$"):
        fit(model, _stream_from, epochs=1, steps_per_epoch=2, callbacks=[checkpoint], verbose=0)
    assert model.optimizer.iterations.numpy() == 0
    # Keras' own callbacks of a validation metric are Keras' to judge: it warns and trains on.
    stopping = keras.callbacks.EarlyStopping(monitor="val_loss")
    with pytest.warns(UserWarning, match="val_loss"):
        fit(model, _stream_from, epochs=1, steps_per_epoch=2, callbacks=[stopping], verbose=0)
    assert model.optimizer.iterations.numpy() == 2
    with pytest.raises(KeyError, match=r"monitor='val_accuracy': the epoch's logs lack it \(they have accuracy, "
                                       r"loss\): fit was given no validation_data; give fit validation_data"):
        model.fit(_stream_from(0), epochs=1, steps_per_epoch=2, callbacks=[checkpoint], verbose=0)
    assert not os.listdir(tmp_path)
