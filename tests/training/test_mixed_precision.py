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


@pytest.mark.large
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


@pytest.mark.large
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


def _block_update(block_class, policy_name, stream, weights=None):
    """(block's output − its input) as float32, and the block's weights."""
    from keras_cait.models.blocks import ClassAttentionBlock

    keras.mixed_precision.set_global_policy(policy_name)
    block = block_class(num_heads=4, init_values=1e-5)
    if block_class is ClassAttentionBlock:
        inputs = [stream, stream[:, :1]]
        block.build([stream.shape, stream[:, :1].shape])
        residual = stream[:, :1]
    else:
        inputs = stream
        block.build(stream.shape)
        residual = stream
    if weights is not None:
        block.set_weights(weights)
    output = block(inputs)
    update = keras.ops.convert_to_numpy(keras.ops.cast(output, "float32")) - residual
    return keras.backend.standardize_dtype(output.dtype), update, block.get_weights()


@pytest.mark.parametrize("half", HALF_POLICIES)
@pytest.mark.parametrize("kind", ["self_attention", "class_attention"])
def test_residual_stream_and_layer_scale_stay_float32_like_torch_autocast(half, kind, policy):
    """timm under torch.autocast: gamma is a float32 parameter, so `x + gamma * branch` is
    float32 although the branch's matmuls ran in half. A block at its 1e-5 LayerScale
    init adds an update ~1e-5 of the stream: in a half-precision stream it would vanish
    (bfloat16 keeps 8 bits), so most elements would come out unchanged."""
    from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock

    block_class = SelfAttentionBlock if kind == "self_attention" else ClassAttentionBlock
    # std 0.5: a fresh model's stream after the patch embedding has std ~0.58
    # (768 inputs of std ~1 times weights of std 1/sqrt(3 * 768)).
    stream = np.random.default_rng(0).normal(0, 0.5, size=(2, 16, 64)).astype("float32")
    keras.utils.set_random_seed(0)
    _, expected, weights = _block_update(block_class, "float32", stream)
    dtype, update, _ = _block_update(block_class, half, stream, weights)

    assert np.mean(update != 0) >= 0.9
    relative = np.linalg.norm(update - expected) / np.linalg.norm(expected)
    assert relative <= 5e-2
    assert dtype == "float32"
    # ... and the branch really ran in half precision.
    assert relative > 1e-5


@pytest.mark.parametrize("half", HALF_POLICIES)
def test_stream_between_blocks_is_float32_in_a_built_model(half, policy, tiny_cait):
    policy(half)
    model = tiny_cait(classes=4)
    for name in ("position_embedding", "self_attention_block_0", "self_attention_block_1",
                 "class_token", "class_attention_block_0", "class_attention_block_1"):
        output = model.get_layer(name).output
        assert keras.backend.standardize_dtype(output.dtype) == "float32", name
