"""Bad input gets a clear error naming the bad value and what is allowed (issue 2, point 7).

Apart from the one about the network, every error must come before any download:
`urlopen` fails the test if called, and the cache must stay empty.
"""

import os
import socket

import numpy as np
import pytest

import keras_cait
from keras_cait.weights import load_weights_file
from keras_cait.weights.registry import CHECKPOINTS, HUB_URL_ENV


@pytest.fixture
def offline(no_network, keras_cache):
    yield
    assert not os.path.exists(keras_cache) or not os.listdir(keras_cache)


@pytest.fixture
def tiny_checkpoint(timm_reference):
    """A valid timm checkpoint, of a CaiT that is none of the released variants."""
    return timm_reference.save(timm_reference.tiny_model())


@pytest.mark.parametrize("weights", [None, "imagenet"])
@pytest.mark.parametrize(
    "input_shape, suggestion",
    [((230, 230, 3), "e.g. (224, 224, 3)"), ((224, 210, 3), "e.g. (224, 208, 3)")],
)
def test_sides_must_be_multiples_of_16(offline, weights, input_shape, suggestion):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=weights, input_shape=input_shape)

    message = str(error.value)
    assert f"input_shape {input_shape}" in message
    assert "multiples of the patch size 16" in message
    assert suggestion in message


@pytest.mark.parametrize("weights", ["imagenet", "checkpoint"])
def test_pretrained_weights_need_3_channels(offline, tiny_checkpoint, weights):
    weights = tiny_checkpoint if weights == "checkpoint" else weights

    with pytest.raises(ValueError, match=r"input_shape=\(224, 224, 1\): pretrained weights need 3 "
                                         r"channels .*\(224, 224, 3\); for 1 channels use weights=None, "
                                         r"include_preprocessing=False"):
        keras_cait.CaiT_XXS24(weights=weights, input_shape=(224, 224, 1))


def test_imagenet_normalisation_needs_3_channels(offline):
    with pytest.raises(ValueError, match=r"input_shape \(224, 224, 1\): include_preprocessing normalises "
                                         r"RGB .* use include_preprocessing=False"):
        keras_cait.CaiT_XXS24(weights=None, input_shape=(224, 224, 1))


def test_one_channel_is_fine_without_pretrained_weights_and_normalisation(offline, tiny_cait):
    model = tiny_cait(input_shape=(32, 32, 1), include_preprocessing=False)

    assert model.input_shape == (None, 32, 32, 1)


def test_imagenet_head_has_1000_classes(offline):
    with pytest.raises(ValueError, match=r"classes=10: the ImageNet head has 1000 classes.*"
                                         r"include_top=False.*weights=None"):
        keras_cait.CaiT_XXS24(weights="imagenet", classes=10)


@pytest.mark.parametrize("weights", ["imagenet21k", "IMAGENET", "model.bin", 3])
def test_unknown_weights_name_lists_the_valid_ones(offline, weights):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=weights)

    message = str(error.value)
    assert f"weights={weights!r}" in message
    assert "give weights='imagenet', weights=None or the path of a .safetensors, .pth, .pt or .weights.h5 file" in message


def test_checkpoint_of_another_variant_names_the_keys(offline, tiny_checkpoint):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=tiny_checkpoint)

    message = str(error.value)
    assert str(tiny_checkpoint) in message
    assert "'cait_xxs24' (24 blocks, width 192)" in message
    assert "missing keys: blocks.10." in message  # the tiny one has 2 blocks
    assert "keys whose shape does not fit: blocks.0.attn.proj.bias (64,)" in message
    assert "another CaiT variant" in message


def test_checkpoint_with_another_head_names_the_head_keys(offline, timm_reference, tiny_cait):
    path = timm_reference.save(timm_reference.tiny_model(num_classes=10))

    with pytest.raises(ValueError, match=r"does not fit: head\.bias \(10,\), head\.weight \(10, 64\)\."):
        load_weights_file(tiny_cait(classes=1000), path)


def test_variant_without_released_checkpoint_says_so(offline):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XS36(weights="imagenet")

    message = str(error.value)
    assert "CaiT_XS36 has no released ImageNet checkpoint" in message
    # The variants that have one, named as the registry's timm archs name them (cait_s24_224: S24).
    released = {arch.split("_")[1].upper() for arch in CHECKPOINTS}
    assert f"variants with one: {', '.join(v for v in keras_cait.VARIANTS if v in released)};" in message
    assert "weights=None" in message


def test_missing_weights_file_names_the_path(offline, tmp_path):
    path = str(tmp_path / "absent.safetensors")

    with pytest.raises(ValueError, match=f"weights={path!r}: no such file"):
        keras_cait.CaiT_XXS24(weights=path)


@pytest.mark.large
def test_imagenet_without_network_names_the_url_and_how_to_pass_a_local_file(keras_cache, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv(HUB_URL_ENV, f"http://127.0.0.1:{port}")

    with pytest.raises(ConnectionError) as error:
        keras_cait.CaiT_XXS24(weights="imagenet")

    message = str(error.value)
    assert f"http://127.0.0.1:{port}/cait_xxs24_224.fb_dist_in1k/resolve/main/model.safetensors" in message
    assert "weights='/path/to/model.safetensors'" in message
    assert "XXS24_224.pth" in message
    assert not os.listdir(keras_cache)


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


def test_zero_channels_are_refused(offline):
    with pytest.raises(ValueError, match=r"input_shape \(32, 32, 0\): the number of channels must "
                                         r"be a positive integer, e.g. \(32, 32, 3\)"):
        keras_cait.CaiT_XXS24(weights=None, input_shape=(32, 32, 0), include_preprocessing=False)


def test_weights_given_as_bytes_are_refused_with_the_fix(offline, tiny_checkpoint):
    with pytest.raises(ValueError, match=r"bytes of bytes, not a name or path; give weights='imagenet', .* write "
                                         r"it to a file and pass its path$"):
        keras_cait.CaiT_XXS24(weights=tiny_checkpoint.read_bytes(), input_shape=(32, 32, 3))


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


# === keras_cait.errors: an error is data (the argument, its value, the problem, what is allowed) ===


def test_an_argument_error_is_one_line_of_its_fields_in_python():
    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("image_size", 200, "must be a multiple of the patch size 16\n(the patches tile it)",
                          ("give ", Named("image_size", 208), " or another multiple of 16"), usage=True)
    assert isinstance(error, ValueError)
    assert (error.argument, error.value, error.usage) == ("image_size", 200, True)
    assert str(error) == ("image_size=200: must be a multiple of the patch size 16 (the patches tile it); "
                          "give image_size=208 or another multiple of 16")


def test_an_argument_error_renders_each_named_argument_with_the_caller_s_spelling():
    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("val_fraction", 1.5, ("must be below 1 with ", Named("data", "photos")),
                          ("give ", Named("val_data", shown="FOLDER"), " or ", Named("epochs")))
    assert str(error) == "val_fraction=1.5: must be below 1 with data='photos'; give val_data=FOLDER or epochs"
    flags = error.render(lambda named: f"<{named.argument}>")
    assert flags == "<val_fraction>: must be below 1 with <data>; give <val_data> or <epochs>"


def test_an_argument_error_survives_pickling():
    import pickle

    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("weights", "x.bin", "unknown suffix", ("give ", Named("weights", None)), usage=True)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.argument, copy.value, copy.usage) == (
        ArgumentError, str(error), "weights", "x.bin", True)


def test_a_missing_extra_is_named_with_its_pip_install(monkeypatch):
    import sys

    from keras_cait.errors import ExtraMissing, require_extra

    monkeypatch.setitem(sys.modules, "no_such_module_of_an_extra", None)
    with pytest.raises(ExtraMissing) as raised:
        require_extra("export_thing", "thing", "json", "no_such_module_of_an_extra")
    assert isinstance(raised.value, ImportError)
    assert (raised.value.module, raised.value.extra) == ("no_such_module_of_an_extra", "thing")
    assert str(raised.value) == ('export_thing needs no_such_module_of_an_extra, which is not installed; '
                                 'pip install "keras-cait[thing]"')
    assert require_extra("export_thing", "thing", "json") is sys.modules["json"]


def test_an_installed_module_that_fails_to_import_keeps_its_own_error(tmp_path, monkeypatch):
    import sys

    from keras_cait.errors import ExtraMissing, require_extra

    (tmp_path / "broken_extra_module.py").write_text("import no_such_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_extra_module", raising=False)
    with pytest.raises(ModuleNotFoundError) as raised:
        require_extra("export_thing", "thing", "broken_extra_module")
    assert not isinstance(raised.value, ExtraMissing) and raised.value.name == "no_such_dependency_of_it"


def test_an_error_of_another_kind_names_its_arguments_as_parts():
    from keras_cait.errors import Named, Said
    from keras_cait.weights import DownloadError

    error = DownloadError("No network. Pass a local file: ", Named("weights", "/path/to/model.safetensors"), ".")
    assert isinstance(error, ConnectionError) and isinstance(error, Said)
    assert str(error) == "No network. Pass a local file: weights='/path/to/model.safetensors'."
    assert error.render(lambda named: f"--{named.argument} {named.value}") == (
        "No network. Pass a local file: --weights /path/to/model.safetensors.")
