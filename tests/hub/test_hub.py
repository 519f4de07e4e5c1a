"""keras_cait.hub: CaiT in keras-hub's preset API (from_preset, fit, save_to_preset, upload_preset).

The released presets are fetched from a fake Hugging Face hub (tests/weights/fake_hf_hub.py)
serving a random checkpoint in timm's format; everything else uses a tiny CaiT.
"""

import os
import sys

import keras
import keras_hub
import numpy as np
import pytest

import keras_cait.hub
from keras_cait.hub import (
    CaiTBackbone,
    CaiTImageClassifier,
    CaiTImageClassifierPreprocessor,
    CaiTImageConverter,
)
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from keras_cait.weights import CHECKPOINTS
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.weights.fake_hf_hub import hf, hub  # noqa: F401  (fixtures)


def tiny_classifier(num_classes=3):
    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
    converter = CaiTImageConverter(image_size=(TINY_SIZE, TINY_SIZE))
    return CaiTImageClassifier(backbone, num_classes, preprocessor=CaiTImageClassifierPreprocessor(converter))


def count_weights_created(monkeypatch):
    """A list that grows by one for every layer weight created from now on."""
    created = []
    add_weight = keras.layers.Layer.add_weight

    def counted(self, *args, **kwargs):
        created.append(self.name)
        return add_weight(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "add_weight", counted)
    return created


def photos(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for height, width in sizes]


@pytest.mark.large
def test_from_preset_fetches_the_imagenet_weights_and_computes_timm_logits(
    hf, hub, timm_reference, timm_checkpoint, keras_cache, monkeypatch
):
    monkeypatch.setitem(CHECKPOINTS["cait_xxs24_224"], "sha256", None)  # verified by the hub's hash
    reference, body = timm_checkpoint("cait_xxs24_224")
    hub.serve("cait_xxs24_224", body)
    images = timm_reference.images(2, 224)  # at the input size the transform leaves them as they are
    expected, _ = timm_reference.outputs(reference, images)

    weights_created = count_weights_created(monkeypatch)

    classifier = CaiTImageClassifier.from_preset("cait_xxs24_224")

    timm_reference.assert_matches(classifier.predict(images, verbose=0), expected, "logits")
    assert (classifier.backbone.depth, classifier.backbone.embed_dim) == (24, 192)
    assert classifier.preprocessor.image_size == (224, 224)
    assert len(weights_created) == len(classifier.weights), "one model: the checkpoint goes straight into it"
    assert not os.path.exists(keras_cache), "nothing converted is written beside the HF cache"

    tuned = CaiTImageClassifier.from_preset("cait_xxs24_224", num_classes=5)

    # The file's bytes came once; the second load asked only for its revision (a HEAD), as timm does.
    assert [method for method, _, _ in hub.requests] == ["HEAD", "GET", "HEAD"]
    assert tuned.output_dense.kernel.shape == (192, 5)
    for got, want in zip(tuned.backbone.weights, classifier.backbone.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want))


@pytest.mark.large
def test_without_the_hugging_face_cache_the_checkpoint_is_downloaded_once_into_keras_cait_s_cache(
    hub, timm_reference, timm_checkpoint, keras_cache, monkeypatch
):
    """KERAS_CAIT_HUB_URL (a plain mirror) or no huggingface_hub: keras_cait's own downloader and
    cache, the ones of weights="imagenet", which then downloads nothing more."""
    from keras_cait.weights.registry import HUB_URL_ENV

    monkeypatch.setitem(CHECKPOINTS["cait_xxs24_224"], "sha256", None)  # verified by the hub's hash
    monkeypatch.setenv(HUB_URL_ENV, hub.url + "/timm")
    reference, body = timm_checkpoint("cait_xxs24_224")
    hub.serve("cait_xxs24_224", body)
    images = timm_reference.images(2, 224)
    _, expected = timm_reference.outputs(reference, images)
    normalised = (images / 255.0 - IMAGENET_MEAN) / IMAGENET_STD

    backbone = CaiTBackbone.from_preset("cait_xxs24_224")
    again = CaiTBackbone.from_preset("cait_xxs24_224")
    constructed = keras_cait.CaiT_XXS24(weights="imagenet", include_top=False, include_preprocessing=False)

    timm_reference.assert_matches(keras.ops.convert_to_numpy(backbone(normalised))[:, 0], expected, "class token")
    assert [method for method, _, _ in hub.requests] == ["GET", "GET"], "one download: the 302 and the CDN"
    assert sorted(os.listdir(keras_cache)) == [".cait_xxs24_224.fb_dist_in1k.safetensors.sha256",
                                               "cait_xxs24_224.fb_dist_in1k.safetensors"]
    for model in (again, constructed):
        for got, want in zip(model.weights, backbone.weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want))


def test_load_weights_false_builds_the_architecture_and_fetches_nothing(hf, hub, keras_cache):
    classifier = CaiTImageClassifier.from_preset("cait_xxs24_384", load_weights=False)

    assert hub.requests == []
    assert not os.path.exists(keras_cache)
    assert classifier.backbone.image_shape == (384, 384, 3)
    assert (classifier.backbone.depth, classifier.backbone.num_heads) == (24, 4)
    assert classifier.preprocessor.image_size == (384, 384)


def test_the_converter_runs_the_reference_evaluation_transform_on_images_of_any_size():
    from keras_cait.images.evaluation_transform import evaluation_transform

    converter = CaiTImageConverter(image_size=(TINY_SIZE, TINY_SIZE))
    images = photos([(40, 50), (75, 33), (32, 32)])
    expected = [
        (np.asarray(evaluation_transform(image, TINY_SIZE)) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        for image in images
    ]

    one_by_one = [keras.ops.convert_to_numpy(converter(image)) for image in images]
    as_a_list = keras.ops.convert_to_numpy(converter(images))
    as_a_batch = keras.ops.convert_to_numpy(converter(np.stack(photos([(40, 50)] * 2))))

    np.testing.assert_allclose(np.stack(one_by_one), np.stack(expected), atol=1e-5)
    np.testing.assert_allclose(as_a_list, np.stack(expected), atol=1e-5)
    np.testing.assert_allclose(as_a_batch[0], expected[0], atol=1e-5)  # the same first draw


def test_the_converter_refuses_another_transform():
    with pytest.raises(ValueError, match="interpolation='bilinear': CaiTImageConverter always runs"):
        CaiTImageConverter(interpolation="bilinear")


def test_the_hub_classes_name_their_own_arguments_given_the_wrong_type():
    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
    for num_classes, kind in [(0, ""), ("3", ", not str"), (2.0, ", not float")]:
        with pytest.raises(ValueError, match=rf"^num_classes={num_classes!r}: must be a positive integer, the number "
                                             rf"of classes{kind}; e.g. num_classes=10$"):  # was Dense's `units`
            CaiTImageClassifier(backbone, num_classes)
    with pytest.raises(ValueError, match=r"^backbone=<str>: CaiTImageClassifier takes a CaiTBackbone, not a str"):
        CaiTImageClassifier("cait_xxs24_224", 3)  # was AttributeError: 'str' object has no attribute 'dtype_policy'
    with pytest.raises(ValueError, match=r"^image_shape=32: must be \(height, width, channels\), a tuple of ints, "
                                         r"not int; e.g. image_shape=\(224, 224, 3\)$"):
        CaiTBackbone(image_shape=32, **TINY_CAIT)  # was TypeError: 'int' object is not iterable
    with pytest.raises(ValueError, match=r"^image_shape=\(30, 30, 3\): sides must be positive multiples of the "
                                         r"patch size 16; e.g. \(32, 32, 3\)$"):
        CaiTBackbone(image_shape=(30, 30, 3), **TINY_CAIT)  # was named input_shape, build_cait's argument
    with pytest.raises(ValueError, match=r"^activation='sofmax': not a Keras activation; e.g. 'softmax', or None"):
        CaiTImageClassifier(CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT), 3, activation="sofmax")
    with pytest.raises(ValueError, match=r"^patch_size=0: must be a positive integer; e.g. patch_size=16$"):
        CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT, patch_size=0)  # was ZeroDivisionError
    with pytest.raises(ValueError, match=r"^head_dtype='float17': not a Keras dtype policy; give float32, "):
        CaiTImageClassifier(backbone, 3, head_dtype="float17")  # was Keras' error, naming no argument
    assert CaiTImageConverter(image_size=TINY_SIZE).image_size == (TINY_SIZE, TINY_SIZE)  # a side, as load_image's
    with pytest.raises(ValueError, match=r"^image_size='32': must be a positive integer or a \(height, width\) pair"):
        CaiTImageConverter(image_size="32")


def test_images_the_converter_cannot_take_are_refused_in_one_line_by_it_and_by_predict():
    """Keras rewrapped the converter's errors (a RuntimeError for an image without pixels, a 1,270-character
    ValueError for RGBA), and the classifier's predict gave a page of tf.data traceback."""
    from keras_cait.errors import ArgumentError

    channels = int(np.random.default_rng().choice([1, 2, 4]))
    converter = CaiTImageConverter(image_size=TINY_SIZE)
    classifier = CaiTImageClassifier(CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT), 3,
                                      preprocessor=CaiTImageClassifierPreprocessor(converter))
    takes = ("CaiTImageConverter takes RGB images, channels last, (height, width, 3) or a batch (batch, height, "
             "width, 3), or a list of such images; convert grey or RGBA images to RGB first (PIL: "
             "image.convert('RGB'))")
    for call, line in [
        (lambda: converter(np.zeros((1, 40, 60, channels), "uint8")),
         f"images=<ndarray of shape (1, 40, 60, {channels})>: {takes}"),
        (lambda: converter([np.zeros((40, 60, 3)), np.zeros((20, 30, channels))]),
         f"images=<list holding an image of shape (20, 30, {channels})>: {takes}"),
        (lambda: converter(np.zeros((0, 7, 3), "uint8")),
         "images=<ndarray of shape (0, 7, 3)>: an image without pixels; give images of at least 1x1 pixels"),
        (lambda: classifier.predict(np.zeros((1, 40, 60, channels), "uint8"), verbose=0),
         f"x=<ndarray of shape (1, 40, 60, {channels})>: {takes}"),
    ]:
        with pytest.raises(ArgumentError) as caught:
            call()
        assert str(caught.value) == line
    assert classifier.predict(np.zeros((2, 40, 60, 3), "uint8"), verbose=0).shape == (2, 3)


def test_the_classifier_predicts_a_list_of_images_of_any_sizes_and_refuses_one_image_or_none():
    """The converter takes "a list of such images", but predict failed on one of different sizes
    ("Can't convert non-rectangular Python sequence"); one image (rank 3) failed in Keras' input check,
    and 0 images in Keras' UnboundLocalError."""
    from keras_cait.errors import ArgumentError

    classifier = CaiTImageClassifier(CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT), 3,
                                      preprocessor=CaiTImageClassifierPreprocessor(
                                          CaiTImageConverter(image_size=TINY_SIZE)))
    rng = np.random.default_rng()
    images = [rng.integers(0, 256, (int(rng.integers(20, 60)), int(rng.integers(20, 60)), 3), "uint8")
              for _ in range(3)]
    alone = [classifier.predict(image[None], verbose=0)[0] for image in images]
    np.testing.assert_allclose(classifier.predict(images, verbose=0), np.stack(alone), rtol=1e-5, atol=1e-6)
    same = [images[0], images[0]]
    np.testing.assert_allclose(classifier.predict(same, verbose=0), np.stack([alone[0]] * 2), rtol=1e-5, atol=1e-6)
    for x, line in [
        (images[0], f"x=<ndarray of shape {images[0].shape}>: is one image, not a batch of images; give a batch of "
                    "one: classifier.predict(image[None])"),
        (np.zeros((0, 40, 40, 3), "uint8"), "x=<ndarray of shape (0, 40, 40, 3)>: is a batch of 0 images; give at "
                                            "least one"),
        ([], "x=<list of 0 images>: is a batch of 0 images; give at least one"),
    ]:
        with pytest.raises(ArgumentError) as caught:
            classifier.predict(x, verbose=0)
        assert str(caught.value) == line
    with pytest.raises(ArgumentError, match=r"^backbone=<Sequential 'sequential.*'>: has no inputs: a model never "):
        CaiTImageClassifier(keras.Sequential([keras.layers.Dense(3)]), 2)  # was Keras' AttributeError


def test_an_argument_the_hub_classes_do_not_take_is_refused_not_dropped():
    # Before: Keras' functional Model dropped every unknown keyword: depht=3 built the default depth,
    # num_clases=3 a 1000-class head, and from_preset's image_shape= the preset's 224x224 classifier.
    from keras_cait.errors import ArgumentError

    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
    for call, argument, message in [
        (lambda: CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), depht=3, **TINY_CAIT), "depht",
         "depht=3: not an argument of CaiTBackbone; did you mean depth? it takes image_shape, embed_dim, depth, "),
        (lambda: CaiTImageClassifier(backbone, 3, num_clases=5), "num_clases",
         "num_clases=5: not an argument of CaiTImageClassifier; did you mean num_classes? it takes backbone, "),
        (lambda: CaiTImageClassifier.from_preset("cait_xxs24_224", load_weights=False, image_shape=(32, 32, 3)),
         "image_shape", "image_shape=(32, 32, 3): not an argument of CaiTImageClassifier; it takes backbone, "),
    ]:
        with pytest.raises(ArgumentError) as caught:
            call()
        assert caught.value.argument == argument and str(caught.value).startswith(message)
    named = CaiTImageClassifier(backbone, 3, name="tuned", trainable=False, compile=False)
    assert (named.name, named.trainable) == ("tuned", False)


def test_a_pooling_or_preprocessor_the_classifier_cannot_use_is_refused_naming_it():
    # Before: pooling='cls' a plain ValueError; preprocessor='x' taken, then a failure inside predict.
    from keras_cait.errors import ArgumentError

    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
    for options, line in [
        (dict(pooling="cls"), "pooling='cls': unknown pooling; give one of 'token', 'avg'"),
        (dict(pooling=None), "pooling=None: unknown pooling; give one of 'token', 'avg'"),
        (dict(preprocessor="x"), "preprocessor='x': a str, not a Keras layer; e.g. "
                                 "CaiTImageClassifierPreprocessor.from_preset('cait_xxs24_224'), or None for images "
                                 "already resized and normalised"),
    ]:
        with pytest.raises(ArgumentError) as caught:
            CaiTImageClassifier(backbone, 3, **options)
        assert caught.value.argument == next(iter(options)) and str(caught.value) == line
    assert CaiTImageClassifier(backbone, 3, pooling="avg", preprocessor=None).pooling == "avg"


@pytest.mark.parametrize("dropout, kind", [("0.1", ", not str"), (None, ", not NoneType"), (1.5, ""), (-0.1, "")])
def test_a_dropout_that_is_no_rate_is_refused_naming_dropout(dropout, kind):
    # Before: '0.1' and None were TypeError: '<=' not supported between instances of 'int' and 'str';
    # 1.5 was Keras' `Invalid value received for argument `rate``, an argument the caller never wrote.
    from keras_cait.errors import ArgumentError

    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
    with pytest.raises(ArgumentError) as caught:
        CaiTImageClassifier(backbone, 3, dropout=dropout)
    assert caught.value.argument == "dropout"
    assert str(caught.value) == f"dropout={dropout!r}: must be a number from 0 to 1{kind}; e.g. dropout=0.1"
    assert CaiTImageClassifier(backbone, 3, dropout=1).output_dropout.rate == 1


@pytest.mark.parametrize("argument, value", [("scale", "x"), ("scale", None), ("offset", (1.0, 2.0)),
                                             ("offset", ("0", "0", "0")), ("scale", float("nan"))])
def test_a_scale_or_offset_that_is_no_number_per_channel_is_refused_when_the_converter_is_made(argument, value):
    # Before: accepted, then a TypeError / InvalidArgumentError of CaiTImageConverter.call() on the first
    # batch, inside predict's tf.data pipeline.
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as caught:
        CaiTImageConverter(image_size=TINY_SIZE, **{argument: value})
    assert caught.value.argument == argument
    assert str(caught.value) == (f"{argument}={value!r}: must be a finite number or 3 of them, one per RGB channel; "
                                 "e.g. scale=1 / 255 and offset=0.0 for 0..1 inputs; leave both out for the ImageNet "
                                 "mean and std")
    scaled = CaiTImageConverter(image_size=TINY_SIZE, scale=1 / 255, offset=[0, 0, 0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(scaled(np.full((40, 40, 3), 255.0))), 1.0, rtol=1e-6)


def test_the_converter_of_a_preset_takes_another_image_size_as_the_backbone_takes_another_image_shape():
    # Before: TypeError: CaiTImageConverter() got multiple values for keyword argument 'image_size'.
    assert CaiTImageConverter.from_preset("cait_xxs24_224", image_size=TINY_SIZE).image_size == (TINY_SIZE, TINY_SIZE)
    assert CaiTImageConverter.from_preset("cait_xxs24_384").image_size == (384, 384)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, digits):
    """A tiny classifier after `fit` on a folder of digit images (3 classes, 40×40 PNGs)."""
    folder = digits(tmp_path_factory.mktemp("digits"), per_class=4, size=40, classes=range(3))
    dataset = keras.utils.image_dataset_from_directory(folder, image_size=(40, 40), batch_size=4, seed=0)
    classifier = tiny_classifier()
    classifier.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = classifier.fit(dataset, epochs=6, verbose=0)
    return classifier, history.history["loss"]


@pytest.mark.large
def test_fit_on_a_folder_learns(fitted):
    _, losses = fitted
    assert losses[-1] < 0.7 * losses[0], f"the loss did not fall: {losses}"


@pytest.mark.large
def test_save_to_preset_loads_back_through_keras_hub_with_bit_identical_predictions(fitted, tmp_path):
    classifier, _ = fitted
    images = photos([(48, 64), (48, 64)])
    classifier.save_to_preset(str(tmp_path / "preset"))

    loaded = keras_hub.models.ImageClassifier.from_preset(str(tmp_path / "preset"))

    assert type(loaded) is CaiTImageClassifier and type(loaded.backbone) is CaiTBackbone
    np.testing.assert_array_equal(loaded.predict(np.stack(images), verbose=0),
                                  classifier.predict(np.stack(images), verbose=0))


@pytest.mark.parametrize("mixed", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("saved_by", ["classifier", "backbone"])
def test_a_model_made_under_a_mixed_policy_loads_back_from_its_preset(tmp_path, policy, mixed, saved_by):
    """keras-hub's loader read the saved policy with `is_float_dtype('mixed_bfloat16')`: `Invalid dtype`
    from `from_preset`, whichever class. The preset now holds the variables' dtype: it loads under the
    global policy (keras-hub's rule for float presets) or the `dtype` given, with the same weights."""
    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT, dtype=mixed)
    classifier = CaiTImageClassifier(backbone, 3, preprocessor=CaiTImageClassifierPreprocessor(
        CaiTImageConverter(image_size=TINY_SIZE)))
    saved = classifier if saved_by == "classifier" else backbone
    saved.save_to_preset(str(tmp_path / "preset"))
    load = keras_hub.models.ImageClassifier.from_preset if saved_by == "classifier" else \
        keras_hub.models.Backbone.from_preset
    plain = load(str(tmp_path / "preset"))
    again = load(str(tmp_path / "preset"), dtype=mixed)
    policy(mixed)
    under_global = load(str(tmp_path / "preset"))
    policy("float32")
    assert plain.dtype_policy.name == "float32"
    assert again.dtype_policy.name == under_global.dtype_policy.name == mixed
    for loaded in (plain, again, under_global):
        model = loaded.backbone if saved_by == "classifier" else loaded
        for ours, theirs in zip(backbone.weights, model.weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    if saved_by == "classifier":
        images = np.random.default_rng(0).uniform(0, 255, (2, TINY_SIZE, TINY_SIZE, 3)).astype("float32")
        np.testing.assert_array_equal(again.predict(images, verbose=0), classifier.predict(images, verbose=0))


def test_upload_preset_sends_a_folder_that_loads_back(fitted, tmp_path, monkeypatch):
    """keras_hub.upload_preset with huggingface_hub's upload replaced by a copy to a folder."""
    import shutil

    import huggingface_hub

    remote = tmp_path / "remote"

    class Repo:
        repo_id = "someone/cait-digits"

    monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo_id, exist_ok: Repo())
    monkeypatch.setattr(huggingface_hub, "file_exists", lambda repo_id, filename: False)
    monkeypatch.setattr(huggingface_hub, "upload_folder",
                        lambda repo_id, folder_path: shutil.copytree(folder_path, remote))
    classifier, _ = fitted
    local = str(tmp_path / "preset")
    classifier.save_to_preset(local)

    keras_hub.upload_preset("hf://someone/cait-digits", local)

    assert "This is a [`CaiT` model]" in (remote / "README.md").read_text()  # its model card
    assert "README.md" not in os.listdir(local)
    images = np.stack(photos([(32, 32)] * 2))
    np.testing.assert_array_equal(
        keras_hub.models.ImageClassifier.from_preset(str(remote)).predict(images, verbose=0),
        classifier.predict(images, verbose=0),
    )


def test_an_unknown_cait_preset_lists_the_released_ones():
    with pytest.raises(ValueError, match=r"preset='cait_s24_999': no such CaiT checkpoint; .*cait_s24_224"):
        CaiTImageClassifier.from_preset("cait_s24_999")
    with pytest.raises(ValueError, match=r"^preset='CAIT_S99': no such CaiT checkpoint; the released ones are "):
        CaiTBackbone.from_preset("CAIT_S99")


@pytest.mark.parametrize("preset", ["CAIT_S24_224", "cait-s24-224", " Cait_S24_224"])
def test_a_released_preset_spelled_otherwise_is_refused_with_its_name(preset):
    """They fell through to keras-hub's own unknown-preset error, which lists none of CaiT's."""
    from keras_cait.errors import ArgumentError

    for make in (CaiTBackbone.from_preset, CaiTImageClassifier.from_preset):
        with pytest.raises(ArgumentError, match=rf"^preset={preset!r}: no such preset: presets are named in lower "
                           r"case with underscores; did you mean 'cait_s24_224'\?$") as refused:
            make(preset)
        assert refused.value.argument == "preset"


def test_keras_cait_hub_without_keras_hub_names_the_extra(monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "keras_hub", None)
    monkeypatch.delitem(sys.modules, "keras_cait.hub")

    with pytest.raises(ImportError, match=r'pip install "keras-cait\[hub\]"'):
        importlib.import_module("keras_cait.hub")


# === weights=: a checkpoint file instead of the network ===


@pytest.mark.large
def test_offline_from_preset_advises_weights_and_the_advice_works(
    hf, hub, timm_reference, timm_checkpoint, keras_cache, tmp_path
):
    """No network (the hub serves nothing, HF_HUB_OFFLINE=1): the error advises `weights='PATH'`;
    passing timm's file (safetensors), DeiT's official .pth or keras-cait convert's .weights.h5
    loads it, for the classifier and the backbone, and asks the hub for nothing."""
    import torch

    hf.set(HF_HUB_OFFLINE="1")
    with pytest.raises(ConnectionError) as offline:
        CaiTImageClassifier.from_preset("cait_xxs24_224")
    assert "weights='/path/to/model.safetensors'" in str(offline.value)

    reference, body = timm_checkpoint("cait_xxs24_224")
    safetensors = tmp_path / "model.safetensors"
    safetensors.write_bytes(body)
    pth = tmp_path / "XXS24_224.pth"
    torch.save({"model": reference.state_dict()}, pth)  # as DeiT's official files hold it
    h5 = tmp_path / "cait_xxs24_224.weights.h5"
    keras_cait.CaiT_XXS24(weights=str(safetensors)).save_weights(h5)  # what keras-cait convert writes
    images = timm_reference.images(2, 224)
    logits, features = timm_reference.outputs(reference, images)
    normalised = (images / 255.0 - IMAGENET_MEAN) / IMAGENET_STD

    for path in (safetensors, pth, h5):
        classifier = CaiTImageClassifier.from_preset("cait_xxs24_224", weights=str(path))
        timm_reference.assert_matches(classifier.predict(images, verbose=0), logits, f"logits of {path.name}")
        backbone = CaiTBackbone.from_preset("cait_xxs24_224", weights=path)
        tokens = keras.ops.convert_to_numpy(backbone(normalised))
        timm_reference.assert_matches(tokens[:, 0], features, f"class token of {path.name}")
    tuned = CaiTImageClassifier.from_preset("cait_xxs24_224", weights=str(safetensors), num_classes=5)
    assert tuned.output_dense.kernel.shape == (192, 5)
    assert hub.requests == []


def _same_weights(model, source, layers):
    return all(np.array_equal(a, b) for name in layers
               for a, b in zip(model.get_layer(name).get_weights(), source.get_layer(name).get_weights()))


@pytest.mark.large
def test_a_weights_h5_file_without_a_head_with_another_head_or_at_another_size_loads_into_a_preset(
        hub, keras_cache, tmp_path):
    """A backbone took no headless file ("holds no head ... include_top=False", an argument it has
    not), a fine-tuned 5-class file was refused naming `classes`, and `image_shape` failed inside
    Keras on the position embedding. A file's head of `num_classes` classes is loaded with it."""
    from keras_cait.errors import ArgumentError

    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 30)))
    classes = int(rng.integers(2, 9))
    headless, tuned = tmp_path / "notop.weights.h5", tmp_path / "tuned.weights.h5"
    notop = keras_cait.CaiT_XXS24(weights=None, include_top=False)
    notop.save_weights(headless)
    keras_cait.CaiT_XXS24(weights=None, classes=classes).save_weights(tuned)
    blocks = [layer.name for layer in notop.layers if layer.weights]

    backbone = CaiTBackbone.from_preset("cait_xxs24_224", weights=str(headless))
    assert _same_weights(backbone, notop, blocks)
    classifier = CaiTImageClassifier.from_preset("cait_xxs24_224", num_classes=classes, weights=str(tuned))
    reference = keras_cait.CaiT_XXS24(weights=str(tuned), classes=classes)
    assert _same_weights(classifier.backbone, reference, blocks)
    assert all(np.array_equal(a, b) for a, b in zip(classifier.output_dense.get_weights(),
                                                    reference.get_layer("predictions").get_weights()))
    new_head = CaiTImageClassifier.from_preset("cait_xxs24_224", num_classes=classes + 1, weights=str(tuned))
    assert _same_weights(new_head.backbone, reference, blocks) and new_head.output_dense.units == classes + 1
    small = CaiTBackbone.from_preset("cait_xxs24_224", image_shape=(32, 48, 3), weights=str(headless))
    assert small.get_layer("position_embedding").get_weights()[0].shape == (1, 6, 192)
    assert _same_weights(small, notop, [name for name in blocks if name != "position_embedding"])
    for file, line in [
        (headless, f"weights='{headless}': holds no head; give num_classes for a new head on its backbone"),
        (tuned, f"weights='{tuned}': has a head of {classes} classes, the preset one of 1000; give "
                f"num_classes={classes} (its head is loaded with it)"),
    ]:
        with pytest.raises(ArgumentError) as caught:
            CaiTImageClassifier.from_preset("cait_xxs24_224", weights=str(file))
        assert str(caught.value) == line
    assert hub.requests == []


def test_weights_where_no_file_is_read_are_refused_in_one_line(hf, hub, keras_cache, tmp_path):
    folder = tmp_path / "preset"
    folder.mkdir()
    for preset, options, message in [
        ("cait_xxs24_224", dict(weights=str(tmp_path / "missing.safetensors")), r"weights='.*missing.safetensors': "
                                                                                r"no such file"),
        ("cait_xxs24_224", dict(weights="weights.bin"), r"weights='weights.bin': .*\.safetensors, \.pth, \.pt "
                                                        r"or \.weights\.h5"),
        ("cait_xxs24_224", dict(weights=str(tmp_path), load_weights=False), r"load_weights=False"),
        (str(folder), dict(weights="model.safetensors"), r"released CaiT presets"),
    ]:
        for cls in (CaiTImageClassifier, CaiTBackbone):
            with pytest.raises(ValueError, match=message) as refused:
                cls.from_preset(preset, **options)
            assert "\n" not in str(refused.value)
    assert hub.requests == []
