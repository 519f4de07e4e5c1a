"""Keras int8 (model.quantize) through the SavedModel and ONNX exports; the float OpenVINO export (its NNCF
int8: test_openvino_nncf.py)."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_cait.export import export_litert, export_onnx, export_openvino, export_saved_model
from tests.export.helpers import SIDE, small_model

# keras_int8 quantises as a user would, and Keras warns for every layer without int8 weights.
pytestmark = [
    pytest.mark.large,
    pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method"),
]


@pytest.fixture(scope="module")
def logits_model():
    return small_model(classifier_activation=None)


@pytest.fixture(scope="module")
def inputs():
    return np.random.RandomState(3).uniform(0, 255, (8, SIDE, SIDE, 3)).astype("float32")


def keras_int8(model):
    """What a user does by hand: a copy of `model`, quantised by Keras."""
    copy = keras.Model.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    copy.quantize("int8")
    return copy


def test_int8_saved_model_serves_the_keras_int8_model(model, images, tmp_path):
    expected = keras_int8(model).predict(images, verbose=0)
    export_saved_model(model, tmp_path / "cait" / "1", quantization="int8")
    checkpoint = tf.train.load_checkpoint(str(tmp_path / "cait" / "1" / "variables" / "variables"))
    assert tf.int8 in set(checkpoint.get_variable_to_dtype_map().values())
    loaded = tf.saved_model.load(str(tmp_path / "cait" / "1"))
    assert tf.int8 not in {weight.dtype for weight in model.weights}  # the caller's model is kept
    served = loaded.signatures["serving_default"](images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-7)
    # Quantised for real: the outputs moved away from float32's.
    assert np.abs(served - model.predict(images, verbose=0)).max() > 1e-6


def test_int8_onnx_stores_int8_kernels_and_follows_keras_int8(logits_model, inputs, tmp_path):
    import onnx
    import onnxruntime

    export_onnx(logits_model, tmp_path / "cait.onnx", quantization="int8")
    graph = onnx.load(str(tmp_path / "cait.onnx")).graph
    assert onnx.TensorProto.INT8 in {initializer.data_type for initializer in graph.initializer}
    session = onnxruntime.InferenceSession(str(tmp_path / "cait.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": inputs})
    expected = keras_int8(logits_model).predict(inputs, verbose=0)
    float_logits = logits_model.predict(inputs, verbose=0)
    # onnxruntime sums in another order, so an activation now and then rounds to the
    # neighbouring int8 step; measured 2e-3 of the logits' range, int8 itself moves them 2e-2.
    scale = np.abs(float_logits).max()
    assert np.abs(logits - expected).max() < 5e-3 * scale
    assert np.abs(logits - expected).max() < 0.5 * np.abs(expected - float_logits).max()
    assert (logits.argmax(-1) == expected.argmax(-1)).mean() >= 0.75


def test_unsupported_quantizations_are_refused_before_anything_is_written(model, tmp_path):
    with pytest.raises(ValueError, match="does not convert to LiteRT.*dynamic_int8 is TFLite's own int8 weights"):
        export_litert(model, tmp_path / "cait.tflite", quantization="int8")
    with pytest.raises(ValueError, match=r"OpenVINO \(a .xml file\) takes int8 or int8_weights.*export to a "
                                         r"SavedModel version folder"):
        export_openvino(model, tmp_path / "cait.xml", quantization="int4")
    with pytest.raises(ValueError, match=r"quantization='int4': ONNX \(a .onnx file\) takes int8;"):
        export_onnx(model, tmp_path / "cait.onnx", quantization="int4")
    with pytest.raises(ValueError, match=r"quantization='dynamic_int8': SavedModel \(a version folder\) takes "
                                         r"int8, int4 or float8;.*export to a .tflite file"):
        export_saved_model(model, tmp_path / "cait" / "1", quantization="dynamic_int8")
    assert os.listdir(tmp_path) == []


def test_int8_of_a_model_trained_in_mixed_precision_is_quantised_from_its_float32_copy(logits_model, inputs,
                                                                                         tmp_path):
    # Before: the ONNX file held the mixed model's bfloat16 and float16 casts (tf2onnx printed hundreds of
    # warnings) and ONNX Runtime refused to load it; the SavedModel computed in bfloat16.
    import onnxruntime

    from keras_cait.models import with_dtype_policy

    mixed = with_dtype_policy(logits_model, "mixed_bfloat16")
    expected = keras_int8(logits_model).predict(inputs, verbose=0)
    export_onnx(mixed, tmp_path / "cait.onnx", quantization="int8")
    session = onnxruntime.InferenceSession(str(tmp_path / "cait.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": inputs})
    export_saved_model(mixed, tmp_path / "cait" / "1", quantization="int8")
    served = tf.saved_model.load(str(tmp_path / "cait" / "1")).signatures["serving_default"](
        images=tf.constant(inputs))["probabilities"].numpy()
    # As the float32 model's int8 copy (ONNX Runtime's order of sums aside, as in the test above).
    assert np.abs(logits - expected).max() < 5e-3 * np.abs(expected).max()
    np.testing.assert_allclose(served, tf.nn.softmax(expected).numpy(), rtol=1e-4, atol=1e-6)
    assert mixed.get_layer("patch_embedding").dtype_policy.name == "mixed_bfloat16"  # the caller's model is kept


def test_openvino_logits_are_those_of_keras(logits_model, inputs, tmp_path):
    import openvino  # the [test] extra: missing is an error, not a skip

    path = tmp_path / "cait.xml"
    export_openvino(logits_model, path)
    assert sorted(os.listdir(tmp_path)) == ["cait.bin", "cait.xml"]
    # Float32 arithmetic: on a CPU with bfloat16 OpenVINO computes in it by default.
    compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert [(i.get_any_name(), str(i.get_partial_shape())) for i in compiled.inputs] == [
        ("images", f"[?,{SIDE},{SIDE},3]")
    ]
    logits = compiled(inputs)[0]
    expected = logits_model.predict(inputs, verbose=0)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())

    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        export_openvino(logits_model, path)
    os.remove(path)  # a lone .bin is refused too: it would be replaced
    with pytest.raises(FileExistsError, match="cait.bin"):
        export_openvino(logits_model, path)
