"""Runs cells of the training matrix one after the other in this one process.

    python -m tests.training.matrix_cells CELLS.json RESULTS.json

Each cell is `{"id", "kind": "console" | "stream" | "arrays", "argv"}`: a console cell is
`keras-cait ARGV` run through `keras_cait.cli.main`, exactly as the console script
calls it; a stream cell feeds `training.stream.training_stream` into `model.fit`; an
arrays cell trains from arrays already in memory with the recipe's Keras-only parts
(no tf.data: it runs where TensorFlow is not installed, as on the GPU machine).
The interpreter, the backend's import and Keras' start-up are paid once for all
cells of a backend (KERAS_BACKEND, set by the caller). Each result holds the
cell's exit status, standard output and error, and, for a stream cell, a report.
"""

import contextlib
import io
import json
import sys
import traceback


def console(argv):
    from keras_cait.cli import main

    main(argv)
    return None


def stream(argv):
    """`training_stream` into `model.fit` under a precision, with DeiT's default augmentation."""
    import keras
    import numpy as np

    from keras_cait.models.architecture import build_cait
    from keras_cait.training import Augmentation, adamw, sources
    from keras_cait.training.stream import training_stream

    folder, precision, tiny = argv[0], argv[1], json.loads(argv[2])
    keras.mixed_precision.set_global_policy(precision)
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=source.num_classes)  # DeiT's defaults
    batches = training_stream(source, augmentation, batch_size=4, epochs=2, seed=0)
    images, _ = next(iter(batches))
    model = build_cait(**tiny, input_shape=(32, 32, 3), classes=source.num_classes, drop_path_rate=0.1)
    model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy", jit_compile=True)
    history = model.fit(batches, epochs=2, steps_per_epoch=2, verbose=0)
    return {"dtype": str(images.dtype.name), "min": float(np.min(images)), "max": float(np.max(images)),
            "loss": history.history["loss"],
            "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            "policy": model.get_layer("self_attention_block_0").dtype_policy.name}


def arrays(argv):
    """`model.fit` on mixup/cutmix'd arrays under a precision: DeiT's AdamW with EMA, a warmup
    cosine, drop path and XLA; then the saved model read back. Keras core and keras.ops only."""
    import os
    import tempfile

    import keras
    import numpy as np

    import keras_cait  # noqa: F401  CaiT's classes for load_model
    from keras_cait.models.architecture import build_cait
    from keras_cait.training import MixupCutmix, adamw, warmup_cosine

    precision, tiny = argv[0], json.loads(argv[1])
    keras.mixed_precision.set_global_policy(precision)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (8, 32, 32, 3)).astype("float32")
    mixed = MixupCutmix(num_classes=2, seed=0)({"images": images, "labels": rng.integers(0, 2, 8)})
    model = build_cait(**tiny, input_shape=(32, 32, 3), classes=2, drop_path_rate=0.1)
    model.compile(optimizer=adamw(model, warmup_cosine(1e-3, total_steps=4, warmup_steps=2), use_ema=True),
                  loss="categorical_crossentropy", jit_compile=True)
    history = model.fit(keras.ops.convert_to_numpy(mixed["images"]), keras.ops.convert_to_numpy(mixed["labels"]),
                        batch_size=4, epochs=2, verbose=0)
    with tempfile.TemporaryDirectory() as folder:
        model.save(os.path.join(folder, "final.keras"))
        saved = keras.models.load_model(os.path.join(folder, "final.keras"))
    return {"loss": history.history["loss"], "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            "policy": saved.get_layer("self_attention_block_0").dtype_policy.name,
            "backend": keras.backend.backend(), "device": _device()}


def _device():
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.devices()[0].platform
    return "n/a"


KINDS = {"console": console, "stream": stream, "arrays": arrays}


def run(cell):
    import keras

    out, err = io.StringIO(), io.StringIO()
    status, report = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            report = KINDS[cell["kind"]](cell["argv"])
        except SystemExit as ended:  # the command line's error contract
            status = ended.code if isinstance(ended.code, int) else 1
        except BaseException:  # noqa: BLE001  a bug: its traceback is the cell's result
            status = 1
            traceback.print_exc()
        finally:
            keras.mixed_precision.set_global_policy("float32")
            keras.backend.clear_session()
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue(), "report": report}


def main(cells_path, results_path):
    with open(cells_path) as file:
        cells = json.load(file)
    results = {}
    for cell in cells:
        results[cell["id"]] = run(cell)
        with open(results_path, "w") as file:  # what ran so far, should a later cell hang
            json.dump(results, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
