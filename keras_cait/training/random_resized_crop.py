"""RandomResizedCrop: the Inception crop of DeiT/CaiT training, as a Keras layer.

The box sampling and the crop are pure functions of an `ops` namespace
(`keras.ops` by default); the layer draws the random numbers and calls them.
`keras_cait.training.stream` calls the same functions with TensorFlow ops
inside tf.data, whatever the Keras backend. Built on the public
`keras.layers.Layer` (Keras does not export the base of its image
augmentation layers), which is why a call inside tf.data needs the TensorFlow
backend; the training stream does not go through `call`.
"""

import math
import numbers

import keras
import numpy

from keras_cait.errors import ArgumentError, Named, checked_bool, checked_count

ATTEMPTS = 10  # boxes tried before falling back to a central crop (torchvision, timm)
# Resamplings that every path resizes with: one image (`keras.ops.image.resize`, tf.image.resize in
# the training stream) and a batch (`keras.ops.image.scale_and_translate`: no "nearest" or "area").
INTERPOLATIONS = ("bicubic", "bilinear", "lanczos3", "lanczos5")


def checked_range(argument, value, bounds, fits, example):
    """`value` as a tuple of two floats where it is a pair (min, max) of numbers (numpy's too) for which
    `fits(low, high)` holds; else an `ArgumentError` naming `argument`, with `example` (a `Named`)."""
    pair = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        not isinstance(bound, bool) and isinstance(bound, numbers.Real) for bound in value)
    if not (pair and fits(*value)):
        raise ArgumentError(argument, value, f"must be a pair (min, max) of numbers with {bounds}",
                            ["e.g. ", example], usage=True)
    return tuple(float(bound) for bound in value)


def checked_scale(scale):
    """The crop's area range as a fraction of the image's, (min, max) with 0 < min <= max <= 1."""
    return checked_range("scale", scale, "0 < min <= max <= 1", lambda low, high: 0 < low <= high <= 1,
                         Named("scale", (0.08, 1.0)))


def checked_ratio(ratio):
    """The crop's aspect ratio range, (min, max) with 0 < min <= max, both finite."""
    return checked_range("ratio", ratio, "0 < min <= max", lambda low, high: 0 < low <= high and math.isfinite(high),
                         Named("ratio", shown="(3/4, 4/3)"))


def crop_boxes(uniforms, image_height, image_width, scale, ratio, ops=keras.ops):
    """Turns uniform draws into crop boxes (torchvision's `RandomResizedCrop.get_params`).

    Args:
        uniforms: `(batch, 10, 4)` values in [0, 1): per attempt the area,
            the log aspect ratio, the row and the column of the box.
        image_height, image_width: size of the images.
        scale, ratio: ranges of the box area (fraction of the image) and aspect.
        ops: `keras.ops`, or a namespace of the same functions on TensorFlow.

    Returns:
        `(batch, 4)` float boxes `[top, left, height, width]` in pixels.
    """
    image_height = ops.cast(image_height, "float32")
    image_width = ops.cast(image_width, "float32")
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])

    area = image_height * image_width * (scale[0] + uniforms[..., 0] * (scale[1] - scale[0]))
    aspect = ops.exp(log_low + uniforms[..., 1] * (log_high - log_low))
    width = ops.round(ops.sqrt(area * aspect))
    height = ops.round(ops.sqrt(area / aspect))
    fits = (width > 0) & (height > 0) & (width <= image_width) & (height <= image_height)
    # Like randint(0, H - h): every position with the box inside the image.
    top = ops.floor(uniforms[..., 2] * (image_height - height + 1))
    left = ops.floor(uniforms[..., 3] * (image_width - width + 1))
    attempts = ops.stack([top, left, height, width], axis=-1)
    # The first box that fits, picked by a one-hot product (exact: each box times 1, the others
    # times 0), not take_along_axis: TensorFlow's gathers there transpose int32 indices, and
    # wherever oneDNN is on it logs "oneDNN supports DT_INT32 only on platforms with AVX-512".
    first_fit = ops.one_hot(ops.argmax(ops.cast(fits, "float32"), axis=1), ATTEMPTS, dtype="float32")
    chosen = ops.sum(attempts * first_fit[..., None], axis=1)

    fallback = central_box(image_height, image_width, ratio, ops)
    any_fit = ops.any(fits, axis=1)[:, None]
    return ops.where(any_fit, chosen, fallback[None, :])


def central_box(image_height, image_width, ratio, ops=keras.ops):
    """The largest central box `[top, left, height, width]` with its aspect ratio clamped into `ratio`."""
    image_height = ops.cast(image_height, "float32")
    image_width = ops.cast(image_width, "float32")
    aspect = ops.clip(image_width / image_height, ratio[0], ratio[1])
    width = ops.minimum(image_width, ops.round(image_height * aspect))
    height = ops.minimum(image_height, ops.round(width / aspect))
    top = ops.floor((image_height - height) / 2)
    left = ops.floor((image_width - width) / 2)
    return ops.stack([top, left, height, width])


def crop_one(images, box, height, width, interpolation="bicubic", antialias=True, ops=keras.ops):
    """`(1, H, W, C)` images of any size: slice the box, then resize it to height × width
    (uint8 images in float32)."""
    top, left, box_height, box_width = (ops.cast(box[i], "int32") for i in range(4))
    crop = images[:, top:top + box_height, left:left + box_width, :]
    if "int" in str(crop.dtype):  # decoded pixels: the box alone is cast, not the whole photo
        crop = ops.cast(crop, "float32")
    return ops.image.resize(crop, (height, width), interpolation=interpolation, antialias=antialias)


def crop_batch(images, boxes, height, width, interpolation="bicubic", antialias=True):
    """`(B, H, W, C)` images with static shapes: resample each box directly (keras.ops)."""
    ops = keras.ops

    def crop_and_scale(image, box):
        scale = ops.stack([height / box[2], width / box[3]])
        return ops.image.scale_and_translate(
            image,
            (height, width, image.shape[-1]),
            scale,
            -box[:2] * scale,
            spatial_dims=(0, 1),
            method="cubic" if interpolation == "bicubic" else interpolation,
            antialias=antialias,
        )

    return ops.vectorized_map(lambda args: crop_and_scale(*args), (images, boxes))


@keras.saving.register_keras_serializable(package="keras_cait")
class RandomResizedCrop(keras.layers.Layer):
    """Crops a random box of random area and aspect ratio, and resizes it.

    For an image of H×W pixels, up to 10 boxes are drawn with

        area  = U(scale) · H·W,     log(aspect) = U(log ratio)
        w = round(√(area · aspect)),   h = round(√(area / aspect))

    and the first that fits is placed uniformly at random; if none fits, the
    central crop with the aspect ratio clamped into `ratio` is used. The box is
    then resized to `height × width` (bicubic with antialiasing by default).
    This is torchvision's / timm's `RandomResizedCrop` as DeiT trains with it
    (scale (0.08, 1), ratio (3/4, 4/3), `--train-interpolation bicubic`). Keras
    core's `RandomCrop` and `RandomZoom` keep a fixed crop size or aspect, so
    they cannot express it.

    At inference (`training=False`) it takes the largest central box with the
    output's aspect ratio and resizes it.

    Args:
        height, width: output size.
        scale: range of the box area as a fraction of the image area.
        ratio: range of the box aspect ratio (width / height).
        interpolation: "bicubic", "bilinear", ... as `keras.ops.image.resize`.
        antialias: low-pass filter when downsampling, as PIL does.
        seed: optional integer seed.
        data_format: "channels_last", the only layout it crops; None (the default) reads
            `keras.config.image_data_format()`, and "channels_first" (given, or the global
            setting) is refused.
        **kwargs: standard layer arguments.

    Shapes:
        input `(H, W, C)` or `(batch, H, W, C)`, channels last; output
        `(height, width, C)` or `(batch, height, width, C)`, float. Integer
        images (uint8 0..255) come back rounded and clipped to their type's
        range, as PIL resamples them for timm and as `training_stream` does;
        float images are resampled as they are (bicubic overshoots at edges).

    Example:
        >>> crop = RandomResizedCrop(224, 224)
        >>> dataset = dataset.map(lambda image, label: (crop(image), label))
    """

    def __init__(
        self,
        height,
        width,
        scale=(0.08, 1.0),
        ratio=(3 / 4, 4 / 3),
        interpolation="bicubic",
        antialias=True,
        seed=None,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.data_format = data_format or keras.config.image_data_format()
        if self.data_format != "channels_last":
            source = "" if data_format else f" (keras.config.image_data_format() is {self.data_format!r})"
            raise ArgumentError("data_format", data_format, f"RandomResizedCrop crops channels-last images (H, W, C)"
                                f"{source}", ["give ", Named("data_format", "channels_last")], usage=True)
        # Checked by the names given: int() truncated height=24.5 and took '24'; scale=0.5 failed on a
        # subscript, a third bound was ignored; an unknown interpolation failed only when called.
        self.height = checked_count("height", height, 224, note=", the output's height in pixels")
        self.width = checked_count("width", width, 224, note=", the output's width in pixels")
        self.scale = checked_scale(scale)
        self.ratio = checked_ratio(ratio)
        if not (isinstance(interpolation, str) and interpolation in INTERPOLATIONS):
            raise ArgumentError("interpolation", interpolation, "not a resampling that crops both one image and a batch",
                                ["give one of ", ", ".join(map(repr, INTERPOLATIONS)), ", e.g. ",
                                 Named("interpolation", "bicubic")], usage=True)
        self.interpolation = interpolation
        self.antialias = checked_bool("antialias", antialias, "True (low-pass filter when downsampling) or False")
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=True):
        given = keras.backend.standardize_dtype(getattr(images, "dtype", None) or numpy.asarray(images).dtype)
        images = keras.ops.convert_to_tensor(images, self.compute_dtype)
        unbatched = len(images.shape) == 3
        if unbatched:
            images = images[None]
        transformation = None
        if training:
            batch, image_height, image_width = keras.ops.shape(images)[:3]
            uniforms = keras.random.uniform((batch, ATTEMPTS, 4), seed=self.generator)
            transformation = {"boxes": self.crop_boxes(uniforms, image_height, image_width)}
        images = self.transform_images(images, transformation, training=training)
        if "int" in given:  # bicubic's overshoot past 0 and 255 would not fit the pixels it came from
            limits = numpy.iinfo(given)
            images = keras.ops.clip(keras.ops.round(images), limits.min, limits.max)
        return images[0] if unbatched else images

    def crop_boxes(self, uniforms, image_height, image_width):
        """`crop_boxes` with this layer's scale and ratio."""
        return crop_boxes(uniforms, image_height, image_width, self.scale, self.ratio)

    def transform_images(self, images, transformation, training=True):
        """Crops `(B, H, W, C)` images at `transformation["boxes"]` (training) or centrally."""
        images = keras.ops.cast(images, self.compute_dtype)
        if training:
            boxes = transformation["boxes"]
        else:
            shape = keras.ops.shape(images)
            boxes = central_box(shape[1], shape[2], (self.width / self.height,) * 2)[None, :]
        if images.shape[0] == 1:
            return crop_one(images, boxes[0], self.height, self.width, self.interpolation, self.antialias)
        return crop_batch(images, boxes, self.height, self.width, self.interpolation, self.antialias)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-3], self.height, self.width, input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "height": self.height,
            "width": self.width,
            "scale": self.scale,
            "ratio": self.ratio,
            "interpolation": self.interpolation,
            "antialias": self.antialias,
            "seed": self.seed,
            "data_format": self.data_format,
        }
