"""Keras int4 and float8 (model.quantize) through the SavedModel export; refused where they do not convert."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_cait.export import export_onnx, export_saved_model

# Keras warns for every layer it cannot quantise when a user quantises by hand.
pytestmark = [
    pytest.mark.large,
    pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method"),
]


def keras_quantized(model, mode):
    """What a user does by hand: a copy of `model`, quantised by Keras."""
    copy = keras.Model.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    copy.quantize(mode)
    return copy


def float8_casts(nodes):
    """How many of the NodeDefs `nodes` cast a tensor to float8_e4m3fn."""
    return sum(1 for node in nodes
               if node.op == "Cast" and tf.dtypes.as_dtype(node.attr["DstT"].type).name == "float8_e4m3fn")


def quantized_for_real(quantized, path, mode):
    """Raises unless the SavedModel at `path` stores (int4) or computes (float8) what Keras' `mode` model does."""
    if mode == "int4":
        checkpoint = tf.train.load_checkpoint(str(path / "variables" / "variables"))
        # Two int4 kernels to an int8 byte; the float model stores no int8 at all.
        assert tf.int8 in set(checkpoint.get_variable_to_dtype_map().values())
        return
    # float8 keeps float32 kernels (and scales); its Dense layers round their inputs and kernels
    # to float8_e4m3fn as they run. The served graph must do as many of these roundings as the
    # Keras float8 model's forward pass: a float32 export does none.
    spec = tf.TensorSpec([None, *quantized.inputs[0].shape[1:]], tf.float32)
    keras_graph = tf.function(lambda images: quantized(images, training=False)).get_concrete_function(spec).graph
    expected = float8_casts(keras_graph.as_graph_def().node)
    assert expected > 0
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    served = [float8_casts(function.node_def) for function in proto.meta_graphs[0].graph_def.library.function]
    assert expected in served, f"Keras' float8 model casts {expected} tensors to float8, the SavedModel {max(served)}"


@pytest.mark.parametrize("mode", ["int4", "float8"])
def test_saved_model_serves_the_keras_quantized_model(model, images, tmp_path, mode):
    quantized = keras_quantized(model, mode)
    expected = quantized.predict(images, verbose=0)
    export_saved_model(model, tmp_path / "cait" / "1", quantization=mode)
    quantized_for_real(quantized, tmp_path / "cait" / "1", mode)
    loaded = tf.saved_model.load(str(tmp_path / "cait" / "1"))
    served = loaded.signatures["serving_default"](images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-7)
    # Quantised for real: the outputs moved away from float32's.
    assert np.abs(served - model.predict(images, verbose=0)).max() > 1e-6


@pytest.mark.parametrize("mode", ["int4", "float8"])
def test_onnx_refuses_int4_and_float8_naming_the_saved_model(model, tmp_path, mode):
    with pytest.raises(ValueError, match=rf"quantization='{mode}': .*For {mode}, export to a SavedModel version folder"):
        export_onnx(model, tmp_path / "cait.onnx", quantization=mode)
    assert os.listdir(tmp_path) == []
