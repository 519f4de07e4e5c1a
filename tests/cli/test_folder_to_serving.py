"""A folder of images to TF Serving with the console command alone, as README's training section shows.

train (a tiny CaiT from scratch, the model finetune starts from) -> finetune on a
folder of named classes -> evaluate -> predict -> export -> the SavedModel
answered by TensorFlow's own loader and by README's REST request body. Every
step is the `keras-cait` console script in its own process; the class names come
from the folder and nowhere else.
"""

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.conftest import TINY_CAIT, write_digits
from tests.export import tf_serving_rest

pytestmark = pytest.mark.large

KERAS_CAIT = shutil.which("keras-cait", path=os.path.dirname(sys.executable))
# Folder names whose sorted order is not the order of the digits they hold.
CLASSES = {"7": "zebra", "3": "ant", "5": "moth"}


def console(*argv, cwd):
    """`keras-cait ARGV` as a user types it: its stdout; a failure shows its stderr."""
    done = subprocess.run([KERAS_CAIT, *argv], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, f"keras-cait {' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The folder, and the files of train and finetune run in it."""
    assert KERAS_CAIT, f"the keras-cait console script is not installed beside {sys.executable}"
    work = tmp_path_factory.mktemp("user")
    write_digits(work / "digits", per_class=16, size=32, classes=[int(digit) for digit in CLASSES])
    for digit, name in CLASSES.items():
        os.rename(work / "digits" / digit, work / "digits" / name)
    console("train", "--model", json.dumps(TINY_CAIT), "--data", "digits", "--image-size", "32",
               "--output-dir", "runs/scratch", "--epochs", "1", "--warmup-epochs", "0",
               "--batch-size", "8", "--verbose", "0", cwd=work)
    # mixed_float16, a GPU's default precision: the export must serve it from its float32 copy.
    finetune = console("finetune", "--model", "runs/scratch/final.keras", "--data", "digits",
                          "--output-dir", "runs/ft", "--head-epochs", "1", "--epochs", "1",
                          "--batch-size", "8", "--precision", "mixed_float16", cwd=work)
    return work, finetune


def test_finetune_into_a_pipe_writes_a_line_per_epoch_without_the_bar_s_redraws(run):
    _, output = run
    assert "\x1b[" not in output and "\r" not in output, output
    epochs = [line for line in output.splitlines() if re.match(r"\d+/\d+ - \d+s - .*loss: ", line)]
    assert len(epochs) == 2, output  # the head's epoch and the whole network's


def test_finetune_ends_with_the_files_the_best_accuracy_and_the_next_commands(run):
    work, output = run
    summary = output[output.index("Done. In runs/ft:"):]
    for name in ("best.keras", "final.keras", "head.weights.h5", "run.json", "logs"):
        assert re.search(rf"^  {re.escape(name)} ", summary, re.M), summary
    best = json.loads((work / "runs" / "ft" / "best.json").read_text())
    assert f"Best validation accuracy: {best['value']:.2%} at epoch {best['epoch']}" in summary
    assert "keras-cait predict IMAGE... --model runs/ft/best.keras" in summary
    assert "keras-cait export serving/ft/1 --model runs/ft/best.keras" in summary


def test_the_model_file_carries_the_folder_s_class_names(run):
    work, _ = run
    import keras_cait  # noqa: F401  CaiT's classes for load_model

    for name in ("best.keras", "final.keras"):
        assert keras.models.load_model(work / "runs" / "ft" / name).class_names == ("ant", "moth", "zebra")
    saved = json.loads((work / "runs" / "ft" / "run.json").read_text())
    assert saved["settings"]["classes"] == ["ant", "moth", "zebra"]
    assert saved["finished"] == ["head", "full"]


def test_evaluate_predict_export_and_serve_the_fine_tuned_model(run):
    work, output = run
    import tensorflow as tf

    import keras_cait  # noqa: F401

    # Into a pipe, the report alone (`keras-cait evaluate ... | jq .top1`).
    report = json.loads(console("evaluate", "--model", "runs/ft/best.keras", "--data", "digits", cwd=work))
    assert report["images"] == 48 and 0 <= report["top1"] <= 1

    images = [os.path.join("digits", name, sorted(os.listdir(work / "digits" / name))[0])
              for name in ("ant", "moth", "zebra")]
    printed = console("predict", *images, "--model", "runs/ft/best.keras", cwd=work)
    tops = {}
    for block in re.split(r"^(?=\S)", printed, flags=re.M)[1:]:
        path, *rows = block.strip().splitlines()
        names = [row.split(maxsplit=1)[1] for row in rows]
        assert sorted(names) == ["ant", "moth", "zebra"], printed  # all 3 of 3 classes, by name
        tops[path] = names[0]
    assert sorted(tops) == sorted(images)

    # The export command the summary printed, as it printed it.
    export = next(line for line in output.splitlines() if line.strip().startswith("keras-cait export"))
    argv = shlex.split(export.split("(")[0])[1:]
    assert console(*argv, cwd=work).strip() == "wrote serving/ft/1"

    loaded = tf.saved_model.load(str(work / "serving" / "ft" / "1"))
    model = keras.models.load_model(work / "runs" / "ft" / "best.keras")
    pixels = np.stack([pixels_of(work / path) for path in images])
    served = loaded.signatures["serving_default"](images=tf.constant(pixels))
    # Trained in mixed_float16, it is served from its float32 copy (the folded graph):
    # equal to that copy's predictions, and to the half-precision model's up to float16's rounding.
    from keras_cait.training.transfer import with_dtype_policy

    np.testing.assert_allclose(served["probabilities"].numpy(), with_dtype_policy(model, "float32").predict(pixels, verbose=0),
                               atol=1e-5)
    np.testing.assert_allclose(served["probabilities"].numpy(), model.predict(pixels, verbose=0), atol=2e-3)
    classes = [[name.decode() for name in row] for row in served["top_k_classes"].numpy()]
    assert all(sorted(row) == ["ant", "moth", "zebra"] for row in classes)

    # README's REST body for a file: {"signature_name": "serving_bytes", "instances": [{"b64": ...}]}
    body = {"signature_name": "serving_bytes",
            "instances": [{"b64": base64.b64encode((work / path).read_bytes()).decode()} for path in images]}
    status, response = tf_serving_rest.predict(loaded.signatures, json.dumps(body))
    assert status == 200, response
    answers = json.loads(response)["predictions"]
    assert [answer["top_k_classes"][0] for answer in answers] == [tops[path] for path in images]


def pixels_of(path):
    from keras_cait.preprocessing import load_image

    return load_image(str(path), 32)
