"""Training and evaluation streams (tf.data) of an image source.

`training_stream` shuffles, decodes and augments a source's examples in
parallel; every random draw except Keras' RandAugment is a pure function of
(seed, epoch, position), so a stream that starts at step k
yields exactly the batches k, k+1, ... of one that started at 0, which is what
lets a killed run resume bit for bit. `evaluation_dataset` applies the
reference's evaluation transform (`keras_cait.images.evaluation_transform`).
"""

import math
import numbers

import numpy

from keras_cait.errors import ArgumentError, Named, checked_bool, checked_count, counted, listed
from keras_cait.images.evaluation_transform import (
    check_crop_pct, decode_image, decoded_size, evaluation_transform, target_size,
)
from keras_cait.io.stderr import load_tensorflow
from keras_cait.layers.initializers import python_generator_kept
from keras_cait.training import augment, mixup_cutmix, random_resized_crop, sources
from keras_cait.training.random_resized_crop import ATTEMPTS

tf = load_tensorflow()  # on JAX or PyTorch, its first import: without TensorFlow's start-up lines

AUTOTUNE = tf.data.AUTOTUNE


class _TensorFlowOps:
    """The `keras.ops` functions that the augmentation functions use, on TensorFlow tensors.

    tf.data runs TensorFlow ops whatever the Keras backend, so the training
    stream hands `random_resized_crop` and `mixup_cutmix` these instead of
    `keras.ops` (the same names and arguments).
    """

    any = staticmethod(lambda x, axis=None: tf.reduce_any(x, axis=axis))
    arange = staticmethod(lambda stop, dtype="int32": tf.range(tf.cast(stop, dtype), dtype=dtype))
    argmax = staticmethod(lambda x, axis=None: tf.argmax(x, axis=axis, output_type=tf.int32))
    cast = staticmethod(tf.cast)
    clip = staticmethod(lambda x, low, high: tf.clip_by_value(x, tf.cast(low, x.dtype), tf.cast(high, x.dtype)))
    convert_to_tensor = staticmethod(tf.convert_to_tensor)
    exp = staticmethod(tf.exp)
    flip = staticmethod(lambda x, axis: tf.reverse(x, [axis]))
    floor = staticmethod(tf.floor)
    minimum = staticmethod(tf.minimum)
    one_hot = staticmethod(lambda x, num_classes, dtype="float32": tf.one_hot(x, num_classes, dtype=dtype))
    ones = staticmethod(tf.ones)
    round = staticmethod(tf.round)
    shape = staticmethod(tf.shape)
    sqrt = staticmethod(tf.sqrt)
    stack = staticmethod(lambda values, axis=0: tf.stack(values, axis=axis))
    sum = staticmethod(lambda x, axis=None: tf.reduce_sum(x, axis=axis))
    where = staticmethod(tf.where)
    zeros = staticmethod(tf.zeros)

    class image:  # noqa: N801 (keras.ops.image's name)
        @staticmethod
        def resize(images, size, interpolation="bilinear", antialias=False):
            return tf.image.resize(images, size, method=interpolation, antialias=antialias)


TF_OPS = _TensorFlowOps()


def evaluation_dataset(source, image_size, batch_size, crop_pct=1.0, one_hot=False, cache=False):
    """Batches of (evaluation-transformed images, labels) in the source's order.

    Labels are class indices, or one-hot float vectors with `one_hot=True`
    (to match a categorical training loss). `cache=True` keeps the transformed
    images in memory after the first pass.
    """
    sources.checked_source(source, "evaluation_dataset")
    _check_batch_size(batch_size)
    one_hot, cache = checked_bool("one_hot", one_hot), checked_bool("cache", cache)
    target_size(image_size), check_crop_pct(crop_pct)  # checked here, not inside the tf.data function
    num_classes = source.num_classes

    def prepare(*element):
        encoded, label = source.load(*element)
        image = evaluation_transform(decode_image(encoded), image_size, crop_pct)
        if one_hot:
            label = tf.one_hot(label, num_classes)
        return image, label

    dataset = source.examples.map(prepare, num_parallel_calls=AUTOTUNE)
    if dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY:
        # TFRecords (a split of them too): Keras' evaluation of a dataset of unknown size warned "Your input ran
        # out of data; interrupting training" at its end, a run's validation of every epoch included.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(source.num_examples))
    if cache:
        dataset = dataset.cache()
    return dataset.batch(batch_size).prefetch(AUTOTUNE)


def _block_shuffle(examples, buffer, key):
    """Permutes each run of `buffer` consecutive examples by a stateless draw from `key`.

    With `buffer` >= the example count this is a uniform permutation of the
    whole epoch. Unlike `Dataset.shuffle` the order depends on `key` alone, not
    on how many iterators were made before, which a resumed run needs.
    """

    def permute(index, block):
        size = tf.shape(tf.nest.flatten(block)[0])[0]
        noise = tf.random.stateless_uniform(
            [size], tf.random.experimental.stateless_fold_in(key, index)
        )
        order = tf.argsort(noise)
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, order), block)

    return examples.batch(buffer).enumerate().map(permute).unbatch()


def _check_batch_size(batch_size):
    checked_count("batch_size", batch_size, 64)


def steps_per_epoch(source, batch_size):
    """Full batches per epoch (the last partial batch is dropped, as DeiT's loader does)."""
    _check_batch_size(batch_size)
    steps = source.num_examples // batch_size
    if steps == 0:
        raise ArgumentError("batch_size", batch_size, f"is larger than the {source.num_examples} training images",
                            f"use a batch of at most {source.num_examples}")
    return steps


def _checked_seed(seed):
    """`seed` as an int where it is an integer (numpy's too, not a bool) that an int64 holds."""
    integer = not isinstance(seed, (bool, numpy.bool_)) and isinstance(seed, numbers.Integral)
    if integer and -2**63 <= seed < 2**63:
        return int(seed)
    raise ArgumentError("seed", seed, "must be an integer" + ("" if integer else f", not {type(seed).__name__}"),
                        ["e.g. ", Named("seed", 0)], usage=True)


def training_stream(
    source,
    augmentation,
    batch_size,
    epochs,
    seed=0,
    start_step=0,
    shuffle_buffer=None,
    cache=False,
):
    """The batches of a whole training run, from step `start_step` on.

    Each epoch shuffles the examples (seeded by seed and epoch), keeps
    ceil(N / repeats) of them and repeats each `repeats` times (DeiT's repeated
    augmentation), decodes and augments each image (RandomResizedCrop, flip,
    RandAugment, random erasing), batches them, and mixes each batch
    (mixup/cutmix with soft labels).

    Args:
        source: an `ImageSource`.
        augmentation: an `augment.Augmentation`.
        batch_size: the global batch size.
        epochs: the length of the run; the stream ends after it.
        seed: the seed of every random draw.
        start_step: the first batch to yield (the steps a resumed run has done).
        shuffle_buffer: examples shuffled together; None shuffles the whole
            epoch for in-memory sources (file paths) and blocks of 10,000
            records for TFRecords and TFDS.
        cache: keep the encoded images in memory after the first epoch.

    Returns:
        a `tf.data.Dataset` of `(images (B, S, S, 3) float32 0..255, soft labels (B, K))`.
    """
    sources.checked_source(source, "training_stream")
    if not isinstance(augmentation, augment.Augmentation):
        raise ArgumentError("augmentation", augmentation, f"training_stream takes an Augmentation, not a "
                            f"{type(augmentation).__name__}", "e.g. keras_cait.training.Augmentation(224, "
                            "source.num_classes), or a recipe's: RECIPES['transfer'].augmentation(224, "
                            "source.num_classes)", usage=True, shown=f"<{type(augmentation).__name__}>")
    if augmentation.num_classes != source.num_classes:
        raise ArgumentError("augmentation", augmentation,
                            f"makes soft labels over {augmentation.num_classes} classes, but the source has "
                            f"{source.num_classes} ({listed(source.class_names)})",
                            ["give it the source's: keras_cait.training.Augmentation(image_size, ",
                             Named("num_classes", source.num_classes), "), or a recipe's ",
                             "augmentation(image_size, source.num_classes)"],
                            usage=True, shown=f"<Augmentation of {augmentation.num_classes} classes>")
    epochs = checked_count("epochs", epochs, 300)
    seed = _checked_seed(seed)
    start_step = checked_count("start_step", start_step, 0, minimum=0, note=", the steps a resumed run has done")
    if shuffle_buffer is not None:
        shuffle_buffer = checked_count("shuffle_buffer", shuffle_buffer, 10_000, note=" or None")
    cache = checked_bool("cache", cache)
    steps = steps_per_epoch(source, batch_size)
    if start_step > steps * epochs:
        raise ArgumentError("start_step", start_step,
                            f"is past the run's end: {counted(epochs, 'epoch')} of {steps} steps are "
                            f"{steps * epochs} steps",
                            f"give a step from 0 to {steps * epochs}", usage=True)
    examples_per_epoch = steps * batch_size
    first_epoch, first_batch = divmod(start_step, steps)
    examples, load = source.examples, source.load
    if cache:
        examples = examples.map(load, num_parallel_calls=AUTOTUNE).cache()
        load = None
    buffer = shuffle_buffer or (source.num_examples if source.in_memory else 10_000)
    repeats = augmentation.repeats
    unique_per_epoch = math.ceil(source.num_examples / repeats)

    with python_generator_kept():  # read for their settings only: the stream draws from `seed`
        crop = augmentation.crop()
        mix = augmentation.mix()
    rand_augment = None
    if augmentation.rand_augment_magnitude:
        rand_augment = augment.rand_augment(augmentation.rand_augment_magnitude, seed=seed)
    erase = None
    if augmentation.random_erasing:
        erase = augment.random_erasing(augmentation.random_erasing)
    run_key = tf.constant([seed, 0], tf.int64)
    element_key, batch_key, shuffle_key = (
        tf.random.experimental.stateless_fold_in(run_key, purpose) for purpose in range(3)
    )

    def augment_example(index, example):
        if load is not None:
            example = load(*example) if isinstance(example, tuple) else load(example)
        encoded, label = example
        keys = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(element_key, index), 3
        )
        uniforms = tf.random.stateless_uniform((1, ATTEMPTS, 4), keys[0])
        _, height, width = decoded_size(encoded)
        boxes = random_resized_crop.crop_boxes(uniforms, height, width, crop.scale, crop.ratio, TF_OPS)
        # Only the box is decoded (a JPEG's other blocks are skipped), then resized whole.
        window = decode_image(encoded, window=boxes[0])
        whole_window = tf.concat([[0.0, 0.0], boxes[0, 2:]], 0)
        image = random_resized_crop.crop_one(
            window[None], whole_window, crop.height, crop.width,
            crop.interpolation, crop.antialias, TF_OPS,
        )[0]
        image = tf.clip_by_value(tf.round(image), 0.0, 255.0)
        if augmentation.horizontal_flip:
            image = tf.image.stateless_random_flip_left_right(image, keys[1])
        if rand_augment is not None:
            image = rand_augment(image)
        if erase is not None:
            image = erase(image, keys[2])
        return image, label

    def mix_batch(step, images, labels):
        keys = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(batch_key, step), 4
        )
        switch = tf.random.stateless_uniform((), keys[0])

        def beta(alpha, key):
            gammas = tf.random.stateless_gamma((2,), key, alpha=max(alpha, 1e-3))
            return gammas[0] / (gammas[0] + gammas[1])

        centre = tf.random.stateless_uniform((2,), keys[3])
        shape = tf.shape(images)
        transformation = mixup_cutmix.transformation_from_draws(
            switch,
            beta(augmentation.mixup_alpha, keys[1]),
            beta(augmentation.cutmix_alpha, keys[2]),
            centre,
            shape[1],
            shape[2],
            mix.mixup_alpha,
            mix.cutmix_alpha,
            mix.switch_prob,
            TF_OPS,
        )
        images = mixup_cutmix.mix_images(images, transformation, TF_OPS)
        labels = mixup_cutmix.mix_labels(labels, transformation, mix.num_classes, mix.label_smoothing, TF_OPS)
        return images, labels

    def one_epoch(epoch_index):
        epoch_key = tf.random.experimental.stateless_fold_in(shuffle_key, epoch_index)
        shuffled = _block_shuffle(examples, buffer, epoch_key)
        if repeats > 1:
            shuffled = shuffled.take(unique_per_epoch).flat_map(
                lambda *example: tf.data.Dataset.from_tensors(example).repeat(repeats)
            )
        skipped = tf.where(
            epoch_index == first_epoch, tf.constant(first_batch * batch_size, tf.int64), 0
        )
        first_position = epoch_index * examples_per_epoch
        positions = tf.data.Dataset.range(first_position, first_position + examples_per_epoch)
        epoch_examples = tf.data.Dataset.zip(positions, shuffled).skip(skipped)
        # Skipped examples of a resumed epoch are neither read nor decoded.
        images = epoch_examples.map(augment_example, num_parallel_calls=AUTOTUNE)
        batches = images.batch(batch_size, drop_remainder=True)
        first_step = epoch_index * steps + skipped // batch_size
        batch_steps = tf.data.Dataset.range(first_step, (epoch_index + 1) * steps)
        return tf.data.Dataset.zip(batch_steps, batches).map(
            lambda step, batch: mix_batch(step, *batch), num_parallel_calls=AUTOTUNE
        )

    stream = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    return stream.prefetch(AUTOTUNE)
