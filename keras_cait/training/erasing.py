"""Random erasing as timm's `RandomErasing(mode="pixel")`, for the tf.data training stream.

Keras core's `RandomErasing` cannot express timm's: it clips its N(0, 1) fill to
`value_range` (with `value_range=(0, 1)` half of the erased pixels came out
exactly 0), draws the box's two sides independently, and has no retries. This
is the smallest piece that does what timm does, written as a pure function of a
stateless random key so that the training stream stays resumable bit for bit.
"""

import math

from keras_cait.io.stderr import load_tensorflow

tf = load_tensorflow()  # on JAX or PyTorch, its first import: without TensorFlow's start-up lines

ATTEMPTS = 10  # boxes tried per image before giving up (timm)


def erasing_box(shape, key, probability=0.25, area=(0.02, 1 / 3), min_aspect=0.3):
    """Where timm's `RandomErasing(probability, mode="pixel")` erases an `(H, W, C)` image.

    With probability `probability`, up to 10 boxes are drawn with

        area = U(area) · H·W,     log(aspect) = U(log min_aspect, -log min_aspect)
        h = round(√(area · aspect)),   w = round(√(area / aspect))

    and the first with h < H and w < W is placed at a uniform random integer
    corner; if none fits, nothing is erased. timm fills the box with unclipped
    N(0, 1) noise, independently per pixel and channel, after the ImageNet
    normalisation (DeiT `--reprob 0.25 --remode pixel`); these are its defaults.

    Args:
        shape: the image's shape `(H, W, C)`.
        key: a `tf.random` stateless key, shape `(2,)`.
        probability: chance that the image gets a box.
        area: range of the box area as a fraction of the image area.
        min_aspect: the aspect (h / w) range is `(min_aspect, 1 / min_aspect)`.

    Returns:
        `(mask, noise)`: a boolean `(H, W, 1)` mask of the erased pixels and
        float32 N(0, 1) noise of shape `(H, W, C)` to fill them with.
    """
    return erasing_mask(shape, key, probability, area, min_aspect), erasing_noise(shape, key)


def erasing_noise(shape, key):
    """The N(0, 1) noise of `erasing_box`, drawn alone (only an image that gets a box needs it)."""
    return tf.random.stateless_normal(shape, _keys(key)[2])


def _keys(key):
    """The apply, box and noise keys of one image."""
    return tf.unstack(tf.random.experimental.stateless_split(key, 3))


def erasing_mask(shape, key, probability=0.25, area=(0.02, 1 / 3), min_aspect=0.3):
    """The boolean `(H, W, 1)` mask of `erasing_box`, without its noise."""
    apply_key, box_key, _ = _keys(key)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    draws = tf.random.stateless_uniform((4, ATTEMPTS), box_key)
    target = (area[0] + (area[1] - area[0]) * draws[0]) * height * width
    aspect = tf.exp(math.log(min_aspect) * (1.0 - 2.0 * draws[1]))
    # tf.round rounds halves to even, as Python's round() in timm.
    box_height = tf.round(tf.sqrt(target * aspect))
    box_width = tf.round(tf.sqrt(target / aspect))
    fits = (box_height < height) & (box_width < width)
    first = tf.argmax(tf.cast(fits, tf.int32))
    box_height, box_width = box_height[first], box_width[first]
    top = tf.floor(draws[2][first] * (height - box_height + 1.0))
    left = tf.floor(draws[3][first] * (width - box_width + 1.0))

    rows = tf.range(height)[:, None]
    columns = tf.range(width)[None, :]
    inside = (
        (rows >= top) & (rows < top + box_height) & (columns >= left) & (columns < left + box_width)
    )
    erase = (tf.random.stateless_uniform((), apply_key) < probability) & tf.reduce_any(fits)
    return (erase & inside)[:, :, None]
