"""preprocess_input and decode_predictions, as keras.applications offers them."""

import re

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError
from keras_cait import decode_predictions, preprocess_input
from keras_cait.preprocessing import imagenet_classes
from keras_cait.weights import load_weights_file


def test_bundled_class_list_is_imagenet_1k_in_index_order():
    classes = imagenet_classes()

    assert len(classes) == 1000
    assert len({wnid for wnid, _ in classes}) == 1000
    assert classes[0] == ("n01440764", "tench")
    assert classes[1] == ("n01443537", "goldfish")
    assert classes[999] == ("n15075141", "toilet_tissue")
    assert [wnid for wnid, _ in classes] == sorted(wnid for wnid, _ in classes)


def test_decode_predictions_gives_the_top_classes_best_first():
    predictions = np.full((2, 1000), 1e-4, dtype="float32")
    predictions[0, [3, 999, 0, 7, 1]] = [0.5, 0.4, 0.3, 0.2, 0.1]
    predictions[1, 1] = 0.9

    decoded = decode_predictions(predictions, top=5)

    assert decoded[0] == [
        ("n01491361", "tiger_shark", pytest.approx(0.5)),
        ("n15075141", "toilet_tissue", pytest.approx(0.4)),
        ("n01440764", "tench", pytest.approx(0.3)),
        ("n01514668", "cock", pytest.approx(0.2)),
        ("n01443537", "goldfish", pytest.approx(0.1)),
    ]
    assert decoded[1][0] == ("n01443537", "goldfish", pytest.approx(0.9))
    assert len(decoded[1]) == 5
    assert [len(top) for top in decode_predictions(predictions, top=2)] == [2, 2]


@pytest.mark.parametrize("shape", [(2, 10), (1000,), (1, 1, 1000)])
def test_decode_predictions_refuses_other_shapes(shape):
    with pytest.raises(ArgumentError) as raised:
        decode_predictions(np.zeros(shape))
    assert str(raised.value) == (
        f"preds=<array of shape {shape}>: must be ImageNet's class scores, of shape (samples, 1000); a fine-tuned "
        "model's predictions decode with its own class names: decode_predictions(preds, class_names=model.class_names)")


@pytest.mark.parametrize("preds, shown", [("abc", "'abc'"), (None, "None"), ([["a", "b"]], "<list>")])
def test_decode_predictions_refuses_preds_that_are_no_numbers_naming_them(preds, shown):
    """A str or None was "got ()", which never said that preds was no scores."""
    with pytest.raises(ArgumentError) as raised:
        decode_predictions(preds, class_names=None if preds is None else ["a", "b"])
    assert raised.value.argument == "preds" and str(raised.value).startswith(
        f"{'preds=' + shown}: must be class scores, numbers of shape (samples, classes), not {type(preds).__name__}")


def test_decode_predictions_with_class_names_gives_the_fine_tuned_classes_best_first():
    """keras.applications' shape, [(class id, name, score)] per image, with the model's own names
    and the class's index in its output as the id."""
    rng = np.random.default_rng(7)
    names = [f"class_{rng.integers(10**6)}" for _ in range(7)]
    predictions = rng.dirichlet(np.ones(7), size=3).astype("float32")

    decoded = decode_predictions(predictions, top=4, class_names=names)

    assert len(decoded) == 3
    for row, entries in zip(predictions, decoded):
        order = sorted(range(7), key=lambda index: -row[index])[:4]
        assert entries == [(index, names[index], pytest.approx(float(row[index]))) for index in order]
        assert all(type(score) is float for _, _, score in entries)
    # Fewer classes than `top`: all of them, best first.
    assert [len(entries) for entries in decode_predictions(predictions[:, :2], class_names=names[:2])] == [2] * 3
    # Names and predictions given as iterators (a generator, a file's lines) decode alike.
    assert decode_predictions(iter(predictions), top=4, class_names=(name for name in names)) == decoded


def test_decode_predictions_of_a_fine_tuned_model_names_its_classes(tiny_cait):
    from keras_cait.models import with_class_names

    model = with_class_names(tiny_cait(classes=3), ["daisy", "roses", "tulips"])
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    predictions = model.predict(images, verbose=0)

    decoded = decode_predictions(predictions, top=3, class_names=model.class_names)

    assert [sorted(name for _, name, _ in entries) for entries in decoded] == [["daisy", "roses", "tulips"]] * 2
    assert [entries[0][0] for entries in decoded] == list(np.argmax(predictions, axis=-1))


@pytest.mark.parametrize("arguments, line", [
    (dict(class_names=["a", "b", "c"]),
     "class_names=['a', 'b', 'c']: 3 names for predictions of 4 classes; give one name per class, in the "
     "order of the model's outputs (model.class_names)"),
    (dict(class_names=[f"c{i}" for i in range(9)]),
     "class_names=[9 names]: 9 names for predictions of 4 classes; give one name per class, in the "
     "order of the model's outputs (model.class_names)"),
    (dict(class_names="abcd"),
     "class_names='abcd': must be a list of str; give the model's class names in index order, e.g. "
     "model.class_names"),
    (dict(top=0), "top=0: must be a positive integer; e.g. top=5"),
    # A dict was read by its keys: Hugging Face's id2label {'0': 'cat', ...} decoded as '0', '1', ...
    (dict(class_names={str(i): name for i, name in enumerate("wxyz")}),
     "class_names=<dict of 4>: is a dict (its keys: '0', '1', '2' and 1 more), which is read by its keys; give a "
     "list of str, one name per class in index order, e.g. [id2label[i] for i in range(len(id2label))]"),
])
def test_decode_predictions_refuses_in_one_line_naming_the_argument(arguments, line):
    with pytest.raises(ValueError) as error:
        decode_predictions(np.full((2, 4), 0.25, "float32"), **arguments)
    assert str(error.value) == line


def test_decode_predictions_with_class_names_refuses_one_image_without_its_batch():
    with pytest.raises(ValueError, match=re.escape("preds=<array of shape (2,)>: must be a batch of predictions")):
        decode_predictions(np.array([0.3, 0.7]), class_names=["a", "b"])


def test_preprocess_input_is_the_identity_for_models_that_normalise_themselves():
    images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3)).astype("float32")

    assert preprocess_input(images) is images


def test_preprocess_input_given_no_images_names_them():
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"^x=None: must be images, 0..255 RGB \(an array or a tensor\), not "
                                            r"NoneType; e.g. load_image\(path, 224\)\[None\]$"):
        preprocess_input(None, include_preprocessing=False)  # was an array of NaNs
    # With the default (the model normalises), a path was returned as it was, for images.
    with pytest.raises(ArgumentError, match=r"^x='cat\.jpg': must be images, 0..255 RGB \(an array or a tensor\), "
                                            r"not str; e\.g\. load_image\(path, 224\)\[None\]$"):
        preprocess_input("cat.jpg")


def test_preprocess_input_without_model_preprocessing_is_timms_normalisation():
    import torch
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from torchvision.transforms.functional import normalize, to_tensor

    image = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    expected = normalize(to_tensor(image), IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)

    normalised = preprocess_input(image[None], include_preprocessing=False)

    assert normalised.dtype == np.float32
    np.testing.assert_allclose(normalised[0], torch.permute(expected, (1, 2, 0)).numpy(), atol=1e-6)


def test_preprocess_input_refuses_images_that_are_not_rgb_naming_their_shape():
    """A 4-channel (RGBA) batch failed in numpy ("operands could not be broadcast together")."""
    import tensorflow as tf

    channels = int(np.random.default_rng().choice([1, 2, 4]))
    for images, kind in [(np.zeros((1, 8, 8, channels), "uint8"), "ndarray"),
                         (tf.zeros((1, 8, 8, channels)), "EagerTensor")]:
        with pytest.raises(ValueError) as refused:
            preprocess_input(images, include_preprocessing=False)
        assert str(refused.value) == (f"x=<{kind} of shape (1, 8, 8, {channels})>: is of shape (1, 8, 8, {channels}), "
                                      "not RGB images: their last axis holds 3 channels; give (..., height, width, 3) "
                                      "images, 0..255 RGB")


def test_preprocess_input_takes_tensors_inside_tf_data_as_keras_applications_does():
    """It read every input with np.asarray, which fails on the symbolic tensors of a `Dataset.map`."""
    import tensorflow as tf

    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 31)))
    images = rng.integers(0, 256, (3, 5, 7, 3)).astype(rng.choice(["uint8", "float32"]))
    expected = preprocess_input(images, include_preprocessing=False)
    eager = preprocess_input(tf.constant(images), include_preprocessing=False)
    mapped = tf.data.Dataset.from_tensor_slices(images).map(lambda image: preprocess_input(image, False))
    assert keras.ops.is_tensor(eager) and eager.dtype == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(eager), expected, rtol=1e-6)
    np.testing.assert_allclose(np.stack([image.numpy() for image in mapped]), expected, rtol=1e-6)


def test_model_preprocessing_equals_preprocess_input(timm_reference, tiny_cait):
    path = timm_reference.save(timm_reference.tiny_model())
    images = timm_reference.images(2, timm_reference.tiny_size)
    normalising = tiny_cait(include_preprocessing=True)
    plain = tiny_cait(include_preprocessing=False)
    for model in (normalising, plain):
        load_weights_file(model, path)

    raw = keras.ops.convert_to_numpy(normalising(images))
    prepared = keras.ops.convert_to_numpy(plain(preprocess_input(images, include_preprocessing=False)))

    np.testing.assert_allclose(raw, prepared, rtol=1e-5, atol=1e-7)
    assert not np.allclose(raw, keras.ops.convert_to_numpy(plain(images.astype("float32"))))
