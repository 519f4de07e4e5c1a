"""The images a CaiT takes: its input shape in either data format, the image size, and the check
that names a batch of the wrong shape with its fix (static shapes only: no op in a graph)."""

import collections.abc
import numbers

import keras
from keras import ops

from keras_cait.errors import ArgumentError, Named


def channels_last_shape(input_shape):
    """`(height, width, channels)` of an input shape given in `keras.config.image_data_format()`.

    Under "channels_first" the constructors take `(channels, height, width)`, as
    keras.applications do, and the model transposes its input to channels last
    once, first thing (the patch convolution then runs channels last on every
    backend, TensorFlow's CPU kernels included, and the weights are the same).
    """
    input_shape = tuple(input_shape)
    if keras.config.image_data_format() != "channels_first" or len(input_shape) != 3:
        return input_shape
    channels, height, width = input_shape
    if width in (1, 3, 4) and channels not in (1, 3, 4):
        raise ValueError(
            f"input_shape {input_shape}: keras.config.image_data_format() is 'channels_first', so "
            f"input shapes are (channels, height, width), e.g. ({width}, {channels}, {height}); or "
            "keras.config.set_image_data_format('channels_last') for (height, width, channels)."
        )
    return (height, width, channels)


def image_shape(height, width, channels=3):
    """An input shape of `height`×`width` images in `keras.config.image_data_format()`."""
    if keras.config.image_data_format() == "channels_first":
        return (channels, height, width)
    return (height, width, channels)


# The layer a CaiT built under "channels_first" begins with, which makes its images channels last.
CHANNELS_LAST_LAYER = "channels_last"


def is_channels_first(model):
    """Whether `model` takes its images channels first (built under "channels_first")."""
    return any(layer.name == CHANNELS_LAST_LAYER and isinstance(layer, keras.layers.Permute) for layer in model.layers)


def image_sides(model):
    """(height, width) of the images `model` takes, channels first or last as it was built."""
    shape = tuple(model.inputs[0].shape)
    return shape[2:4] if is_channels_first(model) else shape[1:3]


def with_sides(model, height, width):
    """`model`'s input shape (batch included) with images of `height`×`width`, in its own layout."""
    batch, *sides = tuple(model.inputs[0].shape)
    channels = sides[0] if is_channels_first(model) else sides[2]
    return [batch, channels, height, width] if is_channels_first(model) else [batch, height, width, channels]


def checked_input_shape(input_shape, argument="input_shape"):
    """`input_shape` as a tuple whose sides are ints or None (numpy integers too), after checking
    that it is a sequence of them (a tuple, a list, a `TensorShape`); None stays None. A number, a
    str or a side that is no integer is an `ArgumentError` naming `argument`; the length and the
    sides' values are `check_input_shape`'s."""
    if input_shape is None:
        return None
    example = ["e.g. ", Named(argument, image_shape(224, 224))]
    if isinstance(input_shape, (str, bytes, collections.abc.Mapping)) or not isinstance(
            input_shape, collections.abc.Iterable):
        raise ArgumentError(argument, input_shape, f"must be (height, width, channels), a tuple of ints, not "
                            f"{type(input_shape).__name__}", example, usage=True)
    sides = tuple(input_shape)
    wrong = [side for side in sides if side is not None and (
        isinstance(side, bool) or not isinstance(side, numbers.Integral))]
    if wrong:
        raise ArgumentError(argument, input_shape, f"must be (height, width, channels), a tuple of ints, not of "
                            f"{type(wrong[0]).__name__}", example, usage=True)
    return tuple(None if side is None else int(side) for side in sides)


def check_input_shape(input_shape, patch_size, argument="input_shape"):
    """Raises an `ArgumentError` (a ValueError) naming `argument` unless `input_shape` is (H, W, C)
    with H, W positive multiples of the patch and C positive."""
    input_shape = tuple(input_shape)
    if len(input_shape) != 3:
        raise ArgumentError(argument, input_shape, "must be (height, width, channels)", "e.g. (224, 224, 3)",
                            usage=True)
    height, width, channels = input_shape
    if channels is None or channels < 1:
        raise ArgumentError(argument, input_shape, "the number of channels must be a positive integer",
                            f"e.g. ({height}, {width}, 3) for RGB", usage=True)
    if height is None or width is None:
        raise ArgumentError(argument, input_shape, "height and width must be known, because the position "
                            "embedding is sized to the patch grid", "e.g. (224, 224, 3)", usage=True)
    if height % patch_size or width % patch_size or height <= 0 or width <= 0:
        suggestion = (
            max(patch_size, round(height / patch_size) * patch_size),
            max(patch_size, round(width / patch_size) * patch_size),
            channels,
        )
        raise ArgumentError(argument, input_shape, f"sides must be positive multiples of the patch size "
                            f"{patch_size}", f"e.g. {suggestion}", usage=True)


def checked_image_size(image_size, patch_size=16, argument="image_size"):
    """`image_size` (the side of square images) as an int, after checking that it is a positive
    integer multiple of `patch_size`; else an `ArgumentError` naming `argument` and a size that is."""
    if isinstance(image_size, bool) or not isinstance(image_size, numbers.Integral) or image_size <= 0:
        kind = "" if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool) else \
            f", an int, not {type(image_size).__name__}"
        raise ArgumentError(argument, image_size, f"must be a positive integer multiple of the patch size {patch_size}"
                            f"{kind}", ["e.g. ", Named(argument, 224 if 224 % patch_size == 0 else patch_size * 14)],
                            usage=True)
    if image_size % patch_size:
        nearest = max(1, int(image_size / patch_size + 0.5)) * patch_size  # halves up: 200 -> 208
        raise ArgumentError(argument, image_size, f"must be a multiple of the patch size {patch_size}",
                            ["e.g. ", Named(argument, nearest)], usage=True)
    return int(image_size)


def check_images(images, input_shape, model_name):
    """Raises a ValueError unless `images` fit `input_shape` `(batch, H, W, C)`; TypeError for text.

    Reads the static shape only (numpy arrays, tensors, traced or symbolic
    tensors), so it adds nothing to a compiled graph. Returns whether the
    static shape settles it: False when the rank, height, width or channels are
    unknown until run time (`CaiTModel.__call__` then checks in the graph).
    """
    dtype = str(getattr(images, "dtype", ""))
    if dtype == "object" or "str" in dtype or dtype.startswith(("<U", "|S", "<S")):
        raise TypeError(
            f"images of dtype {dtype}: {model_name} takes pixels as numbers (uint8 or float, "
            "0..255), not file names or encoded bytes; read files with "
            "keras_cait.preprocessing.load_image(path, image_size) first."
        )
    shape = getattr(images, "shape", None)
    try:
        shape = None if shape is None else tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):  # unknown rank: nothing known to check
        return False
    if shape is None:
        return True
    expected = tuple(input_shape)[1:]
    height, width, channels = expected
    takes = f"{model_name} takes images of shape (batch, {height}, {width}, {channels})"
    if len(shape) != 4:
        fix = (
            "for one image add the batch axis: images[None]" if len(shape) == 3
            else f"reshape them to one batch axis: images.reshape((-1, {height}, {width}, {channels}))"
        )
        raise ValueError(f"images of shape {shape}: {takes}; {fix}.")
    if shape[0] == 0:
        raise ValueError(
            f"images of shape {shape}: a batch of 0 images; {takes}, at least one of them. "
            "Skip empty batches before calling the model."
        )
    if shape[3] not in (None, channels):
        fix = {
            1: "convert grayscale to RGB, e.g. np.repeat(images, 3, axis=-1)",
            4: "drop the alpha channel: images[..., :3]",
        }.get(shape[3] if channels == 3 else None, (
            f"give {channels}-channel images, or build the model with input_shape=({height}, "
            f"{width}, {shape[3]}) and include_preprocessing=False"
        ))
        raise ValueError(f"images of shape {shape}: {takes}, {channels} channels; {fix}.")
    if shape[1] not in (None, height) or shape[2] not in (None, width):
        raise ValueError(
            f"images of shape {shape}: {takes}; resize and centre-crop them to {height}×{width} "
            f"(e.g. keras.layers.Resizing({height}, {width}, crop_to_aspect_ratio=True)), or "
            f"build the model with input_shape=({shape[1]}, {shape[2]}, {channels})."
        )
    return None not in shape[1:]


def is_open_graph_tensor(images):
    """Whether `images` is a TensorFlow graph tensor (the one place a shape is left open)."""
    return (
        keras.backend.backend() == "tensorflow"
        and not isinstance(images, keras.KerasTensor)
        and ops.is_tensor(images)
        and not hasattr(images, "numpy")  # eager tensors have a known shape
    )
