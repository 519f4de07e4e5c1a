"""The functional model: its outputs, arguments, serialisation and the reference's constants."""

import re

import keras
import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

import keras_cait
from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.layers.reference import randomize

WIDTH = TINY_CAIT["embed_dim"]


def _images(n=2, side=TINY_SIZE, seed=0):
    return np.random.RandomState(seed).uniform(0, 255, (n, side, side, 3)).astype("float32")


@pytest.fixture
def random_cait(tiny_cait):
    """`tiny_cait` with every weight random; keyword arguments override its arguments."""

    def build(seed=0, **kwargs):
        model = tiny_cait(**kwargs)
        randomize(model, seed=seed, scale=0.2)
        return model

    return build


def test_is_a_functional_model_with_an_images_input():
    model = keras_cait.CaiT_XXS24(weights=None)
    assert isinstance(model, keras.Model) and model.input.name == "images"
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)
    assert model.count_params() == 11_956_264
    blocks = [layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)]
    class_blocks = [layer for layer in model.layers if isinstance(layer, ClassAttentionBlock)]
    assert len(blocks) == 24 and len(class_blocks) == 2


@pytest.mark.large
def test_constants_of_the_reference():
    model = keras_cait.CaiT_S36(weights=None, drop_path_rate=0.2)
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.LayerNormalization)]
    assert len(norms) == 2 * 38 + 1 and all(norm.epsilon == 1e-6 for norm in norms)
    gammas = [w for w in model.weights if w.path.endswith("layer_scale/gamma")]
    assert len(gammas) == 2 * 38 and all(np.allclose(keras.ops.convert_to_numpy(g), 1e-6) for g in gammas)
    rates = {b.stochastic_depth.rate for b in model.layers if isinstance(b, SelfAttentionBlock)}
    assert rates == {0.2}  # constant over depth, as in the paper


def test_mlp_uses_the_exact_erf_gelu(random_cait):
    """x + γ · fc2(GELU(fc1(LN(x)))) with GELU's erf form, not keras.ops.gelu's default tanh form."""
    block = random_cait().get_layer("self_attention_block_0")
    numpy = keras.ops.convert_to_numpy
    x = np.linspace(-4, 4, 9 * WIDTH, dtype="float32").reshape(1, 9, WIDTH)
    pre = numpy(block.mlp_norm(x)) @ numpy(block.mlp_dense_1.kernel) + numpy(block.mlp_dense_1.bias)

    def residual(hidden):
        branch = hidden @ numpy(block.mlp_dense_2.kernel) + numpy(block.mlp_dense_2.bias)
        return x + numpy(block.mlp_layer_scale.gamma) * branch

    exact = residual(0.5 * pre * (1 + erf(pre / np.sqrt(2))))
    tanh_form = residual(0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre**3))))
    output = numpy(block._mlp_residual(x, training=False))
    np.testing.assert_allclose(output, exact, rtol=1e-5, atol=1e-5)
    assert not np.allclose(output, tanh_form, rtol=1e-5, atol=1e-5)  # the two forms are told apart


@pytest.mark.parametrize("precision, half", [("mixed_bfloat16", ml_dtypes.bfloat16), ("mixed_float16", np.float16)])
def test_gelu_is_computed_in_float32_and_rounded_once_under_a_mixed_policy(random_cait, policy, monkeypatch,
                                                                          precision, half):
    """README: GELU is computed in float32 and rounded once to the half dtype, as PyTorch's half GELU.

    The reference: the exact erf GELU (float64) of the half-rounded fc1 output, rounded once to the
    half dtype. Wherever a float32 error of a few ulps cannot move that rounding (nearly every
    element), what fc2 receives must be it; the same GELU computed in the half dtype rounds each
    of its steps and differs on these inputs.
    """
    policy(precision)
    block = random_cait().get_layer("self_attention_block_0")
    numpy = keras.ops.convert_to_numpy
    x = np.linspace(-4, 4, 9 * WIDTH, dtype="float32").reshape(1, 9, WIDTH)
    received = []
    fc2 = block.mlp_dense_2.call
    monkeypatch.setattr(block.mlp_dense_2, "call",
                        lambda hidden, *args, **kwargs: received.append(hidden) or fc2(hidden, *args, **kwargs))
    block._mlp_residual(x, training=False)
    (hidden,) = received
    fc1 = block.mlp_dense_1(block.mlp_norm(x))
    assert keras.backend.standardize_dtype(fc1.dtype) == keras.backend.standardize_dtype(hidden.dtype) == \
        np.dtype(half).name

    pre = numpy(fc1).astype("float64")
    exact = 0.5 * pre * (1 + erf(pre / np.sqrt(2)))
    reference = exact.astype(half)
    # Elements whose rounding to the half dtype a relative error of 2^-20 (float32's is ~2^-23 per
    # step) cannot change: there float32-then-round equals the reference exactly.
    settled = (exact * (1 - 2.0**-20)).astype(half) == (exact * (1 + 2.0**-20)).astype(half)
    assert settled.mean() > 0.95
    got = numpy(hidden)
    np.testing.assert_array_equal(got[settled], reference[settled])
    assert np.all((got == (exact * (1 - 2.0**-20)).astype(half)) | (got == (exact * (1 + 2.0**-20)).astype(half)))

    in_half = numpy(keras.ops.gelu(fc1, approximate=False))  # the same GELU, each step in the half dtype
    differs = (in_half != reference) & settled
    assert differs.mean() > 0.05, differs.mean()  # the two are told apart on these inputs


@pytest.mark.large
def test_class_attention_stage_leaves_the_patches_unchanged(random_cait):
    model = random_cait(include_top=False)
    images = _images()
    tokens = model.predict(images, verbose=0)
    assert tokens.shape == (2, 1 + 4, WIDTH)
    after_self_attention = keras.Model(model.input, model.get_layer("self_attention_block_1").output)
    norm = model.get_layer("final_norm")
    expected_patches = keras.ops.convert_to_numpy(norm(after_self_attention.predict(images, verbose=0)))
    np.testing.assert_allclose(tokens[:, 1:], expected_patches, rtol=1e-5, atol=1e-5)


@pytest.mark.large
def test_pooling_modes_agree_with_the_token_sequence(tiny_cait, random_cait):
    full = random_cait(include_top=False)
    weights = full.get_weights()
    images = _images()
    tokens = full.predict(images, verbose=0)
    token = tiny_cait(include_top=False, pooling="token")
    token.set_weights(weights)
    np.testing.assert_allclose(token.predict(images, verbose=0), tokens[:, 0], rtol=1e-5, atol=1e-6)
    avg = tiny_cait(include_top=False, pooling="avg")
    avg.set_weights(weights)
    np.testing.assert_allclose(avg.predict(images, verbose=0), tokens[:, 1:].mean(1), rtol=1e-5, atol=1e-6)


@pytest.mark.large
def test_head_on_the_class_token_with_softmax_or_logits(tiny_cait, random_cait):
    logits_model = random_cait(classifier_activation=None, classes=7)
    probs_model = tiny_cait(classes=7)
    probs_model.set_weights(logits_model.get_weights())
    logits = logits_model.predict(_images(), verbose=0)
    probs = probs_model.predict(_images(), verbose=0)
    np.testing.assert_allclose(probs, keras.ops.convert_to_numpy(keras.ops.softmax(logits)), rtol=1e-5, atol=1e-6)
    features = tiny_cait(include_top=False, pooling="token")
    features.set_weights(logits_model.get_weights()[:-2])
    head = logits_model.get_layer("predictions")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(head(features.predict(_images(), verbose=0))), logits, rtol=1e-5, atol=1e-5
    )


@pytest.mark.large
def test_include_preprocessing_normalises_0_255_inputs_with_imagenet_statistics(tiny_cait, random_cait):
    inside = random_cait()
    outside = tiny_cait(include_preprocessing=False)
    outside.set_weights(inside.get_weights())
    images = _images()
    normalised = (images / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(
        inside.predict(images, verbose=0), outside.predict(normalised.astype("float32"), verbose=0),
        rtol=1e-4, atol=1e-6,
    )
    np.testing.assert_allclose(
        inside.predict(images.astype("uint8"), verbose=0), inside.predict(images.astype("uint8").astype("float32"), verbose=0)
    )


def test_input_tensor_is_used_as_the_input(tiny_cait):
    tensor = keras.Input((48, 32, 3), name="my_images")
    model = tiny_cait(input_shape=None, input_tensor=tensor)
    assert model.input is tensor and model.get_layer("position_embedding").grid_size == (3, 2)


@pytest.mark.large
def test_keras_file_round_trip_gives_identical_outputs(random_cait, tmp_path):
    model = random_cait(drop_path_rate=0.1)
    path = str(tmp_path / "cait.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(_images(), verbose=0), model.predict(_images(), verbose=0))
    assert loaded.get_layer("self_attention_block_1").stochastic_depth.rate == 0.1


def test_a_keras_file_written_when_the_blocks_lived_in_architecture_loads_without_a_warning(random_cait, tmp_path):
    """A .keras file names each layer's module; files written before the blocks and CaiTModel's pieces
    moved out of `keras_cait.models.architecture` name that module, and load by the registered names."""
    import json
    import warnings
    import zipfile

    model = random_cait()
    path = tmp_path / "cait.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = files["config.json"].decode()
    assert '"keras_cait.models.blocks"' in config
    files["config.json"] = config.replace('"keras_cait.models.blocks"', '"keras_cait.models.architecture"').encode()
    old = tmp_path / "old.keras"
    with zipfile.ZipFile(old, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    assert '"keras_cait.models.blocks"' not in json.dumps(json.loads(files["config.json"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = keras.models.load_model(old)
    np.testing.assert_array_equal(loaded.predict(_images(), verbose=0), model.predict(_images(), verbose=0))
    assert type(loaded.get_layer("self_attention_block_0")) is SelfAttentionBlock


@pytest.mark.large
def test_get_config_from_config_rebuilds_the_same_model(random_cait):
    model = random_cait()
    clone = keras.Model.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone.predict(_images(), verbose=0), model.predict(_images(), verbose=0))
    assert [layer.name for layer in clone.layers] == [layer.name for layer in model.layers]


@pytest.mark.parametrize("block_class", [SelfAttentionBlock, ClassAttentionBlock])
def test_blocks_serialise(block_class):
    block = block_class(num_heads=2, init_values=0.3, drop_path_rate=0.1, mlp_ratio=2.0)
    clone = block_class.from_config(block.get_config())
    assert clone.get_config() == block.get_config()


def test_drop_path_only_acts_in_training(random_cait):
    model = random_cait(drop_path_rate=0.5, include_top=False)
    images = _images(4)
    inference = keras.ops.convert_to_numpy(model(images, training=False))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images, training=False)), inference)
    training = keras.ops.convert_to_numpy(model(images, training=True))
    assert np.abs(training - inference).max() > 0.01 * np.abs(inference).max()


# === Stochastic depth as the recipe sets it: one rate for every block, whole samples dropped ===
# (the layer itself: tests/layers/test_stochastic_depth.py)


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


@pytest.mark.parametrize(
    "name, expected",
    [("cait_xxs24_224", ("XXS24", 224)), ("cait_xxs24", ("XXS24", None)), ("XXS24", ("XXS24", None)),
     ("xxs24", ("XXS24", None)), ("CaiT_S24_384", ("S24", 384)), (" m48_448 ", ("M48", 448))],
)
def test_a_model_name_in_any_of_its_forms(name, expected):
    from keras_cait.models.variants import parse_model_name

    assert parse_model_name(name) == expected


@pytest.mark.parametrize("name", ["cait_xxs25", "cait_s24_big", "cait_s24_0", "vit_s24", "S24_224_1", ""])
def test_an_unknown_model_name_lists_the_valid_ones(name):
    from keras_cait.models.variants import cait, parse_model_name

    every_variant = re.escape(", ".join(keras_cait.VARIANTS))
    for call, argument in ((parse_model_name, "model"), (lambda n: cait(n, weights=None), "variant")):
        with pytest.raises(ValueError, match=rf"^{argument}={re.escape(repr(name))}: unknown CaiT model; use a "
                                             rf"variant \({every_variant}\).*cait_xxs24_224$") as refused:
            call(name)
        assert (refused.value.argument, refused.value.value, refused.value.usage) == (argument, name, True)


def test_a_model_name_at_a_resolution_no_patch_grid_fits_is_blamed_on_the_name():
    """`load_classifier('cait_s24_200')` blamed `input_shape=(200, 200, 3)`, which the caller never gave."""
    from keras_cait.errors import ArgumentError
    from keras_cait.models import load_classifier

    side = int(np.random.default_rng().choice([n for n in range(17, 400) if n % 16]))
    nearest = max(1, int(side / 16 + 0.5)) * 16
    with pytest.raises(ArgumentError) as refused:
        load_classifier(f"cait_s24_{side}", weights=None)
    assert str(refused.value) == (f"model='cait_s24_{side}': its resolution {side} is not a multiple of the patch "
                                  f"size 16; e.g. model='cait_s24_{nearest}'")


@pytest.mark.large
def test_cait_by_name_takes_its_resolution_as_the_input_size():
    from keras_cait.models.variants import cait

    assert cait("cait_xxs24_384", weights=None).input_shape == (None, 384, 384, 3)
    assert cait("xxs24", weights=None).input_shape == (None, 224, 224, 3)


# === Class names ===


def test_class_names_travel_in_the_keras_file_and_through_every_copy(tiny_cait, tmp_path):
    from keras_cait.training import lora, transfer

    rng = np.random.RandomState(3)
    names = tuple(f"class-{i}" for i in rng.permutation(7))
    model = tiny_cait(classes=7)
    assert model.class_names is None
    model.class_names = list(names)
    assert model.class_names == names

    model.save(tmp_path / "named.keras")
    assert keras.models.load_model(tmp_path / "named.keras").class_names == names
    assert transfer.at_resolution(model, 48).class_names == names
    assert lora.merge_lora(lora.enable_lora(model, 2)).class_names == names

    tiny_cait(classes=7).save(tmp_path / "unnamed.keras")
    assert keras.models.load_model(tmp_path / "unnamed.keras").class_names is None


@pytest.mark.parametrize(
    "names, error",
    [(["a", "b"], "has 2 names but cait has 3 classes"), (["a", "b", "a"], r"repeats \['a'\]"),
     ("abc", "give a list of str"), ([1, 2, 3], "give a list of str"),
     ({"0": "a", "1": "b", "2": "c"}, "is a dict .*; give a list of str, one name per class in index order"),
     (["a", "", "c"], r"holds an empty name \(index 1\); give each class a name of at least one character")],
    ids=["too_few", "repeated", "a_string", "not_str", "id2label", "empty"],
)
def test_class_names_are_one_str_per_class(tiny_cait, names, error, tmp_path):
    """One check (`checked_class_names`) wherever names are given: the model's attribute,
    `with_class_names` and the SavedModel export."""
    from keras_cait.errors import ArgumentError
    from keras_cait.export import export_saved_model
    from keras_cait.models.architecture import with_class_names

    model = tiny_cait(classes=3)
    plain = keras.Model(model.inputs, model.outputs, name=model.name)
    for name_them in (lambda: setattr(model, "class_names", names), lambda: with_class_names(plain, names),
                      lambda: export_saved_model(model, tmp_path / "1", class_names=names)):
        with pytest.raises(ArgumentError, match=rf"^class_names=.*: .*{error}") as caught:
            name_them()
        assert caught.value.argument == "class_names"
    assert not (tmp_path / "1").exists()
    with pytest.raises(ValueError, match="not class scores"):
        tiny_cait(include_top=False).class_names = ["a"]


def test_with_class_names_names_any_functional_classifier_in_place_or_over_its_layers(tiny_cait, tmp_path):
    from keras_cait.models.architecture import CaiTModel, with_class_names
    from keras_cait.training.callbacks import save_model

    model = tiny_cait(classes=2)
    assert with_class_names(model, ["dog", "cat"]) is model and model.class_names == ("dog", "cat")
    plain = keras.Model(model.inputs, model.outputs, name="plain")
    assert with_class_names(plain, None) is plain
    named = with_class_names(plain, ["cat", "dog"])
    assert type(named) is CaiTModel and named.class_names == ("cat", "dog")
    assert all(a is b for a, b in zip(named.layers, plain.layers)), "the same layers, nothing copied"
    save_model(named, tmp_path / "named.keras")
    assert keras.models.load_model(tmp_path / "named.keras").class_names == ("cat", "dog")


@pytest.mark.large
def test_class_names_of_a_model_its_own_else_imagenet_s_for_1000_classes(tiny_cait):
    from keras_cait.models.class_names import class_names_of
    from keras_cait.preprocessing import imagenet_classes

    named = tiny_cait(classes=2)
    named.class_names = ["dog", "cat"]
    assert class_names_of(named) == ["dog", "cat"]
    assert class_names_of(named, wordnet_ids=True) == ["dog", "cat"]
    imagenet = tiny_cait(classes=1000)
    assert class_names_of(imagenet) == [name for _, name in imagenet_classes()]
    assert class_names_of(imagenet, wordnet_ids=True)[281] == "tabby (n02123045)"
    assert class_names_of(tiny_cait(classes=7)) is None


# === Images that do not fit the model (every call path) ===


@pytest.mark.parametrize(
    "shape, fix",
    [
        ((1, 16, 64, 3), r"resize and centre-crop them to 32×32 .* input_shape=\(16, 64, 3\)"),
        ((1, 32, 32, 1), r"3 channels; convert grayscale to RGB"),
        ((1, 32, 32, 4), r"3 channels; drop the alpha channel"),
        ((32, 32, 3), r"for one image add the batch axis: images\[None\]"),
        ((1, 1, 32, 32, 3), r"reshape them to one batch axis"),
        ((0, 32, 32, 3), r"a batch of 0 images"),
    ],
    ids=["same_patch_count", "one_channel", "rgba", "rank_3", "rank_5", "empty_batch"],
)
@pytest.mark.parametrize("path", ["call", "predict", "predict_dataset", "as_a_layer"])
def test_images_of_another_shape_are_refused(tiny_cait, shape, fix, path):
    import keras
    import numpy as np
    import tensorflow as tf

    model = tiny_cait(name="tiny")
    images = np.zeros(shape, "float32")
    calls = {
        "call": lambda: model(images),
        "predict": lambda: model.predict(images, verbose=0),
        # A dataset of these batches (one batch of them, whatever their rank).
        "predict_dataset": lambda: model.predict(
            tf.data.Dataset.from_tensors(images), verbose=0
        ),
        "as_a_layer": lambda: keras.layers.Dense(2)(model(keras.Input(batch_shape=shape))),
    }
    with pytest.raises(ValueError, match=fix) as error:
        calls[path]()

    assert f"images of shape {shape}: " in str(error.value)
    assert "tiny takes images of shape (batch, 32, 32, 3)" in str(error.value)


def test_the_image_check_adds_no_op_to_the_traced_graph(tiny_cait):
    import keras
    import tensorflow as tf

    model = tiny_cait()
    unchecked = keras.Model(model.inputs, model.outputs)  # Keras' own Functional, same layers
    spec = tf.TensorSpec((None, 32, 32, 3), tf.float32)

    def ops(m):
        graph = tf.function(lambda x: m(x, training=False)).get_concrete_function(spec).graph
        return sorted(op.type for op in graph.get_operations())

    assert ops(model) == ops(unchecked)


def test_the_image_check_survives_saving(tiny_cait, tmp_path):
    import keras
    import numpy as np

    tiny_cait().save(tmp_path / "tiny.keras")
    loaded = keras.models.load_model(tmp_path / "tiny.keras")

    with pytest.raises(ValueError, match="3 channels; convert grayscale to RGB"):
        loaded.predict(np.zeros((1, 32, 32, 1)), verbose=0)


def test_images_with_other_channels_than_a_non_rgb_model_are_refused(tiny_cait):
    import numpy as np

    model = tiny_cait(input_shape=(32, 32, 2), include_preprocessing=False)

    with pytest.raises(ValueError, match=r"images of shape \(1, 32, 32, 3\): .* 2 channels; give "
                                         r"2-channel images, or build the model with "
                                         r"input_shape=\(32, 32, 3\) and include_preprocessing=False"):
        model.predict(np.zeros((1, 32, 32, 3)), verbose=0)


@pytest.mark.parametrize("images, spec", [
    ((1, 16, 64, 3), (None, None, None, 3)),  # as many patches as 32×32
    ((1, 32, 32, 1), (None, None, None, None)),
], ids=["16x64", "one_channel"])
def test_a_shape_left_open_until_run_time_is_checked_in_the_graph(tiny_cait, images, spec):
    import re

    import numpy as np
    import tensorflow as tf

    model = tiny_cait()
    right = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")

    def pipeline(*batches):
        return tf.data.Dataset.from_generator(
            lambda: iter(batches), output_signature=tf.TensorSpec(spec, tf.float32)
        )

    # The second batch's shape differs from the first's: Keras traces predict again with the
    # shape relaxed to the spec's, and the static check sees (None, None, None, ...).
    shown = ", ".join(str(side) for side in images)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"images of shape [{shown}]: ")):
        model.predict(pipeline(right, np.zeros(images, "float32"), right[:1]), verbose=0)
    np.testing.assert_allclose(
        model.predict(pipeline(right, right[:1]), verbose=0),
        model.predict(np.concatenate([right, right[:1]]), verbose=0), rtol=1e-5, atol=1e-7,
    )


@pytest.mark.parametrize("images", [
    np.array([["cat.jpg"]]), np.array([b"\x89PNG"], dtype=object),
], ids=["file_names", "encoded_bytes"])
def test_text_given_to_predict_is_a_type_error_with_the_fix(tiny_cait, images):
    with pytest.raises(TypeError, match="takes pixels as numbers .*load_image"):
        tiny_cait().predict(images, verbose=0)


@pytest.mark.parametrize("classes, line", [
    ("2", "classes='2': must be a positive integer, the number of classes, not str; e.g. classes=10"),
    (0, "classes=0: must be a positive integer, the number of classes; e.g. classes=10"),
    (2.0, "classes=2.0: must be a positive integer, the number of classes, not float; e.g. classes=10"),
    (True, "classes=True: must be a positive integer, the number of classes, not bool; e.g. classes=10"),
])
def test_a_constructor_refuses_classes_that_are_no_positive_integer_naming_classes(classes, line):
    """They used to reach Keras' Dense and its `units` ("2", 0, 2.0), or build a 1-class head (True)."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        keras_cait.CaiT_XXS24(weights=None, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=classes)
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("classes", classes, True)
    assert str(refused.value) == line


def test_classes_is_checked_once_for_the_builder_and_a_new_head(tiny_cait):
    from keras_cait.errors import ArgumentError
    from keras_cait.models.surgery import with_new_head

    backbone = tiny_cait(include_top=False, pooling="token")
    for build in (lambda: tiny_cait(classes="2"), lambda: with_new_head(backbone, classes="2")):
        with pytest.raises(ArgumentError) as refused:
            build()
        assert str(refused.value) == "classes='2': must be a positive integer, the number of classes, not str; e.g. classes=10"
    # A numpy integer is an integer (Keras' Dense refused np.int64 as `units`); without a head
    # `classes` is not read.
    assert tiny_cait(classes=np.int64(2)).output_shape == (None, 2)
    assert tiny_cait(classes="2", include_top=False, pooling="token").output_shape == (None, WIDTH)


@pytest.mark.parametrize("rate, line", [
    ("0.1", "drop_path_rate='0.1': must be a number in [0, 1), not str; e.g. 0.1"),
    (1.0, "drop_path_rate=1.0: must be a number in [0, 1); e.g. 0.1"),
    (-0.1, "drop_path_rate=-0.1: must be a number in [0, 1); e.g. 0.1"),
    (None, "drop_path_rate=None: must be a number in [0, 1), not NoneType; e.g. 0.1"),
])
def test_a_constructor_refuses_a_drop_path_rate_outside_0_to_1_naming_it(rate, line):
    """"0.1" used to be a bare TypeError ('<=' not supported between 'float' and 'str')."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        keras_cait.CaiT_XXS24(weights=None, input_shape=(TINY_SIZE, TINY_SIZE, 3), drop_path_rate=rate)
    assert (refused.value.argument, refused.value.usage) == ("drop_path_rate", True)
    assert str(refused.value) == line


@pytest.mark.parametrize("options, line", [
    (dict(dtype="bfloat"), "dtype='bfloat': not a Keras dtype policy; give float32, mixed_float16, mixed_bfloat16, "
                           "bfloat16, float16 or a keras.DTypePolicy"),
    (dict(include_top=False, pooling="cls"), "pooling='cls': unknown pooling; give one of None, 'token', 'avg'"),
])
def test_a_constructor_refuses_a_dtype_or_pooling_it_cannot_build_naming_it(options, line):
    """Keras' chained error (two tracebacks, `dtype` unnamed) and a plain ValueError before."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        keras_cait.CaiT_XXS24(weights=None, input_shape=(TINY_SIZE, TINY_SIZE, 3), **options)
    assert str(refused.value) == line
    assert refused.value.__context__ is None or refused.value.__suppress_context__  # one traceback


@pytest.mark.parametrize("size, line", [
    (dict(num_heads=0), "num_heads=0: must be a positive integer; e.g. num_heads=4"),
    (dict(num_heads=5), "num_heads=5: must divide embed_dim=32 into heads of equal width; e.g. one of 1, 2, 4, 8, 16"),
    (dict(depth="2"), "depth='2': must be a non-negative integer, the self-attention blocks, not str; e.g. depth=24"),
    (dict(depth=2.5), "depth=2.5: must be a non-negative integer, the self-attention blocks, not float; e.g. depth=24"),
    (dict(embed_dim=None), "embed_dim=None: must be a positive integer, the width of the tokens, not NoneType; "
                           "e.g. embed_dim=192"),
    (dict(patch_size=0), "patch_size=0: must be a positive integer; e.g. patch_size=16"),
    (dict(class_attention_depth=-1), "class_attention_depth=-1: must be a non-negative integer; "
                                     "e.g. class_attention_depth=2"),
    (dict(mlp_ratio="4"), "mlp_ratio='4': must be a number above 0, not str; e.g. mlp_ratio=4.0"),
    (dict(mlp_ratio=float("nan")), "mlp_ratio=nan: must be a number above 0; e.g. mlp_ratio=4.0"),
    # Keras' "Received an invalid value for `units`" before
    (dict(mlp_ratio=0.01), "mlp_ratio=0.01: gives an MLP of no units: int(embed_dim=32 × 0.01) = 0; give at least "
                           "0.0312, e.g. mlp_ratio=4.0"),
    (dict(init_values=-1e-5), "init_values=-1e-05: must be a number of at least 0, LayerScale's first gamma; "
                              "e.g. init_values=1e-05"),
])
def test_the_builder_refuses_an_architecture_number_that_builds_no_cait_naming_it(size, line):
    """A JSON config's str, a fraction of a block or 0 heads used to end in a bare ZeroDivisionError or
    TypeError inside a layer, or (mlp_ratio='4', init_values='1e-5') to be taken."""
    from keras_cait.errors import ArgumentError
    from keras_cait.models.architecture import build_cait

    arguments = dict(embed_dim=32, depth=1, num_heads=2, init_values=1e-5, input_shape=(32, 32, 3), classes=3)
    with pytest.raises(ArgumentError) as refused:
        build_cait(**{**arguments, **size})
    assert (refused.value.argument, refused.value.usage) == (next(iter(size)), True)
    assert str(refused.value) == line
    model = build_cait(**{**arguments, "depth": np.int64(1), "mlp_ratio": np.float32(2), "class_attention_depth": 0})
    assert model.get_layer("self_attention_block_0").mlp_ratio == 2.0


@pytest.mark.parametrize("options, line", [
    (dict(name="a/b"), "name='a/b': must be a model's name: a str, not empty, without '/'; e.g. name='cait'"),
    (dict(name=3), "name=3: must be a model's name: a str, not empty, without '/'; e.g. name='cait'"),
    (dict(name=""), "name='': must be a model's name: a str, not empty, without '/'; e.g. name='cait'"),
    (dict(input_tensor=np.zeros((1, 32, 32, 3)), input_shape=None),
     "input_tensor=<ndarray>: must be a Keras tensor, the output of keras.Input or a layer, not ndarray; "
     "e.g. input_tensor=keras.Input((224, 224, 3)), or give input_shape instead"),
])
def test_the_builder_refuses_a_name_or_input_tensor_keras_cannot_take_naming_it(tiny_cait, options, line):
    """Keras' own errors before: the input tensor's whole array printed; name='' taken."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        tiny_cait(**options)
    assert str(refused.value) == line


@pytest.mark.parametrize("input_shape, line", [
    (32, "input_shape=32: must be (height, width, channels), a tuple of ints, not int; e.g. input_shape=(224, 224, 3)"),
    ("32", "input_shape='32': must be (height, width, channels), a tuple of ints, not str; "
           "e.g. input_shape=(224, 224, 3)"),
    ((32.0, 32.0, 3), "input_shape=(32.0, 32.0, 3): must be (height, width, channels), a tuple of ints, not of "
                      "float; e.g. input_shape=(224, 224, 3)"),
    (("32", "32", "3"), "input_shape=('32', '32', '3'): must be (height, width, channels), a tuple of ints, not of "
                        "str; e.g. input_shape=(224, 224, 3)"),
])
def test_the_builder_refuses_an_input_shape_that_is_no_tuple_of_ints_naming_it(tiny_cait, input_shape, line):
    """32 used to be "'int' object is not iterable", "32" Keras' "Cannot convert ('3', '2') to a shape"."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        tiny_cait(input_shape=input_shape)
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("input_shape", input_shape, True)
    assert str(refused.value) == line


def test_an_input_shape_of_numpy_integers_or_a_list_builds_and_wrong_tuples_keep_their_messages(tiny_cait):
    side = np.int64(TINY_SIZE)
    assert tiny_cait(input_shape=(side, side, np.int64(3))).input_shape == (None, TINY_SIZE, TINY_SIZE, 3)
    assert tiny_cait(input_shape=[TINY_SIZE, TINY_SIZE, 3]).input_shape == (None, TINY_SIZE, TINY_SIZE, 3)
    with pytest.raises(ValueError, match=re.escape("input_shape=(32, 32): must be (height, width, channels)")):
        tiny_cait(input_shape=(TINY_SIZE, TINY_SIZE))
    with pytest.raises(ValueError, match="sides must be positive multiples of the patch size 16"):
        tiny_cait(input_shape=(33, TINY_SIZE, 3))
