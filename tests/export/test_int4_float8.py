"""Keras int4 and float8 (model.quantize) through the SavedModel export; refused where they do not convert."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_cait.export import export_onnx, export_saved_model

# Keras warns for every layer it cannot quantise when a user quantises by hand.
pytestmark = pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")


def keras_quantized(model, mode):
    """What a user does by hand: a copy of `model`, quantised by Keras."""
    copy = keras.Model.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    copy.quantize(mode)
    return copy


@pytest.mark.parametrize("mode, stored", [("int4", tf.int8), ("float8", tf.float32)])
def test_saved_model_serves_the_keras_quantized_model(model, images, tmp_path, mode, stored):
    expected = keras_quantized(model, mode).predict(images, verbose=0)
    export_saved_model(model, tmp_path / "cait" / "1", quantization=mode)
    checkpoint = tf.train.load_checkpoint(str(tmp_path / "cait" / "1" / "variables" / "variables"))
    dtypes = set(checkpoint.get_variable_to_dtype_map().values())
    assert stored in dtypes  # int4: two kernels to an int8 byte; float8: float32 kernels and scales
    loaded = tf.saved_model.load(str(tmp_path / "cait" / "1"))
    served = loaded.signatures["serving_default"](images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-7)
    # Quantised for real: the outputs moved away from float32's.
    assert np.abs(served - model.predict(images, verbose=0)).max() > 1e-6


@pytest.mark.parametrize("mode", ["int4", "float8"])
def test_onnx_refuses_int4_and_float8_naming_the_saved_model(model, tmp_path, mode):
    with pytest.raises(ValueError, match=rf"quantization='{mode}': .*export a SavedModel for 'int4' or 'float8'"):
        export_onnx(model, tmp_path / "cait.onnx", quantization=mode)
    assert os.listdir(tmp_path) == []
