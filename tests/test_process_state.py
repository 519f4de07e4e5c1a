"""A library call leaves the process as it found it: each public module's calls, made the way a notebook
user makes them, leave Keras' global configuration, the global generators, TensorFlow's switches,
the environment, the working directory, the loggers, the warning filters, the standard streams and
matplotlib's settings as the caller had them (the training runs: tests/training/test_run_state.py).

Python's global generator is the one item a model build moves by design: Keras draws the seed of each
initializer and of each stochastic depth layer from `random` as it builds them, which is how
`keras.utils.set_random_seed` makes a build repeatable. Calls that build no new weights (copies,
exports, inspection, loading, data) leave it as it was, and so do the builds under test here once the
caller's generator is checked apart (`test_a_build_moves_only_python_s_generator_as_keras_does`).
"""

import contextlib
import hashlib
import logging
import os
import random
import signal
import sys
import warnings

import keras
import numpy as np
import pytest

import keras_cait
import keras_cait.inspection.visualize
from keras_cait import export, hub, images, inspection, models, preprocessing, training, weights  # noqa: F401
from tests.conftest import TINY_CAIT, TINY_SIZE


def process_state():
    """What a library call could change for the rest of the process, by item."""
    import absl.logging
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    loggers = {name: logger for name, logger in logging.root.manager.loggerDict.items()
               if isinstance(logger, logging.Logger)}
    loggers[""] = logging.root
    state = {
        "dtype policy": keras.config.dtype_policy().name,
        "floatx": keras.config.floatx(),
        "image data format": keras.config.image_data_format(),
        "epsilon": keras.config.epsilon(),
        "backend": keras.config.backend(),
        "interactive logging": keras.config.is_interactive_logging_enabled(),
        "traceback filtering": keras.config.is_traceback_filtering_enabled(),
        "distribution": keras.distribution.distribution(),
        "python generator": _digest(random.getstate()),
        "numpy generator": _numpy_state(),
        "numpy errors": np.geterr(),
        "op determinism": tf_config.is_op_determinism_enabled(),
        "tf functions run eagerly": tf.config.functions_run_eagerly(),
        "tf inter op threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "tf intra op threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "environment": dict(os.environ),
        "working directory": os.getcwd(),
        "sys.path": list(sys.path),
        "logging disabled below": logging.root.manager.disable,
        "absl verbosity": absl.logging.get_verbosity(),
        "warning filters": list(warnings.filters),
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "excepthook": sys.excepthook,
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }
    for name, logger in loggers.items():
        state[f"logger {name!r}"] = (logger.level, list(logger.handlers), logger.propagate, logger.disabled)
    if "matplotlib" in sys.modules:
        import matplotlib

        # dict's own lookup: rcParams["backend"] would resolve (and so set) the backend.
        state["matplotlib backend"] = dict.__getitem__(matplotlib.rcParams, "backend")
        state["matplotlib rcParams"] = {key: repr(dict.__getitem__(matplotlib.rcParams, key))
                                        for key in matplotlib.rcParams if key != "backend"}
    return state


def _numpy_state():
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    return _digest((kind, keys.tobytes(), position, has_gauss, gauss))


def _digest(state):
    """A generator's state in a few characters (its 625 numbers would fill the failure's message)."""
    return hashlib.sha256(repr(state).encode()).hexdigest()[:12]


def changes(before, after):
    """{item: (before, after)} for every item the call changed. A logger made during the call is
    no caller's; matplotlib loaded by the call is compared with matplotlib's own defaults."""
    changed = {item: (before.get(item), after[item]) for item in after
               if item in before and before[item] != after[item]}
    changed.update({item: (value, "gone") for item, value in before.items() if item not in after})
    if "environment" in changed:  # the variables that differ, not the whole environment twice
        old, new = changed.pop("environment")
        changed.update({f"environment {name}": (old.get(name), new.get(name))
                        for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)})
    if "matplotlib rcParams" in after and "matplotlib rcParams" not in before:
        import matplotlib

        defaults = {key: repr(value) for key, value in matplotlib.rc_params().items() if key != "backend"}
        changed.update({f"matplotlib rcParams[{key!r}]": (defaults.get(key), value)
                        for key, value in after["matplotlib rcParams"].items() if defaults.get(key) != value})
    return changed


@contextlib.contextmanager
def kept(what, ignore=()):
    """Fails if the block changes any item of `process_state` (but those in `ignore`)."""
    before = process_state()
    yield
    changed = {item: values for item, values in changes(before, process_state()).items() if item not in ignore}
    assert changed == {}, f"{what} changed the process (item: (before, after)): {changed}"


def tiny(**changes):
    return models.build_cait(**{**TINY_CAIT, "input_shape": (TINY_SIZE, TINY_SIZE, 3), "classes": 3, **changes})


def pixels(batch=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, TINY_SIZE, TINY_SIZE, 3)).astype("float32")


BUILDS_MOVE = ("python generator",)  # what a new model's initializers draw, by Keras' design (module docstring)


def test_building_and_loading_models_leaves_the_process_as_it_was_but_for_keras_seeds(tmp_path):
    with kept("CaiT_XXS24(weights=None)", ignore=BUILDS_MOVE):
        keras_cait.CaiT_XXS24(weights=None, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=3)
    with kept("build_cait", ignore=BUILDS_MOVE):
        model = tiny()
    with kept("load_classifier of a name", ignore=BUILDS_MOVE):
        models.load_classifier("XXS24", weights=None, image_size=TINY_SIZE, classes=3)
    path = tmp_path / "tiny.keras"
    model.save(path)
    with kept("load_classifier of a .keras file", ignore=BUILDS_MOVE):
        models.load_classifier(str(path))


def test_loading_a_keras_file_leaves_python_s_generator_as_it_was(tmp_path):
    path = tmp_path / "tiny.keras"
    tiny().save(path)
    with kept("load_classifier of a .keras file"):
        models.load_classifier(str(path))


def test_a_build_moves_only_python_s_generator_as_keras_does():
    """A build under a seeded generator gives the same weights twice: what Keras' seeds are drawn for."""
    random.seed(7)
    first = tiny().get_weights()
    random.seed(7)
    second = tiny().get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_reshaping_a_model_leaves_the_process_as_it_was():
    model = tiny()
    with kept("with_new_head", ignore=BUILDS_MOVE):  # a new head: new weights, drawn as any build draws them
        models.with_new_head(model, 5)
    with kept("at_resolution"):
        models.at_resolution(model, 48)
    with kept("with_dtype_policy"):
        models.with_dtype_policy(model, "mixed_bfloat16")
    with kept("enable_lora", ignore=BUILDS_MOVE):  # the LoRA factors are new weights
        lora = training.enable_lora(tiny(), rank=2)
    with kept("merge_lora"):
        models.merge_lora(lora)


def test_exporting_leaves_the_caller_s_loggers_and_environment_as_they_were(tmp_path):
    # What these set up as they load (NNCF its logger, setuptools, which NNCF's compression imports, its
    # vendored folder on sys.path) is theirs, once per process: a notebook has them loaded already.
    import nncf  # noqa: F401
    import openvino  # noqa: F401
    import setuptools  # noqa: F401

    model = tiny()
    with kept("export_saved_model"):
        export.export_saved_model(model, tmp_path / "saved" / "1", class_names=["a", "b", "c"])
    with kept("export_openvino float32"):
        export.export_openvino(model, tmp_path / "model.xml")
    with kept("export_openvino int8_weights"):
        export.export_openvino(model, tmp_path / "weights8.xml", quantization="int8_weights")
    with kept("export_openvino int8 calibrated"):
        export.export_openvino(model, tmp_path / "int8.xml", quantization="int8", calibration=pixels(4),
                               calibration_size=4)


def test_exporting_to_onnx_leaves_the_process_as_it_was(tmp_path):
    model = tiny()
    with kept("export_onnx"):
        export.export_onnx(model, tmp_path / "model.onnx")


def test_exporting_to_litert_leaves_the_process_as_it_was(tmp_path):
    pytest.importorskip("ai_edge_litert", reason="LiteRT is the optional extra keras-cait[litert]")
    model = tiny()
    with kept("export_litert"):
        export.export_litert(model, tmp_path / "model.tflite")


def test_inspecting_a_model_leaves_the_process_and_matplotlib_as_they_were(tmp_path):
    model = tiny()
    with kept("attention_maps"):
        maps = inspection.attention_maps(model, pixels())
    with kept("saliency_figure and save_figure"):
        figure = inspection.visualize.saliency_figure(pixels() / 255, maps)
        inspection.visualize.save_figure(figure, tmp_path / "saliency.png")
    with kept("feature_extractor"):
        inspection.feature_extractor(model, indices=1)
    with kept("forward_intermediates"):
        inspection.forward_intermediates(model, pixels(), indices=1)


def test_reading_images_leaves_the_process_as_it_was(tmp_path):
    from PIL import Image

    from keras_cait.images.evaluation_transform import evaluation_transform

    path = tmp_path / "photo.jpg"
    Image.fromarray(pixels(1)[0].astype("uint8")).resize((48, 40)).save(path)
    with kept("load_image"):
        preprocessing.load_image(str(path), image_size=TINY_SIZE, crop_pct=0.875)
    with kept("evaluation_transform"):
        evaluation_transform(pixels(1)[0].astype("uint8"), TINY_SIZE)


def test_augmenting_and_streaming_leave_the_process_as_they_were(tmp_path, digits):
    from keras_cait.training import sources, stream

    source = sources.image_folder(digits(tmp_path / "digits", per_class=2, classes=range(3)))
    with kept("Augmentation"):
        augmentation = training.Augmentation(TINY_SIZE, 3, repeats=1)
    with kept("RandAugment"):
        training.RandAugment(value_range=(0, 255), seed=1)(pixels())
    with kept("training_stream"):
        next(iter(stream.training_stream(source, augmentation, 4, 1, seed=0)))
    with kept("evaluation_dataset"):
        next(iter(stream.evaluation_dataset(source, TINY_SIZE, 4)))


def test_keras_hub_models_leave_the_process_as_they_were_but_for_keras_seeds():
    with kept("CaiTBackbone and CaiTImageClassifier", ignore=BUILDS_MOVE):
        backbone = hub.CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
        classifier = hub.CaiTImageClassifier(backbone, 3)
    with kept("CaiTImageClassifier.predict"):
        classifier.predict(pixels(), verbose=0)


def test_loading_a_timm_checkpoint_leaves_the_process_as_it_was(timm_reference):
    path = timm_reference.save(timm_reference.tiny_model())
    model = tiny(classes=1000)
    with kept("load_weights_file"):
        weights.load_weights_file(model, path)
    with kept("load_state_dict"):
        weights.load_state_dict(model, weights.read_checkpoint(str(path)))


def test_a_caller_s_own_policy_and_seeded_generators_are_put_back_as_they_were(tmp_path):
    """The state a caller set (a mixed policy, seeded generators) is what the calls leave, not the defaults."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    random.seed(11)
    np.random.seed(11)
    try:
        model = tiny()
        with kept("with_dtype_policy and export_saved_model under the caller's mixed_bfloat16"):
            float32 = models.with_dtype_policy(model, "float32")
            export.export_saved_model(float32, tmp_path / "saved" / "1", class_names=["a", "b", "c"])
            inspection.attention_maps(model, pixels())
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    finally:
        keras.config.set_dtype_policy("float32")


def test_exporting_leaves_a_root_logger_without_handlers_without_them(tmp_path, monkeypatch):
    """TensorFlow's first warning while a SavedModel is written gave the root logger a handler, after
    which a notebook's own `logging.basicConfig(level=logging.INFO)` did nothing."""
    monkeypatch.setattr(logging.root, "handlers", [])
    inputs = keras.Input((TINY_SIZE, TINY_SIZE, 3))
    plain = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(inputs)))
    export.export_saved_model(tiny(), tmp_path / "saved" / "1", class_names=["a", "b", "c"])
    assert logging.root.handlers == []
    export.export_openvino(plain, tmp_path / "plain.xml")  # Keras' own export: no CaiT graph to fold
    assert logging.root.handlers == []
