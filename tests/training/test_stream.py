"""keras_cait.training.stream: evaluation batches and resumable training batches."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from keras_cait.training import Augmentation, sources, stream
from keras_cait.training.recipe import RECIPES
from tests.training.helpers import NO_AUGMENTATION, digest, stream_images


def test_evaluation_dataset_batches_in_order_with_one_hot_labels(folder):
    source = sources.image_folder(folder)
    images, labels = next(iter(stream.evaluation_dataset(source, 32, 16, one_hot=True)))
    assert images.shape == (16, 32, 32, 3) and images.dtype == tf.float32
    np.testing.assert_array_equal(labels.numpy(), np.eye(10)[[0] * 10 + [1] * 6])


def test_the_evaluation_of_tfrecords_held_out_images_has_their_size_and_keras_warns_nothing(folder, tmp_path):
    """TFRecords' examples (and so a split's of them) are of unknown size: Keras' evaluate warned "Your
    input ran out of data; interrupting training" at their end, in every epoch's validation of a run."""
    import warnings

    import keras

    images = sources.image_folder(folder)
    (path,) = sources.write_tfrecords(images, str(tmp_path / "digits"))
    _, held_out = sources.split(sources.tfrecords(path, images.class_names), 0.3)
    dataset = stream.evaluation_dataset(held_out, 8, 4)
    assert dataset.cardinality() == -(-held_out.num_examples // 4)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.evaluate(dataset, verbose=0)
    assert [str(warning.message) for warning in caught if "ran out of data" in str(warning.message)] == []


def test_each_epoch_is_a_new_permutation_without_the_last_partial_batch(folder):
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=10, **NO_AUGMENTATION)
    batches = stream_images(source, augmentation, batch_size=16, epochs=2, seed=0)
    assert len(batches) == 2 * (100 // 16)
    epochs = [np.concatenate([b[0] for b in batches[i * 6:(i + 1) * 6]]) for i in range(2)]
    every_image = {digest(image) for image, _ in stream.evaluation_dataset(source, 32, 1).unbatch()}
    for images in epochs:
        seen = [digest(image) for image in images]
        assert len(set(seen)) == 96 and set(seen) <= every_image
    assert [digest(i) for i in epochs[0]] != [digest(i) for i in epochs[1]]


def test_repeated_augmentation_shows_each_chosen_image_three_times(folder):
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=10, **{**NO_AUGMENTATION, "repeats": 3})
    batches = stream_images(source, augmentation, batch_size=16, epochs=1, seed=0)
    counts = collections.Counter(digest(image) for images, _ in batches for image in images)
    assert sum(counts.values()) == 96
    assert list(counts.values()) == [3] * 32  # of ceil(100 / 3) = 34 images × 3, the first 96


def test_a_recipe_without_mixup_or_cutmix_still_smooths_the_labels(folder):
    """DeiT's --smoothing holds whether or not batches are mixed (timm's train.py then smooths in
    the loss): every label of the stream is (1 - ε) one_hot + ε / K."""
    smoothing = float(np.random.default_rng(11).uniform(0.05, 0.5))
    recipe = RECIPES["transfer"].replace(smoothing=smoothing)
    assert recipe.mixup == recipe.cutmix == 0
    source = sources.image_folder(folder)
    _, labels = next(iter(stream.training_stream(source, recipe.augmentation(32, 10), 16, 1, seed=0)))
    labels = np.sort(labels.numpy(), axis=1)
    np.testing.assert_allclose(labels[:, :-1], smoothing / 10, rtol=1e-6)
    np.testing.assert_allclose(labels[:, -1], 1 - smoothing + smoothing / 10, rtol=1e-6)


@pytest.mark.large
def test_a_stream_started_at_step_k_is_the_tail_of_the_whole_one(folder):
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=10, rand_augment_magnitude=0,
                                random_erasing=0)
    whole = stream_images(source, augmentation, batch_size=16, epochs=3, seed=5)
    tail = stream_images(source, augmentation, batch_size=16, epochs=3, seed=5, start_step=8)
    assert len(tail) == len(whole) - 8
    for (images, labels), (want_images, want_labels) in zip(tail, whole[8:]):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)
    cached = stream_images(source, augmentation, batch_size=16, epochs=2, seed=5, cache=True)
    for (images, _), (want_images, _) in zip(cached, whole):
        np.testing.assert_array_equal(images, want_images)
    other_seed = stream_images(source, augmentation, batch_size=16, epochs=1, seed=6)
    assert not np.array_equal(other_seed[0][0], whole[0][0])
    for _, labels in whole:
        np.testing.assert_allclose(labels.sum(axis=1), 1.0, rtol=1e-6)
        assert labels.min() >= 0.01 - 1e-7  # label smoothing 0.1 over 10 classes


@pytest.mark.large
def test_the_full_recipe_runs(folder):
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=10)
    images, labels = next(iter(stream.training_stream(source, augmentation, 8, 1, seed=0)))
    assert images.shape == (8, 32, 32, 3) and labels.shape == (8, 10)
    assert np.all(np.isfinite(images.numpy()))
    with pytest.raises(ValueError, match="batch_size=128: is larger than the 100"):
        stream.training_stream(source, augmentation, 128, 1)


@pytest.mark.large
def test_the_images_are_the_same_float32_under_every_policy(folder, policy):
    """DeiT's full augmentation hands the model float32 images 0..255 that do not depend on the
    global dtype policy, bit for bit (the model casts them at its input). RandAugment draws from
    a stateful generator, so its draws follow the order of the calls: one thread keeps it."""
    source = sources.image_folder(folder)
    augmentation = Augmentation(image_size=32, num_classes=10)  # every default: the full recipe
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1

    def batches(dtype_policy):
        policy(dtype_policy)
        batches = stream.training_stream(source, augmentation, 8, 2, seed=3).with_options(options)
        return [(images.numpy(), labels.numpy()) for images, labels in batches]

    reference = batches("float32")
    assert len(reference) == 2 * (100 // 8) and reference[0][0].dtype == np.float32
    for half in ("mixed_float16", "mixed_bfloat16"):
        for (images, labels), (want_images, want_labels) in zip(batches(half), reference, strict=True):
            assert images.dtype == np.float32
            np.testing.assert_array_equal(images, want_images)
            np.testing.assert_array_equal(labels, want_labels)


@pytest.mark.parametrize("changes, line", [
    (dict(random_erasing=2), "random_erasing=2: must be a number in [0, 1]; e.g. random_erasing=0.25"),
    (dict(rand_augment_magnitude=20), "rand_augment_magnitude=20: must be a number in [0, 10]; "
                                      "e.g. rand_augment_magnitude=9.0"),
    (dict(label_smoothing=1), "label_smoothing=1: must be a number in [0, 1); e.g. label_smoothing=0.1"),
    (dict(mixup_alpha=-1), "mixup_alpha=-1: must be a number of at least 0; e.g. mixup_alpha=0.8"),
    (dict(switch_prob="0.5"), "switch_prob='0.5': must be a number in [0, 1], not str; e.g. switch_prob=0.5"),
    (dict(image_size="32"), "image_size='32': must be a positive integer, not str; e.g. image_size=224"),
    (dict(num_classes=0), "num_classes=0: must be a positive integer; e.g. num_classes=10"),
    (dict(repeats="3"), "repeats='3': must be a positive integer (1 disables repetition), not str; e.g. repeats=3"),
])
def test_an_augmentation_that_cannot_work_is_refused_when_made_naming_its_field(changes, line):
    # Before: accepted, then refused by the stream's layers as `probability=2` or `magnitude=20` (arguments
    # nobody gave), or a TypeError ('<' between str and int) in tf.data.
    with pytest.raises(ValueError) as caught:
        Augmentation(**{"image_size": 32, "num_classes": 3, **changes})
    assert str(caught.value) == line
    assert Augmentation(np.int64(32), np.int64(3), rand_augment_magnitude=np.float32(9)).image_size == 32


def test_a_stream_given_a_path_no_augmentation_or_a_batch_that_cannot_work_names_the_argument(folder):
    # Before: AttributeError ('str' object has no attribute 'num_classes', 'NoneType' ... 'repeats'),
    # ZeroDivisionError, TensorFlow's `Batch size must be greater than zero`, a StagingError from inside tf.data.
    source = sources.image_folder(folder)
    augmentation = Augmentation(32, source.num_classes, **NO_AUGMENTATION)
    for call, line in [
        (lambda: stream.training_stream(str(folder), augmentation, 4, 1),
         f"source='{folder}': training_stream takes an ImageSource, not a path; read the folder first: "
         f"keras_cait.training.sources.image_folder('{folder}')"),
        (lambda: stream.evaluation_dataset(str(folder), 32, 4),
         f"source='{folder}': evaluation_dataset takes an ImageSource, not a path; read the folder first: "
         f"keras_cait.training.sources.image_folder('{folder}')"),
        (lambda: stream.training_stream(source, None, 4, 1),
         "augmentation=<NoneType>: training_stream takes an Augmentation, not a NoneType; e.g. "
         "keras_cait.training.Augmentation(224, source.num_classes), or a recipe's: "
         "RECIPES['transfer'].augmentation(224, source.num_classes)"),
        (lambda: stream.training_stream(source, augmentation, 0, 1),
         "batch_size=0: must be a positive integer; e.g. batch_size=64"),
        (lambda: stream.evaluation_dataset(source, 32, "4"),
         "batch_size='4': must be a positive integer, not str; e.g. batch_size=64"),
        (lambda: stream.evaluation_dataset(source, "32", 4),
         "image_size='32': must be a positive integer or a (height, width) pair of them; e.g. image_size=224"),
    ]:
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == line


@pytest.mark.parametrize("changes, line", [
    # Before: TypeError "Cannot convert '2' to EagerTensor of dtype int64", Keras' "Argument `seed` must be an
    # integer", an empty stream for a start past the end, and TensorFlow's errors from inside tf.data.
    (dict(epochs="2"), "epochs='2': must be a positive integer, not str; e.g. epochs=300"),
    (dict(epochs=1.5), "epochs=1.5: must be a positive integer, not float; e.g. epochs=300"),
    (dict(epochs=0), "epochs=0: must be a positive integer; e.g. epochs=300"),
    (dict(seed="1"), "seed='1': must be an integer, not str; e.g. seed=0"),
    (dict(seed=True), "seed=True: must be an integer, not bool; e.g. seed=0"),
    (dict(seed=2**63), f"seed={2**63}: must be an integer; e.g. seed=0"),
    (dict(start_step=-1), "start_step=-1: must be a non-negative integer, the steps a resumed run has done; "
                          "e.g. start_step=0"),
    (dict(epochs=2, start_step=13), "start_step=13: is past the run's end: 2 epochs of 6 steps are 12 steps; "
                                    "give a step from 0 to 12"),
    (dict(shuffle_buffer=-3), "shuffle_buffer=-3: must be a positive integer or None; e.g. shuffle_buffer=10000"),
    (dict(cache="no"), "cache='no': must be True or False, not str"),
    (dict(batch_size=101), "batch_size=101: is larger than the 100 training images; use a batch of at most 100"),
])
def test_a_training_stream_s_run_arguments_are_checked_when_it_is_made(folder, changes, line):
    from keras_cait.errors import ArgumentError

    source = sources.image_folder(folder)
    arguments = {"batch_size": 16, "epochs": 1, **changes}
    with pytest.raises(ArgumentError) as caught:
        stream.training_stream(source, Augmentation(32, 10, **NO_AUGMENTATION), **arguments)
    assert str(caught.value) == line and caught.value.argument == line.split("=")[0]


def test_a_stream_that_starts_at_the_run_s_end_is_empty(folder):
    """A resumed run that had finished: every step done, nothing left to yield."""
    source = sources.image_folder(folder)
    augmentation = Augmentation(32, 10, **NO_AUGMENTATION)
    assert stream_images(source, augmentation, batch_size=16, epochs=2, seed=0, start_step=12) == []
    assert len(stream_images(source, augmentation, batch_size=16, epochs=2, seed=0, start_step=11)) == 1


def test_a_file_of_a_folder_that_is_no_image_is_named_by_the_streams(tmp_path, digits):
    """TensorFlow's decoder says "Unknown image file format" and names no file; a stream of one's own
    fed to model.fit named none either."""
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    fake = tmp_path / "photos" / "1" / "notes.jpg"
    fake.write_text("not an image, whatever its name says")
    source = sources.image_folder(folder)
    for dataset in (stream.training_stream(source, Augmentation(8, 2, **NO_AUGMENTATION), 5, 1),
                    stream.evaluation_dataset(source, 8, 5)):
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            for _ in dataset:
                pass
        assert f"[{fake}] [{sources.NOT_AN_IMAGE};" in caught.value.message
    with pytest.raises(tf.errors.InvalidArgumentError, match="notes.jpg"):
        sources.write_tfrecords(source, str(tmp_path / "records"))
    assert not list(tmp_path.glob("records*"))  # nothing half-written


@pytest.mark.parametrize("num_classes", [9, 11])
def test_an_augmentation_for_another_number_of_classes_is_refused_naming_both(folder, num_classes):
    """Fewer classes would one-hot the last class's labels to zero rows and train on them silently."""
    from keras_cait.errors import ArgumentError

    source = sources.image_folder(folder)
    with pytest.raises(ArgumentError, match=rf"^augmentation=<Augmentation of {num_classes} classes>: makes soft "
                       rf"labels over {num_classes} classes, but the source has 10 \(.*\); give it the source's: "
                       r".*num_classes=10") as caught:
        stream.training_stream(source, Augmentation(image_size=32, num_classes=num_classes), 8, 1)
    assert caught.value.argument == "augmentation"
