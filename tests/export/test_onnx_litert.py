"""keras_cait.export.export_onnx and export_litert, checked with onnxruntime and the LiteRT interpreter."""

import os

import numpy as np
import pytest

from keras_cait.export import export_litert, export_onnx
from tests.export.helpers import SIDE, small_model


@pytest.fixture(scope="module")
def logits_model():
    return small_model(classifier_activation=None)


@pytest.fixture(scope="module")
def inputs():
    return np.random.RandomState(2).uniform(0, 255, (16, SIDE, SIDE, 3)).astype("float32")


def run_litert(path, images):
    """The model at `path` on `images` with the LiteRT interpreter (ai-edge-litert)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    (outputs,) = runner(images=images).values()
    return outputs


def test_onnx_logits_are_those_of_keras(logits_model, inputs, tmp_path):
    import onnxruntime

    export_onnx(logits_model, tmp_path / "cait.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "cait.onnx"), providers=["CPUExecutionProvider"])
    (images,) = session.get_inputs()
    assert (images.name, images.shape[1:], images.type) == ("images", [SIDE, SIDE, 3], "tensor(float)")
    assert [output.name for output in session.get_outputs()] == ["predictions"]
    expected = logits_model.predict(inputs, verbose=0)
    (logits,) = session.run(None, {"images": inputs})
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
    (one,) = session.run(None, {"images": inputs[:1]})  # the batch size is free
    np.testing.assert_allclose(one, expected[:1], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def float32_tflite(logits_model, tmp_path_factory):
    return export_litert(logits_model, tmp_path_factory.mktemp("litert") / "float32.tflite")


def test_litert_float32_logits_are_those_of_keras(logits_model, inputs, float32_tflite):
    expected = logits_model.predict(inputs, verbose=0)
    np.testing.assert_allclose(run_litert(float32_tflite, inputs), expected, atol=1e-4, rtol=0)


def test_litert_dynamic_int8_is_smaller_and_close(logits_model, inputs, float32_tflite, tmp_path):
    export_litert(logits_model, tmp_path / "int8.tflite", quantization="dynamic_int8")
    assert os.path.getsize(tmp_path / "int8.tflite") < 0.5 * os.path.getsize(float32_tflite)
    expected = logits_model.predict(inputs, verbose=0)
    logits = run_litert(tmp_path / "int8.tflite", inputs)
    # Measured: 1.3% of the largest logit, every top-1 kept (docs/export.md has CaiT-XXS24).
    assert np.abs(logits - expected).max() <= 0.05 * np.abs(expected).max()
    assert (logits.argmax(1) == expected.argmax(1)).mean() >= 0.9


def test_bad_arguments_are_refused_before_anything_is_written(logits_model, tmp_path):
    with pytest.raises(ValueError, match="must end in .onnx"):
        export_onnx(logits_model, tmp_path / "cait.tflite")
    with pytest.raises(ValueError, match="must end in .tflite"):
        export_litert(logits_model, tmp_path / "cait.lite")
    with pytest.raises(ValueError, match="quantization='int4'"):
        export_litert(logits_model, tmp_path / "cait.tflite", quantization="int4")
    (tmp_path / "old.onnx").write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx(logits_model, tmp_path / "old.onnx")
    assert sorted(os.listdir(tmp_path)) == ["old.onnx"] and (tmp_path / "old.onnx").read_bytes() == b"old"


def test_a_failed_conversion_leaves_the_old_file_and_nothing_else(logits_model, tmp_path, monkeypatch):
    import tf2onnx

    def fail_half_way(*args, output_path, **kwargs):
        with open(output_path, "wb") as file:
            file.write(b"half a model")
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(tf2onnx.convert, "from_function", fail_half_way)
    (tmp_path / "cait.onnx").write_bytes(b"the previous export")
    with pytest.raises(RuntimeError, match="conversion failed"):
        export_onnx(logits_model, tmp_path / "cait.onnx", overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["cait.onnx"]
    assert (tmp_path / "cait.onnx").read_bytes() == b"the previous export"


# === opset_version, tf2onnx's settings for the session, the converters' lines on standard error ===


def tf2onnx_max_opset():
    from tf2onnx.constants import OPSET_TO_IR_VERSION

    return max(OPSET_TO_IR_VERSION)


@pytest.mark.parametrize(
    "opset_version, problem",
    [
        (5, "the CaiT graph needs ONNX opset 10 or later (its StridedSlice as ONNX Slice)"),  # wrote a file ORT refused
        (9, "the CaiT graph needs ONNX opset 10 or later (its StridedSlice as ONNX Slice)"),
        ("17", "must be an integer"),  # a bare TypeError after tracing
        (17.0, "must be an integer"),
        (True, "must be an integer"),
        (99, "tf2onnx writes ONNX opsets up to {highest}"),  # tf2onnx's "make_sure failure"
    ],
)
def test_an_opset_version_tf2onnx_cannot_write_is_refused_before_anything_is_traced(
        logits_model, tmp_path, monkeypatch, opset_version, problem):
    from keras_cait.errors import ArgumentError
    from keras_cait.export import onnx

    def traced(*args, **kwargs):
        raise AssertionError("the model was traced")

    monkeypatch.setattr(onnx, "inference_form", traced)
    highest = tf2onnx_max_opset()
    with pytest.raises(ArgumentError) as raised:
        export_onnx(logits_model, tmp_path / "cait.onnx", opset_version=opset_version)
    assert (raised.value.argument, raised.value.value, raised.value.usage) == ("opset_version", opset_version, True)
    assert str(raised.value) == (
        f"opset_version={opset_version!r}: {problem.format(highest=highest)}; give an integer from 10 to "
        f"{highest}, e.g. opset_version=17, or leave it out for tf2onnx's default")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("opset_version", ["lowest", "highest"])
def test_the_lowest_and_highest_opsets_load_in_onnx_runtime(logits_model, inputs, tmp_path, opset_version):
    import onnx
    import onnxruntime

    opset_version = 10 if opset_version == "lowest" else np.int64(tf2onnx_max_opset())  # numpy's ints too
    export_onnx(logits_model, tmp_path / "cait.onnx", opset_version=opset_version)
    assert [entry.version for entry in onnx.load(str(tmp_path / "cait.onnx")).opset_import
            if entry.domain in ("", "ai.onnx")] == [opset_version]
    session = onnxruntime.InferenceSession(str(tmp_path / "cait.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": inputs[:4]})
    np.testing.assert_allclose(logits, logits_model.predict(inputs[:4], verbose=0), atol=1e-4, rtol=0)


# The child processes import timm before TensorFlow (as tests/conftest.py does: in the other order
# the process aborts) and build conftest's tiny CaiT without importing the suite's conftest, which
# sets TF_CPP_MIN_LOG_LEVEL.
CHILD_START = """
import logging, os, sys
try:
    import timm  # noqa: F401
except ImportError:
    pass
import tensorflow as tf
import tf2onnx.tf_loader
from keras_cait.export import export_litert, export_onnx
from keras_cait.models.architecture import build_cait

model = build_cait(embed_dim=64, depth=2, num_heads=4, init_values=0.1, input_shape=(32, 32, 3),
                   classifier_activation=None)
"""


def run_child(script, tmp_path):
    """`script` in a fresh Python run in `tmp_path`, as a notebook would: without TF_CPP_MIN_LOG_LEVEL."""
    import subprocess
    import sys

    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", CHILD_START + script], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_export_onnx_leaves_the_environment_and_logging_levels_as_it_found_them(tmp_path):
    """The first export of a process imports tf2onnx.convert, which set TF_CPP_MIN_LOG_LEVEL=3 for the
    rest of the session, also when the conversion then failed."""
    script = """
def settings():
    levels = {name: logging.getLogger(name).level for name in ("", "tensorflow", "tf2onnx", "absl")}
    return dict(os.environ), levels

def conversion_fails(*args, **kwargs):
    raise RuntimeError("conversion failed")

real_from_function = tf2onnx.tf_loader.from_function
for variable in (None, "2"):  # absent (the first export, which fails), then set
    if variable is None:
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        tf2onnx.tf_loader.from_function = conversion_fails
    else:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = variable
        tf2onnx.tf_loader.from_function = real_from_function
    before = settings()
    try:
        export_onnx(model, "cait.onnx", overwrite=True)
    except RuntimeError as error:
        print("failed:", error)
    after = settings()
    print("changed:", sorted(name for name in set(before[0]) | set(after[0])
                             if before[0].get(name) != after[0].get(name)), after[1] == before[1])
    print("written:", os.listdir("."))
"""
    assert run_child(script, tmp_path).stdout.splitlines() == [
        "failed: conversion failed", "changed: [] True", "written: []",
        "changed: [] True", "written: ['cait.onnx']",
    ]


def test_the_converters_info_lines_stay_off_standard_error_and_their_errors_do_not(tmp_path):
    """From a notebook (no TF_CPP_MIN_LOG_LEVEL) each ONNX export printed grappler's "devices.cc:67] Number
    of eligible GPUs ..." and "single_machine.cc:376] Starting new session", each LiteRT export about ten
    lines ("Ignored output_format.", "Reading SavedModel from: ..."). A converter's warnings and errors
    still reach standard error, where they were written."""
    script = """
def saying(line, function):
    def said(*args, **kwargs):
        os.write(2, line.encode() + b"\\n")
        return function(*args, **kwargs)
    return said

tf2onnx.tf_loader.from_function = saying(
    "E0000 00:00:1795945018.491298   12357 some_op.cc:12] a real error", tf2onnx.tf_loader.from_function)
tf.lite.TFLiteConverter.from_concrete_functions = staticmethod(saying(
    "W0000 00:00:1795945018.491375   12357 lite.cc:34] a real warning",
    tf.lite.TFLiteConverter.from_concrete_functions))
print("== export_onnx", file=sys.stderr, flush=True)
export_onnx(model, "cait.onnx")
print("== export_litert", file=sys.stderr, flush=True)
export_litert(model, "cait.tflite")
print("== export_litert dynamic_int8", file=sys.stderr, flush=True)
export_litert(model, "int8.tflite", quantization="dynamic_int8")
print("== done", file=sys.stderr, flush=True)
"""
    stderr = run_child(script, tmp_path).stderr.splitlines()
    assert "== export_onnx" in stderr, stderr
    assert stderr[stderr.index("== export_onnx"):] == [
        "== export_onnx",
        "E0000 00:00:1795945018.491298   12357 some_op.cc:12] a real error",
        "== export_litert",
        "W0000 00:00:1795945018.491375   12357 lite.cc:34] a real warning",
        "== export_litert dynamic_int8",
        "W0000 00:00:1795945018.491375   12357 lite.cc:34] a real warning",
        "== done",
    ]
    assert sorted(os.listdir(tmp_path)) == ["cait.onnx", "cait.tflite", "int8.tflite"]
