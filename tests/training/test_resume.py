"""A killed run resumes at its last backup and ends exactly where an uninterrupted one ends."""

import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_cait.training import adamw
from keras_cait.training.resume import ResumableBackup

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS_PER_EPOCH = 90 // 8  # 100 digits, 10% held out, batches of 8


def compiled(tiny_cait):
    keras.utils.set_random_seed(0)
    model = tiny_cait(classes=10, drop_path_rate=0.2)
    model.compile(optimizer=adamw(model, 1e-3, use_ema=True), loss="categorical_crossentropy")
    return model


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


def test_a_kill_while_writing_a_backup_keeps_the_previous_one(tiny_cait, tmp_path, monkeypatch):
    model = compiled(tiny_cait)
    backup = ResumableBackup(tmp_path, save_freq=1)
    backup.set_model(model)
    backup.step = 1
    backup.save()
    first = [np.array(v) for v in model.weights]

    for variable in model.weights:
        variable.assign(variable + 1.0)
    backup.step = 2

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies in the middle of the write

    monkeypatch.setattr(model, "save_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        backup.save()
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 1
    assert ResumableBackup(tmp_path).restore(model) == 1
    for got, want in zip(model.weights, first):
        np.testing.assert_array_equal(np.array(got), want)


def finetune(model_path, data_dir, output_dir):
    command = [
        sys.executable, os.path.join(REPOSITORY, "scripts", "finetune.py"),
        "--model", model_path, "--data", data_dir, "--output-dir", output_dir,
        "--image-size", "32", "--batch-size", "8", "--precision", "float32",
        "--head-epochs", "0", "--epochs", "2", "--lr", "3e-4", "--backup-every", "2",
        "--mixup", "0.8", "--cutmix", "1.0", "--model-ema", "--model-ema-decay", "0.9",
        "--deterministic", "--seed", "3", "--verbose", "0",
    ]
    env = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def final_weights(output_dir):
    model = keras.models.load_model(os.path.join(output_dir, "final.keras"))
    return [np.array(w) for w in model.weights]


def test_a_finetune_killed_mid_epoch_resumes_to_the_same_weights(tiny_cait, digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=10)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10, drop_path_rate=0.2).save(model_path)
    uninterrupted, interrupted = str(tmp_path / "uninterrupted"), str(tmp_path / "interrupted")

    reference = finetune(model_path, data_dir, uninterrupted)
    victim = finetune(model_path, data_dir, interrupted)
    pointer = os.path.join(interrupted, "backup", "full", "latest.json")
    deadline = time.time() + 300
    while victim.poll() is None and time.time() < deadline:
        if os.path.exists(pointer) and 0 < json.load(open(pointer))["step"] % STEPS_PER_EPOCH:
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert victim.wait() == -signal.SIGKILL, "the run ended before a mid-epoch backup:\n" + \
        victim.stdout.read()
    killed_at = json.load(open(pointer))["step"]
    assert 0 < killed_at % STEPS_PER_EPOCH, "the kill must leave an epoch half done"
    assert not os.path.exists(os.path.join(interrupted, "final.keras"))

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
