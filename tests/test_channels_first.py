"""keras.config.image_data_format() == "channels_first": NCHW input, as keras.applications take it."""

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.weights import load_weights_file


@pytest.fixture
def channels_first():
    keras.config.set_image_data_format("channels_first")
    yield
    keras.config.set_image_data_format("channels_last")


@pytest.mark.parametrize("pooling", [None, "avg"])
def test_nchw_model_matches_timm(channels_first, timm_reference, tiny_cait, pooling):
    # 32×48 images: rows and columns differ, so a swapped height and width cannot pass.
    reference = timm_reference.tiny_model(img_size=(32, 48), global_pool="avg" if pooling else "token")
    images = timm_reference.images(2, 32, 48)
    expected, _ = timm_reference.outputs(reference, images)
    model = tiny_cait(input_shape=(3, 32, 48), pooling=pooling, classifier_activation=None)
    load_weights_file(model, timm_reference.save(reference))

    assert model.input_shape == (None, 3, 32, 48)
    logits = keras.ops.convert_to_numpy(model(images.transpose(0, 3, 1, 2), training=False))
    timm_reference.assert_matches(logits, expected, "logits")


def test_constructors_default_to_nchw_input(channels_first):
    model = keras_cait.CaiT_XXS24(weights=None)
    assert model.input_shape == (None, 3, 224, 224)
    assert model.get_layer("position_embedding").grid_size == (14, 14)


def test_a_channels_last_shape_under_channels_first_is_refused_with_both_fixes(channels_first, tiny_cait):
    with pytest.raises(ValueError, match=r"\(224, 224, 3\): .*'channels_first'.*e\.g\. \(3, 224, 224\).*channels_last"):
        tiny_cait(input_shape=(224, 224, 3))


@pytest.mark.large
def test_saved_weights_are_the_same_in_either_format(channels_first, tiny_cait, tmp_path):
    nchw = tiny_cait(input_shape=(3, 32, 32))
    nchw.save_weights(str(tmp_path / "nchw.weights.h5"))
    keras.config.set_image_data_format("channels_last")
    nhwc = tiny_cait()
    nhwc.load_weights(str(tmp_path / "nchw.weights.h5"))
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    keras.config.set_image_data_format("channels_first")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(nhwc(images)),
        keras.ops.convert_to_numpy(nchw(images.transpose(0, 3, 1, 2))),
        rtol=1e-6, atol=1e-7,
    )


def test_a_channels_first_cait_is_resized_and_loaded_at_another_size_as_a_channels_last_one(channels_first,
                                                                                            tiny_cait, tmp_path):
    """at_resolution wrote a channels-last input shape, (None, 64, 64, 32) for (None, 3, 32, 32), and
    failed in TensorFlow's BroadcastTo; image_side read (3, 32) as an oblong image."""
    from keras_cait.models import at_resolution, image_side, load_classifier

    model = tiny_cait(input_shape=(3, 32, 32))
    keras.config.set_image_data_format("channels_last")
    twin = tiny_cait()
    twin.set_weights(model.get_weights())
    keras.config.set_image_data_format("channels_first")
    images = np.random.default_rng(0).uniform(0, 255, (2, 48, 48, 3)).astype("float32")

    assert image_side(model) == 32
    resized = at_resolution(model, 48)
    assert resized.input_shape == (None, 3, 48, 48)
    np.testing.assert_allclose(resized.predict(images.transpose(0, 3, 1, 2), verbose=0),
                               at_resolution(twin, 48).predict(images, verbose=0), atol=1e-5)
    model.save(tmp_path / "nchw.keras")
    assert load_classifier(str(tmp_path / "nchw.keras"), image_size=48).input_shape == (None, 3, 48, 48)
