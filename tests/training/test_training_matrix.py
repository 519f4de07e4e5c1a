"""Every training entry point × every precision, with DeiT's full augmentation at its defaults.

Each cell trains a tiny CaiT on a folder of 8 small PNGs in two classes as a user would:
the console command `keras-cait` (train, finetune, train with a teacher) with its defaults
(XLA on, RandAugment 9, random erasing 0.25, mixup 0.8 / cutmix 1.0, repeated augmentation 3,
EMA); only the sizes are made small. The Python cell runs `training.stream.training_stream`
into `model.fit`. A cell passes when it exits 0 after at least two training steps, writes its
files, reports finite losses, and its saved model's blocks compute in the precision asked for.

The cells of one backend run one after the other in one process (`matrix_cells.py`, through
`keras_cait.cli.main` as the console script calls it), so the interpreter and the backend's
import are paid once: TensorFlow runs every cell, JAX (the GPU path) the console's train,
whose run code finetune shares, the Python stream, and `model.fit` on arrays with the
recipe's Keras-only parts (the cells the GPU machine, which has no TensorFlow, runs: see
docs/benchmarks.md). `python -m keras_cait.cli train | finetune`, the same `main` run from a
checkout without the console script, gets one smoke cell each in its own process.
"""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import TINY_CAIT

pytestmark = pytest.mark.large

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRECISIONS = ["float32", "mixed_float16", "mixed_bfloat16"]
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

    from keras_cait.models.architecture import build_cait

    root = tmp_path_factory.mktemp("models")
    student, teacher = str(root / "student.keras"), str(root / "teacher.keras")
    build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=2).save(student)
    keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                      keras.layers.Dense(2, activation="softmax")]).save(teacher)
    return {"student": student, "teacher": teacher}


def entry_points(saved_models):
    """The arguments of each entry point, without --data, --output-dir and --precision, and the
    files its run must write."""
    train = ["train", "--model", TINY_MODEL, "--epochs", "2", "--warmup-epochs", "1", *SMALL]
    finetune = ["finetune", "--model", saved_models["student"], "--head-epochs", "1", "--epochs", "1",
                *SMALL, *DEIT_AUGMENTATION]
    distil = [*train, "--teacher", saved_models["teacher"], "--distillation-type", "hard"]
    return {
        "keras-cait train": (train, {"final.keras", "best.keras", "ema.keras"}),
        "keras-cait finetune": (finetune, {"final.keras", "best.keras"}),
        "keras-cait train --teacher": (distil, {"final.keras", "ema.keras"}),
    }


# On JAX (the GPU path) a cell costs 3-4 times TensorFlow's CPU time; the console's `train` is
# the run code that finetune and distillation share.
JAX_ENTRY_POINTS = {"keras-cait train"}


def run(command, backend, timeout=600):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def losses(output):
    return [float(value) for value in LOSS.findall(output)]


def with_precision(argv, precision):
    # The default (auto) picks this machine's precision: leave the flag out for it, as a user would.
    from keras_cait.training.run import default_precision

    return argv if precision == default_precision()[0] else [*argv, "--precision", precision]


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_every_entry_point_trains_in_every_precision(backend, folder, saved_models, tmp_path, subtests):
    if backend == "jax":
        import jax  # noqa: F401  in the [test] extra: missing is an error, not a skip
    cells, expected = [], {}
    for entry_point, (argv, files) in entry_points(saved_models).items():
        if backend == "jax" and entry_point not in JAX_ENTRY_POINTS:
            continue
        for precision in PRECISIONS:
            cell = f"{entry_point} [{precision}]"
            output_dir = tmp_path / re.sub(r"\W+", "_", cell)
            argv_ = [*with_precision(argv, precision), "--data", folder, "--output-dir", str(output_dir)]
            cells.append({"id": cell, "kind": "console", "argv": argv_})
            expected[cell] = ("console", precision, output_dir, files)
    for precision in PRECISIONS:
        cell = f"training_stream into model.fit [{precision}]"
        cells.append({"id": cell, "kind": "stream", "argv": [folder, precision, TINY_MODEL]})
        expected[cell] = ("stream", precision, None, None)
        if backend == "jax":  # the cells that run where TensorFlow is not installed (the GPU machine)
            cell = f"arrays into model.fit [{precision}]"
            cells.append({"id": cell, "kind": "arrays", "argv": [precision, TINY_MODEL]})
            expected[cell] = ("arrays", precision, None, None)
    (tmp_path / "cells.json").write_text(json.dumps(cells))
    done = run([sys.executable, "-m", "tests.training.matrix_cells", str(tmp_path / "cells.json"),
                str(tmp_path / "results.json")], backend, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())

    for cell, (kind, precision, output_dir, files) in expected.items():
        with subtests.test(cell=cell):
            result = results[cell]
            assert result["status"] == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
            assert "Traceback" not in result["stderr"]
            if kind == "console":
                check_run(result["stdout"], output_dir, files, precision)
            elif kind == "stream":
                check_stream(result["report"], precision)
            else:
                check_arrays(result["report"], precision)


@pytest.mark.parametrize("entry_point", ["keras-cait train", "keras-cait finetune"])
def test_python_m_keras_cait_cli_trains_as_its_command(entry_point, folder, saved_models, tmp_path):
    argv, _ = entry_points(saved_models)[entry_point]
    output_dir = tmp_path / "run"
    done = run([sys.executable, "-m", "keras_cait.cli", *argv, "--data", folder,
                "--output-dir", str(output_dir)], "tensorflow")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    from keras_cait.training.run import default_precision

    check_run(done.stdout, output_dir, {"final.keras", "best.keras", "run.json"}, default_precision()[0])


def check_run(stdout, output_dir, files, precision):
    assert files <= set(os.listdir(output_dir)), os.listdir(output_dir)
    seen = losses(stdout)
    assert seen and all(math.isfinite(loss) for loss in seen), stdout[-2000:]
    assert steps_run(stdout) >= 2, stdout[-2000:]
    assert block_policies(output_dir / "final.keras") == {precision}


def check_stream(report, precision):
    assert report["dtype"] == "float32"  # whatever the policy: the model casts at its input
    assert report["max"] > 100  # 0..255 pixels (erased boxes hold noise outside it), not 0..1
    assert report["steps"] >= 4
    assert report["policy"] == precision
    assert all(math.isfinite(loss) for loss in report["loss"])


def check_arrays(report, precision):
    assert report["backend"] == "jax"
    assert report["steps"] == 4  # 8 images, batch 4, 2 epochs
    assert report["policy"] == precision  # of the model saved and read back
    assert all(math.isfinite(loss) for loss in report["loss"])


def steps_run(output):
    """Training steps that ran, from Keras' progress lines: each epoch's line ends at `n/n`."""
    steps = 0
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # the bars' colours
    for line in plain.replace("\r", "\n").split("\n"):
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
