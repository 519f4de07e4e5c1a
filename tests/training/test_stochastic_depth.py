"""Stochastic depth as the recipe sets it: one rate for every block, whole samples dropped."""

import keras
import numpy as np

from keras_cait.model import ClassAttentionBlock, SelfAttentionBlock


def test_every_self_attention_block_gets_the_same_rate(tiny_cait):
    model = tiny_cait(depth=3, drop_path_rate=0.25)
    rates = [
        layer.stochastic_depth.rate
        for layer in model.layers
        if isinstance(layer, SelfAttentionBlock)
    ]
    assert rates == [0.25, 0.25, 0.25]  # CaiT keeps it constant over depth (timm: dpr = [rate] * depth)
    class_blocks = [layer for layer in model.layers if isinstance(layer, ClassAttentionBlock)]
    assert [block.stochastic_depth.rate for block in class_blocks] == [0.0, 0.0]


def test_drops_whole_samples_at_the_rate_in_training_and_nothing_at_inference(tiny_cait):
    model = tiny_cait(drop_path_rate=0.25)
    drop_path = model.get_layer("self_attention_block_0").stochastic_depth
    branch = np.random.default_rng(0).normal(size=(4000, 5, 8)).astype("float32")

    out = keras.ops.convert_to_numpy(drop_path(branch, training=True))
    kept = np.all(np.isclose(out, branch / 0.75, rtol=1e-6), axis=(1, 2))
    dropped = np.all(out == 0, axis=(1, 2))
    assert np.all(kept | dropped), "a sample was dropped only in part"
    assert abs(dropped.mean() - 0.25) < 0.03  # 4.4 standard deviations of a binomial

    np.testing.assert_array_equal(drop_path(branch, training=False), branch)


def test_the_model_is_deterministic_at_inference_and_random_in_training(tiny_cait):
    keras.utils.set_random_seed(0)
    model = tiny_cait(drop_path_rate=0.5)
    images = np.random.default_rng(1).uniform(0, 255, (64, 32, 32, 3)).astype("float32")
    first, second = model(images, training=False), model(images, training=False)
    np.testing.assert_array_equal(first, second)
    reference = tiny_cait(drop_path_rate=0.0)
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(first, reference(images), rtol=1e-5, atol=1e-6)
    assert not np.allclose(model(images, training=True), first)
