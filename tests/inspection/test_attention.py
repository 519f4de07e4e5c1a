"""keras_cait.inspection.attention: class- and self-attention maps read with the model's own weights."""

import gc
import json
import os
import subprocess
import sys
import weakref

import keras
import numpy as np
import pytest

from keras_cait.inspection import attention
from keras_cait.inspection.attention import attention_maps
from keras_cait.layers import ClassAttention
from keras_cait.models.architecture import build_cait
from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock

# A non-square patch grid (4 × 6) so that rows and columns cannot be confused.
INPUT_SHAPE = (32, 48, 3)
PATCH = 8
GRID = (4, 6)
HEADS = 4


def randomise(model, seed=0):
    """Every weight random and large enough that no block is near the identity."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, 0.3, weight.shape).astype("float32"))


def small_cait(seed=0, **kwargs):
    args = dict(embed_dim=32, depth=2, num_heads=HEADS, init_values=0.5, patch_size=PATCH,
                input_shape=INPUT_SHAPE, classes=10)
    model = build_cait(**{**args, **kwargs})
    randomise(model, seed)
    return model


@pytest.fixture(scope="module")
def model():
    return small_cait()


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).uniform(0, 255, (3,) + INPUT_SHAPE).astype("float32")


def layer_norm(x, gamma, beta, epsilon=1e-6):
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def class_attention_weights(layer, tokens):
    """S_h = softmax(q_class k^T / sqrt(d)) in float64 numpy from the layer's weights."""
    w = {name: [np.asarray(v, np.float64) for v in getattr(layer, name).weights]
         for name in ("query", "key", "value")}
    batch, count, channels = tokens.shape
    head_dim = channels // layer.num_heads

    def heads(x):
        return x.reshape(batch, -1, layer.num_heads, head_dim).transpose(0, 2, 1, 3)

    query = heads(tokens[:, :1] @ w["query"][0] + w["query"][1])
    key = heads(tokens @ w["key"][0] + w["key"][1])
    return softmax(query @ key.transpose(0, 1, 3, 2) / np.sqrt(head_dim))  # (B, H, 1, N)


def blocks_of(model, kind):
    return [layer for layer in model.layers if isinstance(layer, kind)]


def block_inputs(model, blocks, images):
    """The values each block receives in the model, read from the model's own graph."""
    probe = keras.Model(model.input, [block.input for block in blocks])
    return probe.predict(images, verbose=0)


class TestClassAttentionLayer:
    def test_scores_are_the_softmax_weights_of_the_class_query(self):
        layer = ClassAttention(num_heads=HEADS)
        tokens = np.random.default_rng(2).normal(0, 1, (2, 1 + 24, 32)).astype("float32")
        layer.build(tokens.shape)
        randomise(layer, seed=3)

        _, scores = layer(tokens, return_attention_scores=True)
        scores = keras.ops.convert_to_numpy(scores)

        expected = class_attention_weights(layer, tokens.astype(np.float64))
        assert scores.shape == (2, HEADS, 1, 25)
        np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-5)
        # The weights are far from uniform, so a constant answer would fail.
        assert scores.max() > 3 / 25


class TestBlocksUnderFunctionalCalls:
    def test_blocks_report_output_and_scores_shapes_symbolically(self):
        patches = keras.Input((24, 32))
        class_token = keras.Input((1, 32))
        _, self_scores = SelfAttentionBlock(HEADS)(patches, return_attention_scores=True)
        _, class_scores = ClassAttentionBlock(HEADS)([patches, class_token], return_attention_scores=True)
        assert self_scores.shape == (None, HEADS, 24, 24)
        assert class_scores.shape == (None, HEADS, 1, 25)


class TestAttentionMaps:
    @pytest.mark.large
    def test_class_attention_maps_equal_a_numpy_recomputation(self, model, images):
        class_blocks = blocks_of(model, ClassAttentionBlock)
        maps = attention_maps(model, images)

        assert len(maps.class_attention) == len(class_blocks) == 2
        assert maps.grid_size == GRID
        for block, (patches, class_token), grid_map, self_weight in zip(
            class_blocks, block_inputs(model, class_blocks, images),
            maps.class_attention, maps.class_token_weight,
        ):
            tokens = np.concatenate([class_token, patches], axis=1).astype(np.float64)
            norm = [np.asarray(w, np.float64) for w in block.attention_norm.weights]
            expected = class_attention_weights(block.attention, layer_norm(tokens, *norm))[:, :, 0]

            assert grid_map.shape == (len(images), HEADS) + GRID
            np.testing.assert_allclose(self_weight, expected[:, :, 0], rtol=1e-4, atol=1e-6)
            # Patches are numbered row by row over the grid.
            np.testing.assert_allclose(
                grid_map, expected[:, :, 1:].reshape((len(images), HEADS) + GRID), rtol=1e-4, atol=1e-6
            )
            np.testing.assert_allclose(grid_map.sum((2, 3)) + self_weight, 1.0, rtol=1e-5)

    def test_maps_follow_the_patches_when_the_image_moves(self):
        # Without position embedding a CaiT is equivariant to permutations of the
        # patches, so rolling the image by whole patches must roll every map alike.
        model = small_cait(seed=4)
        model.get_layer("position_embedding").embeddings.assign(np.zeros((1, 24, 32), "float32"))
        image = np.random.default_rng(5).uniform(0, 255, (1,) + INPUT_SHAPE).astype("float32")
        moved = np.roll(image, shift=(PATCH, 2 * PATCH), axis=(1, 2))

        before = attention_maps(model, image, self_attention_blocks=0)
        after = attention_maps(model, moved, self_attention_blocks=0)

        for grid_before, grid_after in zip(before.class_attention, after.class_attention):
            np.testing.assert_allclose(np.roll(grid_before, (1, 2), axis=(2, 3)), grid_after, rtol=1e-4, atol=1e-6)
            assert not np.allclose(grid_before, grid_after)
        # After the roll, patch j of the grid is the original patch source[j].
        source = np.roll(np.arange(24).reshape(GRID), (1, 2), axis=(0, 1)).reshape(-1)
        moved_scores = before.self_attention[0][:, :, source[:, None], source[None, :]]
        np.testing.assert_allclose(moved_scores, after.self_attention[0], rtol=1e-4, atol=1e-6)

    @pytest.mark.large
    def test_maps_change_with_the_image_and_each_image_is_independent(self, model, images):
        together = attention_maps(model, images)
        alone = [attention_maps(model, images[i : i + 1]) for i in range(len(images))]

        for i, single in enumerate(alone):
            for grid_together, grid_alone in zip(together.class_attention, single.class_attention):
                np.testing.assert_allclose(grid_together[i], grid_alone[0], rtol=1e-4, atol=1e-6)
        first, second = together.class_attention[0][0], together.class_attention[0][1]
        assert np.abs(first - second).max() > 1e-3

    def test_self_attention_maps_equal_the_blocks_own_scores(self, model, images):
        self_blocks = blocks_of(model, SelfAttentionBlock)
        maps = attention_maps(model, images, self_attention_blocks=[-1, 0])

        assert list(maps.self_attention) == [-1, 0]
        inputs = block_inputs(model, self_blocks, images)
        for index in (0, -1):
            _, scores = self_blocks[index](inputs[index], return_attention_scores=True)
            assert maps.self_attention[index].shape == (len(images), HEADS, 24, 24)
            np.testing.assert_allclose(
                maps.self_attention[index], keras.ops.convert_to_numpy(scores), rtol=1e-4, atol=1e-6
            )
        assert not np.allclose(maps.self_attention[0], maps.self_attention[-1])
        assert len(attention_maps(model, images, self_attention_blocks="all").self_attention) == 2

    def test_the_plain_model_is_left_as_it_was(self, images):
        model = small_cait(seed=6)
        config, layers, outputs = model.to_json(), len(model.layers), len(model.outputs)
        predictions = model.predict(images, verbose=0)

        attention_maps(model, images, self_attention_blocks="all")

        assert model.to_json() == config
        assert (len(model.layers), len(model.outputs)) == (layers, outputs)
        np.testing.assert_array_equal(model.predict(images, verbose=0), predictions)

    @pytest.mark.large
    def test_maps_use_the_models_current_weights_not_a_copy(self, images):
        model = small_cait(seed=7)
        before = attention_maps(model, images)
        randomise(model.get_layer("class_attention_block_0"), seed=8)
        after = attention_maps(model, images)

        assert not np.allclose(before.class_attention[0], after.class_attention[0])
        block = model.get_layer("class_attention_block_0")
        patches, class_token = block_inputs(model, [block], images)
        tokens = np.concatenate([class_token, patches], axis=1).astype(np.float64)
        norm = [np.asarray(w, np.float64) for w in block.attention_norm.weights]
        expected = class_attention_weights(block.attention, layer_norm(tokens, *norm))
        np.testing.assert_allclose(
            after.class_attention[0], expected[:, :, 0, 1:].reshape((len(images), HEADS) + GRID),
            rtol=1e-4, atol=1e-6,
        )

    @pytest.mark.large
    def test_the_attention_model_is_cached_and_freed_with_the_model(self, images):
        model = small_cait(seed=9)
        attention_maps(model, images)
        first = attention._ATTENTION_MODELS[model][()]
        attention_maps(model, images)
        assert attention._ATTENTION_MODELS[model][()] is first

        alive = weakref.ref(model)
        del model, first
        gc.collect()
        assert alive() is None

    def test_images_of_any_dtype_are_traced_once(self, images):
        """uint8, float64 and a list each traced the attention model again: TensorFlow's retracing warning
        from the fifth call on."""
        model = small_cait(seed=11)
        pixels = np.asarray(images, dtype="float32")
        for batch in (pixels, pixels.astype("uint8"), pixels.astype("float64"), pixels.tolist()):
            attention_maps(model, batch)
        (attention_model,) = attention._ATTENTION_MODELS[model].values()
        assert attention_model.predict_function.experimental_get_tracing_count() == 1

    @pytest.mark.parametrize(
        "kwargs", [dict(include_top=False), dict(include_preprocessing=False, pooling="token"),
                   dict(include_top=False, pooling="avg")]
    )
    def test_works_without_top_or_preprocessing(self, images, kwargs):
        model = small_cait(seed=10, **kwargs)
        maps = attention_maps(model, images, self_attention_blocks=1)
        assert [m.shape for m in maps.class_attention] == [(len(images), HEADS) + GRID] * 2
        assert maps.self_attention[1].shape == (len(images), HEADS, 24, 24)

    @pytest.mark.large
    def test_a_backbone_inside_another_model_is_found(self, model, images):
        backbone = small_cait(seed=11, include_top=False, pooling="token")
        classifier = keras.Sequential([keras.Input(INPUT_SHAPE), backbone, keras.layers.Dense(3)])
        np.testing.assert_array_equal(
            attention_maps(classifier, images).class_attention[1],
            attention_maps(backbone, images).class_attention[1],
        )


    @pytest.mark.large
    def test_the_layers_in_front_of_a_nested_cait_run_before_it(self, images):
        """A `Rescaling` in front (Keras' transfer-learning pattern) was skipped: the maps were those of
        the unscaled images; a `Resizing` in front was refused with the backbone's input size."""
        backbone = small_cait(seed=12, include_top=False, pooling="token")
        scaled = keras.Input(INPUT_SHAPE)
        classifier = keras.Model(scaled, keras.layers.Dense(3)(backbone(keras.layers.Rescaling(255.0)(scaled))))
        small = keras.Input((INPUT_SHAPE[0] // 2, INPUT_SHAPE[1] // 2, 3))
        resized = keras.Model(small, backbone(keras.layers.Resizing(*INPUT_SHAPE[:2], interpolation="nearest")(small)))
        twice = keras.Sequential([keras.Input(INPUT_SHAPE), classifier, keras.layers.Dense(2)])  # nested twice
        expected = attention_maps(backbone, images, self_attention_blocks=[0, -1])
        halves = images[:, ::2, ::2]
        upsampled = np.repeat(np.repeat(halves, 2, axis=1), 2, axis=2)
        for model, given, truth in ((classifier, images / 255, expected), (twice, images / 255, expected),
                                    (resized, halves, attention_maps(backbone, upsampled, self_attention_blocks=[0, -1]))):
            maps = attention_maps(model, given, self_attention_blocks=[0, -1])
            for got, want in zip(maps.class_attention + [maps.self_attention[-1]],
                                 truth.class_attention + [truth.self_attention[-1]]):
                np.testing.assert_allclose(got, want, atol=1e-6)


class TestErrors:
    def test_a_model_without_class_attention_is_refused(self, images):
        model = keras.Sequential([keras.Input(INPUT_SHAPE), keras.layers.Flatten(), keras.layers.Dense(3)])
        with pytest.raises(ValueError, match="no ClassAttentionBlock, in itself or in a model inside it"):
            attention_maps(model, images)

    def test_a_model_without_class_attention_is_an_argument_error_naming_model(self, images):
        """Before: a plain ValueError without `argument`."""
        from keras_cait.errors import ArgumentError

        model = keras.Sequential([keras.Input(INPUT_SHAPE), keras.layers.Flatten(), keras.layers.Dense(3)],
                                 name="flat")
        with pytest.raises(ArgumentError) as raised:
            attention_maps(model, images)
        assert raised.value.argument == "model" and raised.value.usage
        assert str(raised.value) == (
            "model=<Sequential 'flat'>: flat has no ClassAttentionBlock, in itself or in a model inside it, so it has "
            "no class attention to show; pass a CaiT built by build_cait or CaiT_*, or a model that contains one")

    def test_images_of_the_wrong_shape_are_refused(self, model, images):
        """With the model's own line (`check_images`): a batch of another size was once told to add the
        batch axis."""
        with pytest.raises(ValueError, match=r"\(32, 48, 3\): cait takes .*add the batch axis: images\[None\]"):
            attention_maps(model, images[0])
        with pytest.raises(ValueError, match=r"\(3, 48, 32, 3\): cait takes images of shape \(batch, 32, 48, 3\); "
                                             "resize and centre-crop them to 32×48"):
            attention_maps(model, images.transpose(0, 2, 1, 3))

    @pytest.mark.parametrize("blocks", [2, -3, [0, "1"], 1.0])
    def test_unknown_self_attention_blocks_are_refused(self, model, images, blocks):
        with pytest.raises(ValueError, match="model has 2 self-attention blocks.*from -2 to 1"):
            attention_maps(model, images, self_attention_blocks=blocks)


    @pytest.mark.parametrize("blocks, message", [
        (True, "self_attention_blocks=True: True is not a block index; the model has 2 self-attention blocks; use "
               "integers from -2 to 1, a list of them, or 'all'"),
        ([0, np.True_], "self_attention_blocks=[0, np.True_]: np.True_ is not a block index; the model has 2 "
                        "self-attention blocks; use integers from -2 to 1, a list of them, or 'all'"),
    ])
    def test_a_bool_is_no_self_attention_block(self, model, images, blocks, message):
        """True was taken as block 1 (a bool is an int)."""
        from keras_cait.errors import ArgumentError

        with pytest.raises(ArgumentError) as raised:
            attention_maps(model, images, self_attention_blocks=blocks)
        assert str(raised.value) == message and raised.value.argument == "self_attention_blocks"

    def test_a_numpy_array_of_self_attention_blocks_is_taken_as_a_list(self, model, images):
        """It was `The truth value of an array with more than one element is ambiguous` (from == 'all')."""
        maps = attention_maps(model, images, self_attention_blocks=np.array([0, -1]))
        assert list(maps.self_attention) == [0, -1]


_ON_JAX = """
import json, sys
import numpy as np
from keras_cait.inspection.attention import attention_maps
from keras_cait.models.architecture import build_cait
model = build_cait(**json.loads(sys.argv[1]))
model.load_weights(sys.argv[2])
maps = attention_maps(model, np.load(sys.argv[3]), self_attention_blocks=-1)
np.savez(sys.argv[4], *maps.class_attention, maps.self_attention[-1])
"""


@pytest.mark.large
def test_the_jax_backend_gives_the_same_maps(tmp_path, model, images):
    args = dict(embed_dim=32, depth=2, num_heads=HEADS, init_values=0.5, patch_size=PATCH,
                input_shape=INPUT_SHAPE, classes=10)
    model.save_weights(tmp_path / "model.weights.h5")
    np.save(tmp_path / "images.npy", images)
    subprocess.run(
        [sys.executable, "-c", _ON_JAX, json.dumps(args), str(tmp_path / "model.weights.h5"),
         str(tmp_path / "images.npy"), str(tmp_path / "maps.npz")],
        env={**os.environ, "KERAS_BACKEND": "jax"}, check=True,
    )
    expected = attention_maps(model, images, self_attention_blocks=-1)
    got = np.load(tmp_path / "maps.npz")
    for i, value in enumerate(expected.class_attention + [expected.self_attention[-1]]):
        np.testing.assert_allclose(got[f"arr_{i}"], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("call, words", [
    (lambda model, images: attention_maps("model.keras", images),
     "model='model.keras': attention_maps takes a Keras model, not a name or a path; load it first: "
     "keras_cait.models.load_classifier('model.keras')"),
    (lambda model, images: attention_maps(images, model), "model=<ndarray>: attention_maps takes a Keras model, not "
                                                          "a ndarray"),
    (lambda model, images: attention_maps(model, images, batch_size=0), "batch_size=0: must be a positive integer"),
    (lambda model, images: attention_maps(model, images, batch_size="2"), "batch_size='2': must be a positive integer"),
])
def test_a_model_or_batch_size_attention_maps_cannot_take_is_refused_naming_it(call, words, tiny_cait):
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as raised:
        call(tiny_cait(), np.zeros((1, *tiny_cait().input_shape[1:]), "float32"))
    assert str(raised.value).startswith(words)
