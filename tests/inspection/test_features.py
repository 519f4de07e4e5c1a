"""keras_cait.inspection.features: the outputs of chosen self-attention blocks, as timm's forward_intermediates."""

import re

import keras
import numpy as np
import pytest

from keras_cait.inspection.features import feature_extractor, forward_intermediates
from keras_cait.weights import load_weights_file


def _timm_input(images):
    """NHWC 0..255 images as timm takes them: NCHW, normalised with the ImageNet mean and std."""
    import torch
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    x = (images / np.float32(255.0) - np.float32(IMAGENET_DEFAULT_MEAN)) / np.float32(IMAGENET_DEFAULT_STD)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype="float32"))


def _assert_close(actual, expected, what):
    actual, expected = keras.ops.convert_to_numpy(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    error = np.max(np.abs(actual - expected)) / np.max(np.abs(expected))
    assert error <= 1e-5, f"{what}: max |Δ| / max |timm| = {error:.1e}"


@pytest.fixture
def pair(timm_reference, tiny_cait):
    """A random timm CaiT (3 self-attention blocks, 3×4 patches) and the Keras model with its weights."""
    reference = timm_reference.tiny_model(img_size=(48, 64), depth=3)
    model = tiny_cait(input_shape=(48, 64, 3), depth=3, include_top=False)
    load_weights_file(model, timm_reference.save(reference))
    return reference, model, timm_reference.images(2, 48, 64).astype("float32")


@pytest.mark.large
@pytest.mark.parametrize(
    "indices, norm, output_format",
    [
        (None, False, "NLC"),  # every block
        (2, True, "NHWC"),  # the last two
        ([0, -1], True, "NLC"),
        ([-1, 0, 2], False, "NHWC"),  # in block order, each once
        ([1], True, "NHWC"),
    ],
)
def test_intermediates_match_timm(pair, indices, norm, output_format):
    import torch

    reference, model, images = pair
    with torch.no_grad():
        final, expected = reference.forward_intermediates(
            _timm_input(images), indices=indices, norm=norm,
            output_fmt="NLC" if output_format == "NLC" else "NCHW",
        )
    if output_format == "NHWC":
        expected = [x.permute(0, 2, 3, 1) for x in expected]

    got_final, got = forward_intermediates(model, images, indices, norm, output_format)

    assert len(got) == len(expected)
    for i, (actual, wanted) in enumerate(zip(got, expected)):
        _assert_close(actual, wanted.numpy(), f"intermediate {i}")
    _assert_close(got_final, final.numpy(), "final tokens")


def test_feature_extractor_shares_the_models_layers_and_stops_at_the_last_block_asked(pair):
    _, model, images = pair
    extractor = feature_extractor(model, indices=[0], output_format="NHWC")
    names = {layer.name for layer in extractor.layers}
    assert "self_attention_block_0" in names
    assert not names & {"self_attention_block_1", "self_attention_block_2", "class_token"}
    assert extractor.get_layer("self_attention_block_0") is model.get_layer("self_attention_block_0")
    before = keras.ops.convert_to_numpy(extractor(images))
    gamma = model.get_layer("self_attention_block_0").attention_layer_scale.gamma
    gamma.assign(gamma * 2.0)  # training the model changes what the extractor sees
    assert not np.allclose(keras.ops.convert_to_numpy(extractor(images)), before)


@pytest.mark.large
def test_feature_extractor_exports_as_a_saved_model(pair, tmp_path):
    import tensorflow as tf

    _, model, images = pair
    extractor = feature_extractor(model, indices=2, norm=True, output_format="NHWC")
    expected = [keras.ops.convert_to_numpy(x) for x in extractor(images)]
    extractor.export(str(tmp_path / "features"), format="tf_saved_model", verbose=False)

    loaded = tf.saved_model.load(str(tmp_path / "features"))  # kept: its variables live in it
    served = loaded.serve(tf.constant(images))

    assert [tuple(x.shape) for x in served] == [(2, 3, 4, 64), (2, 3, 4, 64)]
    for actual, wanted in zip(served, expected):
        np.testing.assert_allclose(actual.numpy(), wanted, rtol=1e-5, atol=1e-5)


def test_intermediates_only_is_a_list_even_of_one(pair):
    _, model, images = pair
    features = forward_intermediates(model, images, indices=[1], intermediates_only=True)
    assert isinstance(features, list) and [tuple(x.shape) for x in features] == [(2, 12, 64)]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(indices=4), r"indices=4: .* from 1 to the model's 3 self-attention blocks"),
        (dict(indices=[0, 3]), r"3 is not a block index; .* from -3 to 2"),
        (dict(indices=[]), r"at least one block"),
        (dict(output_format="NCHW"), r"output_format='NCHW': must be one of \('NLC', 'NHWC'\)"),
    ],
)
def test_bad_arguments_are_refused_naming_what_is_allowed(pair, arguments, message):
    with pytest.raises(ValueError, match=message):
        feature_extractor(pair[1], **arguments)


@pytest.mark.parametrize("indices", [True, 2.0, "all", [0, True]])
def test_indices_that_are_no_block_indices_are_refused_naming_them(tiny_cait, indices):
    # Before: True took the last block and [0, True] blocks 0 and 1 (bools as ints); 2.0 was
    # TypeError: 'float' object is not iterable; 'all' named its letter 'a'.
    with pytest.raises(ValueError, match=rf"^indices={re.escape(repr(indices))}: (True is )?not a block index"):
        feature_extractor(tiny_cait(), indices=indices)


@pytest.mark.parametrize("arguments, argument, message", [
    (dict(output_format="nhwc", indices=4), "indices", "indices=4: an integer takes the last n blocks, so it must be "
     "from 1 to the model's 2 self-attention blocks, e.g. 4"),
    (dict(indices=[0, 3]), "indices", "indices=[0, 3]: 3 is not a block index; the model has 2 self-attention "
     "blocks, so use integers from -2 to 1 (negative counts from the last), or an integer n for the last n"),
    (dict(indices=[]), "indices", "indices=[]: name at least one block, e.g. [-1]"),
    (dict(indices="all"), "indices", "indices='all': not a block index; give an integer n for the last n blocks "
     "(e.g. 4), a list of block indices (e.g. [0, -1]), or None for every block"),
    (dict(output_format="NCHW"), "output_format", "output_format='NCHW': must be one of ('NLC', 'NHWC'); 'NLC' for "
     "(batch, tokens, channels) or 'NHWC' for (batch, rows, cols, channels)"),
    (dict(output_format=None), "output_format", "output_format=None: must be one of ('NLC', 'NHWC'); 'NLC' for "
     "(batch, tokens, channels) or 'NHWC' for (batch, rows, cols, channels)"),
])
def test_bad_indices_and_output_formats_are_argument_errors_and_nhwc_is_taken_in_any_case(tiny_cait, arguments,
                                                                                          argument, message):
    from keras_cait.errors import ArgumentError

    model = tiny_cait()
    with pytest.raises(ArgumentError) as raised:
        feature_extractor(model, **arguments)
    assert raised.value.argument == argument and str(raised.value) == message
    # Before: output_format='nhwc' was refused for its case alone.
    extractor = feature_extractor(model, indices=1, output_format="nhwc")
    assert len(extractor.outputs[0].shape) == 4


def test_images_forward_intermediates_cannot_take_are_refused_by_the_model_s_own_check(tiny_cait):
    # Before: Keras' `Input 0 with name 'images' of layer 'cait_intermediates' is incompatible`, a model
    # the caller never made.
    model = tiny_cait()
    with pytest.raises(ValueError, match=r"^images of shape \(32, 32, 3\): cait takes images of shape "
                                         r"\(batch, 32, 32, 3\); for one image add the batch axis: images\[None\]"):
        forward_intermediates(model, np.zeros((32, 32, 3)))
    with pytest.raises(ValueError, match=r"^images of shape \(1, 64, 64, 3\): cait takes images of shape"):
        forward_intermediates(model, np.zeros((1, 64, 64, 3)))
    final, features = forward_intermediates(model, [np.zeros((32, 32, 3))], indices=1)  # a list is an array
    assert [tuple(x.shape) for x in features] == [(1, 4, 64)]


@pytest.mark.parametrize("intermediates_only", ["no", None, 2])
def test_intermediates_only_that_is_no_bool_is_refused_naming_it(tiny_cait, intermediates_only):
    # Before: 'no' (truthy) returned the features alone, silently; None returned both.
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as raised:
        forward_intermediates(tiny_cait(), np.zeros((1, 32, 32, 3)), intermediates_only=intermediates_only)
    assert raised.value.argument == "intermediates_only"
    assert str(raised.value) == (f"intermediates_only={intermediates_only!r}: must be True (the features alone) or "
                                 f"False (the model's output and the features), not {type(intermediates_only).__name__}")


@pytest.mark.parametrize("call", [lambda model: feature_extractor(model),
                                  lambda model: forward_intermediates(model, np.zeros((1, 32, 32, 3)))])
def test_a_model_that_is_no_cait_is_refused_naming_model(tiny_cait, call):
    """A bare ValueError before, which `except ArgumentError` missed; a model that wraps a CaiT too."""
    from keras_cait.errors import ArgumentError

    inputs = keras.Input((32, 32, 3))
    wrapper = keras.Model(inputs, tiny_cait()(inputs), name="wrapper")
    with pytest.raises(ArgumentError) as raised:
        call(wrapper)
    assert raised.value.argument == "model" and raised.value.usage
    assert str(raised.value) == ("model=<wrapper>: has no SelfAttentionBlock, so it is no CaiT; give a CaiT built by "
                                 "build_cait or CaiT_* (not a model that wraps one)")
