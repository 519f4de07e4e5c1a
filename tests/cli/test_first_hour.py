"""A new user's first `keras-cait finetune`: a small folder, only the flags that name it, no false start."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import write_digits

pytestmark = pytest.mark.large

KERAS_CAIT = shutil.which("keras-cait", path=os.path.dirname(sys.executable))


def test_finetune_of_a_folder_of_20_images_with_only_its_required_flags_ends_with_a_model(tmp_path):
    """The defaults a user meets first: XXS24 at its checkpoint's side, the precision of this machine,
    the recipe's batch lowered to what 18 training images fill (said), 2 + 10 epochs."""
    from keras_cait.training.run import default_precision

    write_digits(tmp_path / "photos", per_class=10, size=40, classes=[3, 8])
    done = subprocess.run([KERAS_CAIT, "finetune", "--data", "photos", "--output-dir", "runs/first",
                           "--weights", "none", "--verbose", "0"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    precision, _ = default_precision()
    assert f"Precision {precision} (" in done.stdout
    assert "Batch 64 per replica is more than the 18 training images fill: batch 18 instead" in done.stdout
    run = tmp_path / "runs" / "first"
    assert {"best.keras", "final.keras", "head.weights.h5", "run.json", "recipe.json"} <= set(os.listdir(run))
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["--precision"] == precision and settings["global batch size"] == 18
    assert json.loads((run / "recipe.json").read_text())["batch_size"] == 18
