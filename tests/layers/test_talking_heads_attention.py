import keras
import numpy as np
import pytest

from keras_cait.layers import TalkingHeads, TalkingHeadsAttention
from tests.layers.reference import randomize, talking_heads_attention


def _layer(heads=4, channels=32, tokens=7):
    layer = TalkingHeadsAttention(num_heads=heads)
    layer.build((None, tokens, channels))
    randomize(layer)
    x = np.random.RandomState(1).normal(size=(2, tokens, channels)).astype("float32")
    return layer, x


def test_computes_talking_heads_attention_as_the_paper_writes_it():
    layer, x = _layer()
    y, weights = layer(x, return_attention_scores=True)
    expected_y, expected_weights = talking_heads_attention(x, layer)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), expected_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, rtol=1e-4, atol=1e-5)
    assert weights.shape == (2, 4, 7, 7)


def test_the_heads_really_talk():
    layer, x = _layer()
    y = keras.ops.convert_to_numpy(layer(x))
    # With the mixes set to the identity the layer is ordinary multi-head attention:
    # a different answer, so the mixing is applied (and not, e.g., skipped or transposed away).
    for mix in (layer.pre_softmax_head_mix, layer.post_softmax_head_mix):
        mix.kernel.assign(np.eye(4, dtype="float32"))
        mix.bias.assign(np.zeros(4, "float32"))
    plain = keras.ops.convert_to_numpy(layer(x))
    assert np.abs(plain - y).max() > 1e-2
    weights = keras.ops.convert_to_numpy(layer(x, return_attention_scores=True)[1])
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_mixing_uses_the_kernel_as_input_by_output():
    layer, x = _layer()
    kernel = keras.ops.convert_to_numpy(layer.pre_softmax_head_mix.kernel)
    y = keras.ops.convert_to_numpy(layer(x))
    layer.pre_softmax_head_mix.kernel.assign(kernel.T)
    assert np.abs(keras.ops.convert_to_numpy(layer(x)) - y).max() > 1e-3


def test_channels_must_split_into_heads():
    with pytest.raises(ValueError, match="30 channels cannot be split into 4 heads"):
        TalkingHeadsAttention(num_heads=4).build((None, 5, 30))


def test_alias_and_config_round_trip():
    assert TalkingHeads is TalkingHeadsAttention
    layer, x = _layer()
    clone = TalkingHeadsAttention.from_config(layer.get_config())
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(clone(x)), keras.ops.convert_to_numpy(layer(x)))


def test_a_config_saved_before_fused_attention_loads_with_the_same_weights():
    layer, x = _layer()
    config = layer.get_config()
    assert config["fused_attention"] is None
    del config["fused_attention"]  # as .keras files written before the option hold it
    old = TalkingHeadsAttention.from_config(config)
    old.build(x.shape)
    assert old.fused_attention is None
    assert [w.path.split("/", 1)[1] for w in old.weights] == [
        "qkv/kernel", "qkv/bias",
        "pre_softmax_head_mix/kernel", "pre_softmax_head_mix/bias",
        "post_softmax_head_mix/kernel", "post_softmax_head_mix/bias",
        "output_projection/kernel", "output_projection/bias",
    ]
    old.set_weights(layer.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(old(x)), keras.ops.convert_to_numpy(layer(x)))


def test_the_fused_kernel_is_for_the_jax_backend_only():
    # tests/kernels/ runs the kernel through this layer on the JAX backend.
    layer, _ = _layer()
    layer.fused_attention = True
    assert keras.backend.backend() != "jax" and not layer._runs_fused_kernel(False)
