"""Every training entry point × every precision, with DeiT's full augmentation at its defaults.

Each cell trains a tiny CaiT on a folder of 8 small PNGs in two classes as a user would:
the console script `keras-cait` (train, finetune, train with a teacher) and the `scripts/`
wrappers run in a fresh process with their defaults (XLA on, RandAugment 9, random erasing 0.25,
mixup 0.8 / cutmix 1.0, repeated augmentation 3, EMA); only the sizes are made small. A cell
passes when the process exits 0 after at least two training steps, writes its files, reports
finite losses, and the saved model's blocks compute in the precision asked for. The Python cell runs `training.stream.training_stream` into `model.fit`.
Under the JAX backend (the GPU path), where JAX is installed, the console's train and the
Python stream run in every precision too.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import TINY_CAIT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRECISIONS = ["float32", "mixed_float16", "mixed_bfloat16"]
NO_JAX = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
BACKENDS = ["tensorflow", pytest.param("jax", marks=NO_JAX)]
SMALL = ["--image-size", "32", "--batch-size", "4"]
TINY_MODEL = json.dumps(TINY_CAIT)
# The full DeiT augmentation for finetune, whose own defaults are lighter (transfer learning).
DEIT_AUGMENTATION = ["--mixup", "0.8", "--cutmix", "1.0", "--randaugment", "9", "--reprob", "0.25",
                     "--repeated-aug", "3"]
LOSS = re.compile(r"\bloss: (-?(?:[0-9.]+(?:e[-+]?[0-9]+)?|nan|inf))", re.IGNORECASE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """8 small PNGs of random noise in two classes, of a size other than the training crop."""
    from PIL import Image

    root = tmp_path_factory.mktemp("eight")
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        os.makedirs(root / label)
        for index in range(4):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{index}.png")
    return str(root)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """A tiny CaiT (the model to fine-tune) and a tiny teacher, both for 2 classes."""
    import keras

    from keras_cait.model import build_cait

    root = tmp_path_factory.mktemp("models")
    student, teacher = str(root / "student.keras"), str(root / "teacher.keras")
    build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=2).save(student)
    keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                      keras.layers.Dense(2, activation="softmax")]).save(teacher)
    return {"student": student, "teacher": teacher}


def entry_points(saved_models):
    """Command lines of each entry point, without --data, --output-dir and --precision."""
    console = os.path.join(os.path.dirname(sys.executable), "keras-cait")
    train = ["--model", TINY_MODEL, "--epochs", "2", "--warmup-epochs", "1", *SMALL]
    finetune = ["--model", saved_models["student"], "--head-epochs", "1", "--epochs", "1",
                *SMALL, *DEIT_AUGMENTATION]
    distil = [*train, "--teacher", saved_models["teacher"], "--distillation-type", "hard"]
    return {
        "keras-cait train": ([console, "train", *train], {"final.keras", "best.keras", "ema.keras"}),
        "keras-cait finetune": ([console, "finetune", *finetune], {"final.keras", "best.keras"}),
        "keras-cait train --teacher": ([console, "train", *distil], {"final.keras", "ema.keras"}),
        "scripts/train.py": ([sys.executable, os.path.join(ROOT, "scripts", "train.py"), *train],
                             {"final.keras"}),
        "scripts/finetune.py": (
            [sys.executable, os.path.join(ROOT, "scripts", "finetune.py"), *finetune],
            {"final.keras"}),
    }


ENTRY_POINTS = ["keras-cait train", "keras-cait finetune", "keras-cait train --teacher",
                "scripts/train.py", "scripts/finetune.py"]
# On JAX (the GPU path) a cell costs 60-95 s of CPU against TensorFlow's 20-25 s; the command
# line's JAX cells are the console's `train`, whose run code finetune and the wrappers share.
JAX_ENTRY_POINTS = {"keras-cait train"}


def run(command, backend, timeout=600):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def losses(output):
    return [float(value) for value in LOSS.findall(output)]


CELLS = [(entry_point, precision, "tensorflow") for entry_point in ENTRY_POINTS for precision in PRECISIONS]
CELLS += [pytest.param(entry_point, precision, "jax", marks=NO_JAX)
          for entry_point in ENTRY_POINTS if entry_point in JAX_ENTRY_POINTS for precision in PRECISIONS]


@pytest.mark.parametrize("entry_point, precision, backend", CELLS)
def test_each_entry_point_trains_in_each_precision(entry_point, precision, backend, folder,
                                                   saved_models, tmp_path):
    command, files = entry_points(saved_models)[entry_point]
    if precision != "mixed_float16":  # mixed_float16 is the default: leave the flag out
        command = [*command, "--precision", precision]
    output_dir = tmp_path / "run"
    done = run([*command, "--data", folder, "--output-dir", str(output_dir)], backend)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert files <= set(os.listdir(output_dir)), os.listdir(output_dir)
    seen = losses(done.stdout)
    assert seen and all(math.isfinite(loss) for loss in seen), done.stdout[-2000:]
    assert steps_run(done.stdout) >= 2, done.stdout[-2000:]
    assert block_policies(output_dir / "final.keras") == {precision}


def steps_run(output):
    """Training steps that ran, from Keras' progress lines: each epoch's line ends at `n/n`."""
    steps = 0
    for line in output.replace("\r", "\n").split("\n"):
        finished = [int(done) for done, total in re.findall(r"\b(\d+)/(\d+) ", line) if done == total]
        if finished and "loss: " in line:
            steps += finished[-1]
    return steps


def block_policies(path):
    """The dtype policies of the saved model's CaiT blocks: what its matmuls computed in."""
    import keras

    import keras_cait  # noqa: F401  CaiT's classes for load_model

    model = keras.models.load_model(path)
    return {layer.dtype_policy.name for layer in model.layers if layer.name.endswith(tuple(
        f"attention_block_{i}" for i in range(10)))}


PYTHON_STREAM = """
import json, math, sys
import keras
import numpy as np
from keras_cait.model import build_cait
from keras_cait.training import Augmentation, adamw, sources
from keras_cait.training.stream import training_stream

folder, precision, tiny = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
keras.mixed_precision.set_global_policy(precision)
source = sources.image_folder(folder)
augmentation = Augmentation(image_size=32, num_classes=source.num_classes)  # DeiT's defaults
stream = training_stream(source, augmentation, batch_size=4, epochs=2, seed=0)
images, _ = next(iter(stream))
model = build_cait(**tiny, input_shape=(32, 32, 3), classes=source.num_classes, drop_path_rate=0.1)
model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy", jit_compile=True)
history = model.fit(stream, epochs=2, steps_per_epoch=2, verbose=0)
print(json.dumps({"dtype": str(images.dtype.name), "min": float(np.min(images)),
                  "max": float(np.max(images)), "loss": history.history["loss"],
                  "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations))}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_python_stream_feeds_model_fit_in_each_precision(precision, backend, folder):
    done = run([sys.executable, "-c", PYTHON_STREAM, folder, precision, TINY_MODEL], backend)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dtype"] == "float32"  # whatever the policy: the model casts at its input
    assert report["max"] > 100  # 0..255 pixels (erased boxes hold noise outside it), not 0..1
    assert report["steps"] >= 4
    assert all(math.isfinite(loss) for loss in report["loss"])
