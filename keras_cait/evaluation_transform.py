"""The reference evaluation transform: decode, resize keeping the aspect ratio, crop the centre.

One implementation, in TensorFlow ops, for every place a CaiT sees an image to
classify: `keras_cait.preprocessing.load_image` (so `keras-cait predict` and
`keras-cait attention`), the SavedModel's `serving_bytes` signature
(`keras_cait.export`), and the evaluation and validation batches of
`keras_cait.training.stream.evaluation_dataset` (so `keras-cait evaluate`).
This module is TensorFlow by nature (tf.io decoders, tf.data, SavedModel
graphs); the model code stays backend-neutral.

It is timm's `transforms_imagenet_eval` with CaiT's pretrained config
(bicubic, crop_pct 1.0), with torchvision's integer geometry:

- square target S×S: the shorter side is resized to `s = floor(S / crop_pct)`
  and the longer one to `int(s * long / short)`, truncated (torchvision's
  `Resize(s)`);
- non-square target H×W: both sides are divided by
  `min(h / floor(H / crop_pct), w / floor(W / crop_pct))` and rounded (timm's
  `ResizeKeepRatio`), so the aspect ratio is kept rather than squashed;
- then the centre H×W is cropped at `round((resized - target) / 2)`, half to
  even (torchvision's `CenterCrop`).

Pixels: JPEG is decoded with the accurate integer IDCT, as PIL does (TF's
default fast IDCT differs by a level here and there); the resize is TF's
antialiased Keys bicubic (a = -0.5, PIL's bicubic kernel), and the result is
rounded and clipped to 0..255 like PIL's uint8 output. Against timm's PIL
pipeline pixels differ by rounding only: PIL computes with 22-bit fixed-point
weights and rounds to uint8 between its horizontal and vertical pass, TF
computes in float32 and rounds once (measured on photos: mean |Δ| ≤ 0.25 levels,
99th percentile ≤ 1; tests/test_evaluation_transform.py).

Memory is bounded by the decoded image and the target, whatever the aspect
ratio: only the cropped window of the resized image is computed
(`tf.raw_ops.ScaleAndTranslate`, the op behind `tf.image.resize`, with the crop
as a translation), so a 1×5000 image is not first resized to 224×1,120,000.
Images of more than `MAX_PIXELS` pixels are refused from their header, before
decoding, with INVALID_ARGUMENT.
"""

import math

import numpy as np
import tensorflow as tf

# PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS): a 9,459×9,459 image,
# 268 MB decoded. Checked from the file header, before anything is decoded.
MAX_PIXELS = 89_478_485
IMAGE_FORMATS = "JPEG, PNG, GIF or BMP"


def _little_endian(encoded, start, length):
    data = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, start, length), tf.uint8), tf.int64)
    return tf.reduce_sum(data * (256 ** tf.range(length, dtype=tf.int64)))


def _big_endian(encoded, start, length):
    data = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, start, length), tf.uint8), tf.int64)
    return tf.reduce_sum(data * (256 ** tf.range(length - 1, -1, -1, dtype=tf.int64)))


def header_size(encoded):
    """`(height, width)` int64 of a JPEG, PNG, GIF or BMP file, read from its header.

    Where the header is too short to hold the size, returns (0, 0) and leaves
    the error to the decoder.
    """
    encoded = tf.convert_to_tensor(encoded, tf.string)
    padded = encoded + tf.constant(b"\0" * 32)  # a truncated header reads as zeros

    def starts_with(magic):
        return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)

    def jpeg():
        shape = tf.io.extract_jpeg_shape(encoded, output_type=tf.int64)
        return shape[0], shape[1]

    def png():  # IHDR: width, height as big-endian uint32 at bytes 16 and 20
        return _big_endian(padded, 20, 4), _big_endian(padded, 16, 4)

    def gif():  # logical screen: width, height as little-endian uint16 at bytes 6 and 8
        return _little_endian(padded, 8, 2), _little_endian(padded, 6, 2)

    def bmp():  # BITMAPINFOHEADER: width, height as little-endian int32 (height < 0: top-down)
        height = _little_endian(padded, 22, 4)
        return tf.where(height >= 2**31, 2**32 - height, height), _little_endian(padded, 18, 4)

    def unknown():
        return tf.constant(0, tf.int64), tf.constant(0, tf.int64)

    return tf.case(
        [
            (tf.io.is_jpeg(encoded), jpeg),
            (starts_with(b"\x89PNG"), png),
            (starts_with(b"GIF8"), gif),
            (starts_with(b"BM"), bmp),
        ],
        default=unknown,
        exclusive=False,
    )


def decode_image(encoded):
    """Encoded JPEG/PNG/GIF/BMP bytes -> `(H, W, 3)` uint8 RGB, as PIL decodes them.

    JPEG uses the accurate integer IDCT (PIL's); the first frame of a GIF is
    kept. An image of more than `MAX_PIXELS` pixels fails with
    INVALID_ARGUMENT before it is decoded.
    """
    height, width = header_size(encoded)
    check = tf.debugging.Assert(
        height * width <= MAX_PIXELS,
        [
            tf.strings.join([
                "The image is ", tf.strings.as_string(height), "×", tf.strings.as_string(width),
                f" pixels; at most {MAX_PIXELS:,} are decoded (PIL's decompression-bomb limit). "
                "Downscale it first.",
            ])
        ],
        summarize=1,
    )
    with tf.control_dependencies([check]):
        image = tf.cond(
            tf.io.is_jpeg(encoded),
            lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE"),
            lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False),
        )
    image.set_shape([None, None, 3])
    return image


def target_size(image_size):
    """`224` or `(224, 320)` -> `(224, 224)` or `(224, 320)`: (height, width) of the model input."""
    height, width = (image_size, image_size) if np.ndim(image_size) == 0 else image_size
    return int(height), int(width)


def crop_geometry(height, width, image_size, crop_pct=1.0):
    """Where the evaluation transform resizes an image and crops it (module docstring).

    Args:
        height, width: the image's size (ints or int tensors).
        image_size: the model's input side, or its (height, width).
        crop_pct: the fraction of the resized image the crop keeps (CaiT: 1.0).

    Returns:
        int64 tensors `(resized_height, resized_width, top, left)`: resize to the
        first two, then crop the target from (top, left).

    Example:
        >>> [int(x) for x in crop_geometry(375, 500, 224)]
        [224, 298, 0, 37]
    """
    target_height, target_width = target_size(image_size)
    if not 0 < crop_pct <= 1:
        raise ValueError(f"crop_pct={crop_pct}: must be in (0, 1], e.g. 1.0 (CaiT) or 0.875 (DeiT).")
    scaled_height = math.floor(target_height / crop_pct)
    scaled_width = math.floor(target_width / crop_pct)
    height, width = tf.cast(height, tf.int64), tf.cast(width, tf.int64)
    if scaled_height == scaled_width:
        # torchvision Resize(int): the shorter side exact, the longer truncated.
        side = tf.constant(scaled_height, tf.int64)
        new_long = side * tf.maximum(height, width) // tf.minimum(height, width)
        resized_height = tf.where(width <= height, new_long, side)
        resized_width = tf.where(width <= height, side, new_long)
    else:
        # timm ResizeKeepRatio: float64 arithmetic and round half to even, as Python's.
        height64, width64 = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
        ratio = tf.minimum(height64 / scaled_height, width64 / scaled_width)
        resized_height = tf.cast(tf.round(height64 / ratio), tf.int64)
        resized_width = tf.cast(tf.round(width64 / ratio), tf.int64)
    top = tf.cast(tf.round(tf.cast(resized_height - target_height, tf.float64) / 2), tf.int64)
    left = tf.cast(tf.round(tf.cast(resized_width - target_width, tf.float64) / 2), tf.int64)
    return resized_height, resized_width, top, left


def evaluation_transform(image, image_size, crop_pct=1.0):
    """A decoded image `(h, w, 3)` -> the float32 `(H, W, 3)` pixels the model is evaluated on.

    Args:
        image: RGB pixels 0..255 (uint8 or float).
        image_size: the model's input side, or its (height, width).
        crop_pct: the fraction of the resized image the crop keeps (CaiT: 1.0).

    Returns the resized and centre-cropped image, rounded and clipped to 0..255.
    """
    target_height, target_width = target_size(image_size)
    shape = tf.shape(image)
    resized_height, resized_width, top, left = crop_geometry(shape[0], shape[1], image_size, crop_pct)
    # The scale as tf.image.resize computes it, so the window is its pixels.
    scale = tf.cast(tf.stack([resized_height, resized_width]), tf.float32) / tf.cast(shape[:2], tf.float32)
    window = tf.raw_ops.ScaleAndTranslate(
        images=tf.cast(image, tf.float32)[None],
        size=tf.constant([target_height, target_width], tf.int32),
        scale=scale,
        translation=-tf.cast(tf.stack([top, left]), tf.float32),
        kernel_type="keyscubic",
        antialias=True,
    )[0]
    window = tf.clip_by_value(tf.round(window), 0.0, 255.0)
    window.set_shape([target_height, target_width, 3])
    return window


def load_image(path, image_size=224, crop_pct=1.0):
    """An image file -> float32 `(H, W, 3)` 0..255, ready for a CaiT with that input size.

    See `keras_cait.preprocessing.load_image`.
    """
    try:
        encoded = tf.io.read_file(str(path))
        return evaluation_transform(decode_image(encoded), image_size, crop_pct).numpy()
    except tf.errors.NotFoundError as error:
        raise FileNotFoundError(f"Image {str(path)!r} does not exist.") from error
    except tf.errors.InvalidArgumentError as error:
        reason = error.message.strip().splitlines()[0]
        raise ValueError(f"Cannot read image {str(path)!r} ({IMAGE_FORMATS} expected): {reason}") from error
