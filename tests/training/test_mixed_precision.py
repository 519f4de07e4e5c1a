"""Mixed precision ("mixed_float16", "mixed_bfloat16") and XLA for CaiT training."""

import keras
import numpy as np
import pytest

from keras_cait.training import adamw

HALF_POLICIES = ["mixed_float16", "mixed_bfloat16"]


def randomise(model, seed=0):
    """Moves every parameter off its initial value (LayerScale 0.1, norms 1/0, biases 0),
    so that every block and every attention path shapes the output."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = np.asarray(variable)
        scale = 0.2 if value.ndim <= 1 else 0.5 * value.std() + 1e-3
        variable.assign(value + rng.normal(0, scale, value.shape).astype(value.dtype))


def images(batch=4, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (batch, 32, 32, 3)).astype("float32")


@pytest.mark.parametrize("half", HALF_POLICIES)
def test_half_precision_forward_is_within_2e2_of_float32(half, policy, tiny_cait):
    reference = tiny_cait(classifier_activation=None, classes=10)
    randomise(reference)
    expected = keras.ops.convert_to_numpy(reference(images()))

    policy(half)
    model = tiny_cait(classifier_activation=None, classes=10)
    model.set_weights(reference.get_weights())
    got = keras.ops.convert_to_numpy(model(images()))

    relative = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert relative < 2e-2
    assert relative > 1e-6, "the half-precision model computed in float32"


@pytest.mark.parametrize("half", HALF_POLICIES)
@pytest.mark.parametrize(
    "head", [dict(include_top=True), dict(include_top=False, pooling="token"),
             dict(include_top=False, pooling="avg"), dict(include_top=False)],
    ids=["top", "token", "avg", "tokens"],
)
def test_outputs_layer_norms_and_logits_are_float32(half, head, policy, tiny_cait):
    policy(half)
    model = tiny_cait(**head)
    assert model(images()).dtype == "float32"
    block = model.get_layer("self_attention_block_0")
    block_norms = [block.attention_norm, block.mlp_norm]
    assert [norm.compute_dtype for norm in block_norms] == ["float32", "float32"]
    assert model.get_layer("final_norm").compute_dtype == "float32"
    # ... while the matmuls run in half precision.
    assert block.attention.qkv.compute_dtype == half.split("_")[1]
    assert block.mlp_dense_1.compute_dtype == half.split("_")[1]


def test_float16_training_uses_loss_scaling_and_bfloat16_does_not(policy, tiny_cait):
    policy("mixed_float16")
    model = tiny_cait(classes=4)
    model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, keras.optimizers.AdamW)

    policy("mixed_bfloat16")
    model = tiny_cait(classes=4)
    model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy")
    assert isinstance(model.optimizer, keras.optimizers.AdamW)


@pytest.mark.parametrize("half", HALF_POLICIES)
def test_thirty_steps_give_a_finite_decreasing_loss(half, policy, tiny_cait):
    policy(half)
    keras.utils.set_random_seed(0)
    model = tiny_cait(classes=4, drop_path_rate=0.1)
    model.compile(optimizer=adamw(model, 1e-3), loss="categorical_crossentropy")
    x = images(batch=16)
    y = keras.utils.to_categorical(np.arange(16) % 4, 4)
    losses = [float(model.train_on_batch(x, y)) for _ in range(30)]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_jit_compiled_training_and_inference_under_mixed_precision(policy, tiny_cait):
    policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = tiny_cait(classes=4)
    randomise(model)
    eager = keras.ops.convert_to_numpy(model.predict(images(), verbose=0))
    model.compile(
        optimizer=adamw(model, 1e-3), loss="categorical_crossentropy", jit_compile=True
    )
    assert model.jit_compile is True
    np.testing.assert_allclose(model.predict(images(), verbose=0), eager, atol=2e-2)
    y = keras.utils.to_categorical(np.arange(4) % 4, 4)
    losses = [float(model.train_on_batch(images(), y)) for _ in range(2)]
    assert np.all(np.isfinite(losses))
    assert not np.allclose(model.predict(images(), verbose=0), eager)
