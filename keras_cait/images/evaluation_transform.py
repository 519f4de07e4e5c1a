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
99th percentile ≤ 1; tests/images/test_evaluation_transform.py).

Memory is bounded by the decoded image and the target, whatever the aspect
ratio: only the cropped window of the resized image is computed
(`tf.raw_ops.ScaleAndTranslate`, the op behind `tf.image.resize`, with the crop
as a translation), so a 1×5000 image is not first resized to 224×1,120,000.
Images of more than `MAX_PIXELS` pixels are refused from their header, before
decoding, with INVALID_ARGUMENT.
"""

import dataclasses
import math
import numbers
import os
import re

import numpy as np

from keras_cait.errors import ArgumentError, Named, quietly_caused
from keras_cait.images.decoder_messages import decoder_messages_dropped
from keras_cait.io.stderr import load_tensorflow

tf = load_tensorflow()  # on JAX or PyTorch, its first import: without TensorFlow's start-up lines

# PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS): a 9,459×9,459 image,
# 268 MB decoded. Checked from the file header, before anything is decoded.
MAX_PIXELS = 89_478_485


@dataclasses.dataclass(frozen=True)
class ImageFormat:
    """A file format keras_cait reads: its `name`, its file `extensions` (lower case) and its
    `signature`, the `(offset, bytes)` pairs its first bytes hold."""

    name: str
    extensions: tuple
    signature: tuple

    def matches(self, head):
        return all(head[offset:offset + len(magic)] == magic for offset, magic in self.signature)


# The one list of image formats: those TensorFlow's `tf.io.decode_image` decodes (checked with
# TensorFlow 2.21) and whose size `decoded_size` reads from the header, so that `MAX_PIXELS`
# holds. The training and evaluation streams (image folders list these extensions),
# `load_image` (`keras-cait predict`) and the SavedModel's `serving_bytes` take these and no
# other, and every message that lists formats is made from it. TensorFlow 2.21 also decodes
# JPEG XL, but no size is read from a JPEG XL header here, so it is refused like TIFF.
IMAGE_FILE_FORMATS = (
    ImageFormat("JPEG", (".jpg", ".jpeg"), ((0, b"\xff\xd8\xff"),)),
    ImageFormat("PNG", (".png",), ((0, b"\x89PNG\r\n\x1a\n"),)),
    ImageFormat("GIF", (".gif",), ((0, b"GIF8"),)),
    ImageFormat("BMP", (".bmp",), ((0, b"BM"),)),
    ImageFormat("WebP", (".webp",), ((0, b"RIFF"), (8, b"WEBP"))),
)
IMAGE_EXTENSIONS = tuple(extension for known in IMAGE_FILE_FORMATS for extension in known.extensions)
IMAGE_FORMATS = ", ".join(known.name for known in IMAGE_FILE_FORMATS[:-1]) + f" or {IMAGE_FILE_FORMATS[-1].name}"
# Bytes of a file's start that `header_fault` needs (a WebP's VP8X flags are at byte 20).
HEADER_BYTES = 32
# Formats that are not read, by their first bytes, to say what a refused file is.
_OTHER_FORMATS = (
    ("TIFF", ((0, b"II*\x00"),)), ("TIFF", ((0, b"MM\x00*"),)),
    ("JPEG XL", ((0, b"\xff\x0a"),)), ("JPEG XL", ((0, b"\x00\x00\x00\x0cJXL "),)),
    ("JPEG 2000", ((0, b"\x00\x00\x00\x0cjP  "),)), ("JPEG 2000", ((0, b"\xff\x4f\xff\x51"),)),
    ("HEIC", ((4, b"ftyphei"),)), ("HEIC", ((4, b"ftypmif1"),)), ("AVIF", ((4, b"ftypavi"),)),
)


def is_image_file_name(name):
    """Whether a file's name ends in one of `IMAGE_EXTENSIONS` (any case)."""
    return os.fspath(name).lower().endswith(IMAGE_EXTENSIONS)


def header_fault(head):
    """Why a file whose first bytes are `head` (`HEADER_BYTES` of them, or all if fewer) is not
    decoded, in a few words, or None where it may be: "an empty file", "a TIFF file", "not an
    image file", "an animated WebP (...)"."""
    if not head:
        return "an empty file"
    known = next((known for known in IMAGE_FILE_FORMATS if known.matches(head)), None)
    if known is None:
        other = next((name for name, signature in _OTHER_FORMATS
                      if ImageFormat(name, (), signature).matches(head)), None)
        return f"a {other} file" if other else "not an image file"
    if known.name == "WebP" and head[12:16] == b"VP8X" and len(head) > 20 and head[20] & 0x02:
        return "an animated WebP (TensorFlow decodes still WebP images only)"
    return None


def has_image_signature(encoded):
    """A bool tensor: whether each of the string tensor `encoded` starts as a file of
    `IMAGE_FILE_FORMATS` does (the graph's `header_fault`, without the reasons)."""
    known = tf.zeros_like(encoded, tf.bool)
    longest = max(offset + len(magic) for image_format in IMAGE_FILE_FORMATS
                  for offset, magic in image_format.signature)
    padded = tf.strings.join([encoded, b"\0" * longest])  # substr past a short string's end is an error
    for image_format in IMAGE_FILE_FORMATS:
        matches = tf.ones_like(encoded, tf.bool)
        for offset, magic in image_format.signature:
            matches &= tf.equal(tf.strings.substr(padded, offset, len(magic)), magic)
        known |= matches
    return known


def decode_error_reason(message):
    """TensorFlow's decode error, in a few words: `jpeg::Uncompress failed. Invalid JPEG data or crop
    window.` -> `invalid JPEG data (...)`; the pixel limit's assertion -> `WxH pixels, ...`."""
    too_large = re.search(r"The image is (.*?) pixels;", message)
    if too_large:
        return (f"{too_large.group(1)} pixels, more than the {MAX_PIXELS:,} that are decoded "
                "(PIL's decompression-bomb limit)")
    message = re.sub(r"\{\{function_node [^}]*\}\}", "", message)
    lines = re.sub(r"\s*\[Op:\w+\].*", "", message).strip().splitlines()
    reason = lines[0].strip().rstrip(".") if lines else ""
    if "Invalid JPEG data" in reason:  # "... or crop window": the full decode has none
        return "invalid JPEG data (a truncated or damaged file)"
    if "Unknown image file format" in reason:  # TensorFlow's own list of formats is not the one read here
        return "not an image file"
    if "WebP Animation" in reason:
        return "an animated WebP (TensorFlow decodes still WebP images only)"
    return reason or "a decoder error"
_TOO_LARGE = f" pixels; at most {MAX_PIXELS:,} are decoded (PIL's decompression-bomb limit). Downscale it first."


def _little_endian(encoded, start, length):
    data = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, start, length), tf.uint8), tf.int64)
    return tf.reduce_sum(data * (256 ** tf.range(length, dtype=tf.int64)))


def _big_endian(encoded, start, length):
    data = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, start, length), tf.uint8), tf.int64)
    return tf.reduce_sum(data * (256 ** tf.range(length - 1, -1, -1, dtype=tf.int64)))


@tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
def gif_frames(encoded):
    """`(frames, height, width)` int64 of a GIF: how many images it holds, and the largest
    height and width of its logical screen and of every frame.

    The decoder allocates each frame at its own size, which may exceed the screen
    (a 64×64 screen can hold a 12000×12000 frame), and keeps every frame; so the
    blocks are walked, one step per block or data sub-block, before decoding. A
    truncated file ends the walk and leaves the error to the decoder.
    """
    data = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int64)
    size = tf.size(data, out_type=tf.int64)
    data = tf.concat([data, tf.zeros([16], tf.int64)], 0)  # reads past the end see zeros

    def byte(i):
        return tf.gather(data, tf.minimum(tf.cast(i, tf.int64), size))

    def uint16(i):
        return byte(i) + 256 * byte(i + 1)

    def color_table(flags):  # 3 · 2^(n+1) bytes where the flags say one follows
        return tf.where(flags >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), flags % 8), 0)

    def step(position, in_data, frames, height, width):
        value = byte(position)
        image, extension = tf.equal(value, 0x2C), tf.equal(value, 0x21)
        after_block = tf.where(
            image, position + 11 + color_table(byte(position + 9)),  # descriptor, table, LZW size
            tf.where(extension, position + 2, size),  # the trailer (or garbage) ends the walk
        )
        return (
            tf.where(in_data, position + 1 + value, after_block),
            tf.where(in_data, value > 0, image | extension),
            frames + tf.cast(image & ~in_data, tf.int64),
            tf.where(image & ~in_data, tf.maximum(height, uint16(position + 7)), height),
            tf.where(image & ~in_data, tf.maximum(width, uint16(position + 5)), width),
        )

    _, _, frames, height, width = tf.while_loop(
        lambda position, *_: position < size,
        step,
        (13 + color_table(byte(10)), tf.constant(False), tf.constant(0, tf.int64), uint16(8), uint16(6)),
    )
    return frames, height, width


def decoded_size(encoded):
    """`(frames, height, width)` int64 that decoding a JPEG, PNG, GIF, BMP or WebP file makes.

    Read from the header; for a GIF, its frame count and the largest height and
    width of its screen and frames (`gif_frames`), for the others one frame.
    Where the header is too short to hold the size, the sides are 0 and the
    error is left to the decoder.
    """
    encoded = tf.convert_to_tensor(encoded, tf.string)
    padded = encoded + tf.constant(b"\0" * 32)  # a truncated header reads as zeros
    one = tf.constant(1, tf.int64)

    def starts_with(magic):
        return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)

    def jpeg():
        shape = tf.io.extract_jpeg_shape(encoded, output_type=tf.int64)
        return one, shape[0], shape[1]

    def png():  # IHDR: width, height as big-endian uint32 at bytes 16 and 20
        return one, _big_endian(padded, 20, 4), _big_endian(padded, 16, 4)

    def gif():
        return gif_frames(encoded)

    def bmp():  # BITMAPINFOHEADER: width, height as little-endian int32 (height < 0: top-down)
        height = _little_endian(padded, 22, 4)
        return one, tf.where(height >= 2**31, 2**32 - height, height), _little_endian(padded, 18, 4)

    def webp():  # RIFF....WEBP, then a VP8 (lossy), VP8L (lossless) or VP8X (extended) chunk
        chunk = tf.strings.substr(padded, 12, 4)
        lossless = _little_endian(padded, 21, 4)
        return tf.case([
            (tf.equal(chunk, b"VP8 "), lambda: (one, _little_endian(padded, 28, 2) % 16384,
                                                _little_endian(padded, 26, 2) % 16384)),
            (tf.equal(chunk, b"VP8L"), lambda: (one, lossless // 16384 % 16384 + 1,
                                                lossless % 16384 + 1)),
            (tf.equal(chunk, b"VP8X"), lambda: (one, _little_endian(padded, 27, 3) + 1,
                                                _little_endian(padded, 24, 3) + 1)),
        ], default=unknown)

    def unknown():
        return one, tf.constant(0, tf.int64), tf.constant(0, tf.int64)

    return tf.case(
        [
            (tf.io.is_jpeg(encoded), jpeg),
            (starts_with(b"\x89PNG"), png),
            (starts_with(b"GIF8"), gif),
            (starts_with(b"BM"), bmp),
            (starts_with(b"RIFF") & tf.equal(tf.strings.substr(padded, 8, 4), b"WEBP"), webp),
        ],
        default=unknown,
        exclusive=False,
    )


def header_size(encoded):
    """`(height, width)` int64 of a JPEG, PNG, GIF, BMP or WebP file (`decoded_size`)."""
    _, height, width = decoded_size(encoded)
    return height, width


def _too_large(frames, height, width):
    """The refusal, as a string tensor: `The image is [N frames of ]HxW pixels; at most ...`."""
    frames_text = tf.where(frames > 1, tf.strings.join([tf.strings.as_string(frames), " frames of "]), "")
    return tf.strings.join(["The image is ", frames_text, tf.strings.as_string(height), "x",
                            tf.strings.as_string(width), _TOO_LARGE])


def decode_image(encoded, window=None):
    """Encoded JPEG/PNG/GIF/BMP/WebP bytes -> `(H, W, 3)` uint8 RGB, as PIL decodes them.

    JPEG uses the accurate integer IDCT (PIL's); the first frame of a GIF is
    kept. A 16-bit PNG is reduced to 8 bits per channel (the high byte of each
    value), where PIL's `convert("RGB")` clips 16-bit grayscale at 255: convert
    such files yourself if you need PIL's result. A file whose frames hold more
    than `MAX_PIXELS` pixels in all (every GIF frame at its real size) fails
    with INVALID_ARGUMENT before it is decoded.

    `window` (`[top, left, height, width]` inside the image, as `decoded_size`
    gives its size) returns only those pixels; a JPEG then decodes only the
    blocks around them (`tf.io.decode_and_crop_jpeg`), the same pixels as
    decoding it whole and slicing.
    """
    frames, height, width = decoded_size(encoded)
    check = tf.debugging.Assert(
        frames * height * width <= MAX_PIXELS, [_too_large(frames, height, width)], summarize=1
    )

    if window is not None:
        window = tf.cast(window, tf.int32)

    def decode_jpeg():
        if window is None:
            return tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE")
        return _jpeg_window(encoded, window, height, width)

    def decode_other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        if window is None:
            return image
        top, left, window_height, window_width = tf.unstack(window)
        return image[top:top + window_height, left:left + window_width]

    with tf.control_dependencies([check]):
        image = tf.cond(tf.io.is_jpeg(encoded), decode_jpeg, decode_other)
    image.set_shape([None, None, 3])
    return image


# libjpeg's cropped decode upsamples chroma at the edges of its window as at an image's
# edges (up to 13 levels off PIL's in the window's last column): decode one MCU more on
# every side, then slice.
_JPEG_WINDOW_MARGIN = 16


def _jpeg_window(encoded, window, image_height, image_width):
    top, left, height, width = tf.unstack(window)
    size = tf.cast(tf.stack([image_height, image_width]), tf.int32)
    start = tf.maximum(tf.stack([top, left]) - _JPEG_WINDOW_MARGIN, 0)
    end = tf.minimum(tf.stack([top + height, left + width]) + _JPEG_WINDOW_MARGIN, size)
    wider = tf.io.decode_and_crop_jpeg(encoded, tf.concat([start, end - start], 0), channels=3,
                                       dct_method="INTEGER_ACCURATE")
    top, left = top - start[0], left - start[1]
    return wider[top:top + height, left:left + width]


def target_size(image_size):
    """`224` or `(224, 320)` -> `(224, 224)` or `(224, 320)`: (height, width) of the model input;
    anything else (a side that is no positive integer) an `ArgumentError` naming `image_size`."""
    sides = (image_size, image_size) if np.ndim(image_size) == 0 else tuple(image_size)
    if len(sides) != 2 or not all(isinstance(side, numbers.Real) and not isinstance(side, bool) and side > 0
                                  and math.isfinite(side) and side == int(side) for side in sides):
        raise ArgumentError("image_size", image_size, "must be a positive integer or a (height, width) pair of them",
                            ["e.g. ", Named("image_size", 224)], usage=True)
    if sides[0] * sides[1] > MAX_PIXELS:  # 20000 used to allocate 13 GiB before a raw out-of-memory error
        raise ArgumentError("image_size", image_size, f"is {sides[0] * sides[1]:,} pixels, more than the "
                            f"{MAX_PIXELS:,} an image may have here", ["e.g. ", Named("image_size", 224)], usage=True)
    return int(sides[0]), int(sides[1])


def check_crop_pct(crop_pct):
    """`crop_pct`, the fraction of the resized image the centre crop keeps, within (0, 1]; else an
    `ArgumentError` naming it. The one check of its range: the transform, the keras-hub converter,
    the runs (before they read data) and so the command line."""
    if isinstance(crop_pct, bool) or not isinstance(crop_pct, numbers.Real):
        raise ArgumentError("crop_pct", crop_pct, f"must be a number in (0, 1], not {type(crop_pct).__name__}",
                            ["e.g. ", Named("crop_pct", 1.0), " (CaiT) or ", Named("crop_pct", 0.875), " (DeiT)"],
                            usage=True)
    if not 0 < crop_pct <= 1:
        raise ArgumentError("crop_pct", crop_pct, "must be in (0, 1]",
                            ["e.g. ", Named("crop_pct", 1.0), " (CaiT) or ", Named("crop_pct", 0.875), " (DeiT)"],
                            usage=True)
    return crop_pct


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
    check_crop_pct(crop_pct)
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
    image = _checked_image(image)
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


def _checked_image(image):
    """`image` of `evaluation_transform` as a tensor, after checking what its static shape says (a graph's
    unknown sides pass): RGB pixels `(h, w, 3)`; a grey `(h, w)` or RGBA image, a batch or a path is an
    `ArgumentError` naming `image`, not ScaleAndTranslate's "input must be 4-dimensional"."""
    if isinstance(image, (str, bytes, os.PathLike)):
        raise ArgumentError("image", image, "evaluation_transform takes decoded pixels, not a path",
                            "read a file with keras_cait.images.evaluation_transform.load_image(path, image_size)",
                            usage=True)
    kind = type(image).__name__
    image = image if tf.is_tensor(image) else tf.convert_to_tensor(np.asarray(image))
    shape = image.shape
    shown = f"<{kind} of {image.dtype.name} and shape {tuple(shape) if shape.rank is not None else 'unknown'}>"
    if image.dtype in (tf.string, tf.bool) or (
            shape.rank is not None and (shape.rank != 3 or shape[-1] not in (None, 3))):
        raise ArgumentError("image", image, "must be RGB pixels, numbers of shape (height, width, 3)",
                            "convert a grey or RGBA image to RGB first (PIL: image.convert('RGB')), and "
                            "transform a batch one image at a time", usage=True, shown=shown)
    if shape.rank is not None and 0 in shape[:2]:
        raise ArgumentError("image", image, "has no pixels", "give an image of at least 1x1 pixels", usage=True,
                            shown=shown)
    return image


def check_image_path(path):
    """`path` of `load_image`: a str or path-like naming a local file; an array, a PIL image, bytes or
    a URL is an `ArgumentError` naming `path` and what reads it."""
    in_memory = ("an image already in memory is resized and cropped by "
                 "keras_cait.images.evaluation_transform.evaluation_transform(np.asarray(image), image_size)")
    if not isinstance(path, (str, os.PathLike)):
        kind = type(path).__name__
        shown = f"<{kind} of shape {np.shape(path)}>" if isinstance(path, np.ndarray) else f"<{kind}>"
        raise ArgumentError("path", path, f"load_image reads an image file, not a {kind}",
                            f"give the path of a {IMAGE_FORMATS} file; {in_memory}", usage=True, shown=shown)
    if re.match(r"https?://", os.fspath(path)):
        raise ArgumentError("path", os.fspath(path), "load_image reads local files, not URLs",
                            "download it first, e.g. keras.utils.get_file(origin=url), and give the file's path",
                            usage=True)


def load_image(path, image_size=224, crop_pct=1.0):
    """An image file -> float32 `(H, W, 3)` 0..255, ready for a CaiT with that input size.

    See `keras_cait.preprocessing.load_image`.
    """
    check_image_path(path)
    unreadable = f"Cannot read image {str(path)!r} ({IMAGE_FORMATS} expected)"
    target_size(image_size)  # the arguments checked before the file is read
    check_crop_pct(crop_pct)
    try:
        if os.path.isdir(path):
            raise ValueError(f"Image {str(path)!r} is a folder; pass an image file ({IMAGE_FORMATS}).")
        if not tf.io.gfile.exists(str(path)):  # asked first: a failed read logs TensorFlow's own lines
            raise FileNotFoundError(f"Image {str(path)!r} does not exist.")
        encoded = tf.io.read_file(str(path))
        fault = header_fault(tf.strings.substr(encoded, 0, HEADER_BYTES).numpy())
        if fault is not None:
            raise ValueError(f"{unreadable}: {fault}.")
        # A damaged file's decoder lines (reading its size prints them too): the error below names it.
        with decoder_messages_dropped():
            frames, height, width = (int(side) for side in decoded_size(encoded))
            if frames * height * width > MAX_PIXELS:
                message = _too_large(frames, height, width).numpy().decode()
                raise ValueError(message.replace("The image", f"Image {str(path)!r}", 1))
            return evaluation_transform(decode_image(encoded), image_size, crop_pct).numpy()
    except tf.errors.NotFoundError as error:
        raise quietly_caused(FileNotFoundError(f"Image {str(path)!r} does not exist."), error) from None
    except tf.errors.InvalidArgumentError as error:
        raise quietly_caused(ValueError(f"{unreadable}: {decode_error_reason(error.message)}."), error) from None
