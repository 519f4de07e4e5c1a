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
    assert keras.backend.backend() != "jax" and not layer._runs_fused_kernel(False, 196)


def test_against_timm_the_pre_softmax_bias_has_no_gradient_and_is_never_trained():
    """timm's TalkingHeadAttn (the reference) shows the premise: its `proj_l.bias` gets a zero gradient,
    since the softmax cancels a constant over the keys. Ours leaves that bias out of the computation
    and out of training (also after the layer is frozen and unfrozen), and every other output and
    gradient equals timm's."""
    import tensorflow as tf
    import torch
    from timm.models.cait import TalkingHeadAttn

    heads, channels, tokens = 4, 32, 7
    generator = torch.Generator().manual_seed(0)
    reference = TalkingHeadAttn(channels, num_heads=heads, qkv_bias=True)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.5, generator=generator)
    layer = TalkingHeadsAttention(num_heads=heads)
    layer.build((None, tokens, channels))
    pairs = {"qkv": reference.qkv, "pre_softmax_head_mix": reference.proj_l,
             "post_softmax_head_mix": reference.proj_w, "output_projection": reference.proj}
    for name, linear in pairs.items():
        dense = getattr(layer, name)
        dense.kernel.assign(linear.weight.detach().numpy().T)
        dense.bias.assign(linear.bias.detach().numpy())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, tokens, channels)).astype("float32")
    upstream = rng.normal(size=x.shape).astype("float32")

    y = reference(torch.from_numpy(x))
    (y * torch.from_numpy(upstream)).sum().backward()
    scale = max(float(p.grad.abs().max()) for p in reference.parameters())
    assert float(reference.proj_l.bias.grad.abs().max()) <= 1e-6 * scale

    layer.trainable = False
    layer.trainable = True
    bias = layer.pre_softmax_head_mix.bias
    assert all(weight is not bias for weight in layer.trainable_weights)
    assert any(weight is bias for weight in layer.non_trainable_weights)
    with tf.GradientTape() as tape:
        ours = layer(x)
        loss = tf.reduce_sum(ours * upstream)
    np.testing.assert_allclose(ours.numpy(), y.detach().numpy(), rtol=1e-4, atol=1e-4)
    gradients = dict(zip((w.path for w in layer.trainable_weights),
                         tape.gradient(loss, layer.trainable_weights)))
    assert len(gradients) == 7
    for name, linear in pairs.items():
        np.testing.assert_allclose(gradients[f"{layer.name}/{name}/kernel"].numpy(),
                                   linear.weight.grad.numpy().T, rtol=1e-3, atol=1e-3 * scale)
        if name != "pre_softmax_head_mix":
            np.testing.assert_allclose(gradients[f"{layer.name}/{name}/bias"].numpy(),
                                       linear.bias.grad.numpy(), rtol=1e-3, atol=1e-3 * scale)

    # Any value of the bias (a checkpoint's) changes nothing.
    bias.assign(rng.normal(size=heads).astype("float32") * 10)
    np.testing.assert_array_equal(layer(x).numpy(), ours.numpy())
