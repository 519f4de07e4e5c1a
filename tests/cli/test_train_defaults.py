"""`keras-cait train` with only its required flags, as a user first runs it: S24 from random weights at
224, the deit recipe's 400 epochs. Too long to finish on a CPU, so the test does what such a user does:
stops it with Ctrl-C after its first backups, and runs the same command again, which resumes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import write_digits

pytestmark = pytest.mark.large

KERAS_CAIT = shutil.which("keras-cait", path=os.path.dirname(sys.executable))
INTERRUPTED = "keras-cait train: interrupted; run the same command again (train and finetune resume from their last backup)"


def _train_until_backed_up(folder, after_step):
    """Runs `keras-cait train --data photos --output-dir run` in `folder`, Ctrl-C once a backup past
    `after_step` exists; returns (status, stdout, stderr, the step of the last backup once it stopped)."""
    pointer = folder / "run" / "backup" / "train" / "latest.json"
    process = subprocess.Popen([KERAS_CAIT, "train", "--data", "photos", "--output-dir", "run"], cwd=folder,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        deadline, step = time.time() + 900, None
        while process.poll() is None and time.time() < deadline:
            if pointer.exists():
                step = json.loads(pointer.read_text())["step"]
                if step > after_step:
                    process.send_signal(signal.SIGINT)
                    break
            time.sleep(0.2)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert step is not None and step > after_step, out[-2000:] + err[-3000:]
    return process.returncode, out, err, json.loads(pointer.read_text())["step"]


def test_train_with_its_defaults_starts_the_s24_deit_run_and_resumes_it_after_ctrl_c(tmp_path):
    import keras_cait
    from keras_cait.training.recipe import RECIPES
    from keras_cait.training.run import default_precision

    write_digits(tmp_path / "photos", per_class=10, size=48, classes=[1, 7])
    epochs = RECIPES["deit"].epochs
    status, out, err, backed_up = _train_until_backed_up(tmp_path, after_step=0)
    assert status == 1 and err.rstrip("\n").splitlines()[-1] == INTERRUPTED, out[-2000:] + err[-3000:]
    assert "Traceback" not in err
    precision, _ = default_precision()
    assert f"Precision {precision} (" in out
    assert "more than the 20 training images fill: batch 20 instead" in out
    # What it trains, before the first epoch: S24 with a 2-class head (timm's 1000-class one has 46.9M).
    parameters = keras_cait.CaiT_S24(weights=None, classes=2).count_params()
    assert f"Training cait_s24 ({parameters / 1e6:.1f}M parameters) from random weights at 224x224 on 20 images " \
           f"of 2 classes, {epochs} epochs." in out, out[:2000]
    assert "1 replica (--strategy none), global batch 20 (20 per replica), 1 step per epoch, " in out
    assert f"Epoch 1/{epochs}" in out
    # The one line of where it stopped: a backup at the end of each epoch (1 step each), and the same
    # command again resumes.
    assert f"of {epochs} (epoch " in out and "where the same call again resumes it." in out, out[-2000:]

    record = json.loads((tmp_path / "run" / "run.json").read_text())
    settings = record["settings"]
    assert settings["model"] == "S24" and settings["image_size"] == 224 and settings["teacher"] is None
    recipe = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert recipe["epochs"] == epochs == 400 and recipe["sched"] == RECIPES["deit"].sched
    assert not (tmp_path / "run" / "final.keras").exists()

    status, out, err, again = _train_until_backed_up(tmp_path, after_step=backed_up)
    assert status == 1 and err.rstrip("\n").splitlines()[-1] == INTERRUPTED, out[-2000:] + err[-3000:]
    assert f"Resuming train from the backup at step {backed_up} of {epochs}" in out, out[-2000:]
    assert f"Epoch {backed_up + 1}/{epochs}" in out and f"Epoch 1/{epochs}" not in out
    assert again > backed_up
