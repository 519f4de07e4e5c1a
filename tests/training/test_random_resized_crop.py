"""RandomResizedCrop: torchvision/timm's box sampling, and crops that land exactly on the box."""

import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_cait.errors import ArgumentError
from keras_cait.training import RandomResizedCrop
from keras_cait.training.random_resized_crop import ATTEMPTS

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def reference_box(uniforms, height, width):
    """torchvision's RandomResizedCrop.get_params, written out, fed with given uniforms."""
    area = height * width
    for u_area, u_ratio, u_top, u_left in uniforms:
        target = area * (SCALE[0] + u_area * (SCALE[1] - SCALE[0]))
        log_low, log_high = math.log(RATIO[0]), math.log(RATIO[1])
        aspect = math.exp(log_low + u_ratio * (log_high - log_low))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return [math.floor(u_top * (height - h + 1)), math.floor(u_left * (width - w + 1)), h, w]
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        h, w = height, round(height * RATIO[1])
    else:
        w, h = width, height
    return [(height - h) // 2, (width - w) // 2, h, w]


@pytest.mark.parametrize("height, width", [(100, 60), (224, 224), (20, 200), (300, 12)])
def test_boxes_follow_torchvision(height, width):
    layer = RandomResizedCrop(32, 32)
    uniforms = np.random.default_rng(0).uniform(size=(500, ATTEMPTS, 4)).astype("float32")
    boxes = keras.ops.convert_to_numpy(layer.crop_boxes(uniforms, height, width))
    expected = np.array([reference_box(u, height, width) for u in uniforms])
    # float32 vs float64 may round a .5 differently: a pixel, rarely.
    assert np.mean(np.all(boxes == expected, axis=1)) > 0.98
    assert np.abs(boxes - expected).max() <= 1
    top, left, h, w = boxes.T
    assert np.all((top >= 0) & (left >= 0) & (top + h <= height) & (left + w <= width))


def test_extreme_aspect_falls_back_to_the_central_crop():
    layer = RandomResizedCrop(32, 32)
    # Areas near the whole image cannot fit a 20×200 image at aspect <= 4/3.
    uniforms = np.full((1, ATTEMPTS, 4), 0.99, "float32")
    box = keras.ops.convert_to_numpy(layer.crop_boxes(uniforms, 20, 200))[0]
    assert box.tolist() == [0, 86, 20, 27]


def coordinate_image(height, width):
    """Channel 0 holds the row, channel 1 the column of each pixel centre."""
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    return np.stack([rows, columns, np.zeros_like(rows)], axis=-1).astype("float32")


@pytest.mark.parametrize("batched", [False, True], ids=["one image", "batch"])
def test_the_output_samples_exactly_the_box(batched):
    size = 16
    layer = RandomResizedCrop(size, size)
    image = coordinate_image(120, 90)
    box = np.array([[30.0, 10.0, 64.0, 48.0]], "float32")  # top, left, height, width
    images = np.stack([image, image]) if batched else image[None]
    boxes = np.concatenate([box, box]) if batched else box
    out = keras.ops.convert_to_numpy(layer.transform_images(images, {"boxes": boxes}))[0]
    # Output pixel i samples the box at top + (i + 1/2) · h / size - 1/2; bicubic
    # (and its antialiasing filter) reproduces a linear ramp away from the edges.
    centres = np.arange(size) + 0.5
    want_rows = 30 + centres * 64 / size - 0.5
    want_columns = 10 + centres * 48 / size - 0.5
    rows, columns = np.meshgrid(want_rows, want_columns, indexing="ij")
    inner = slice(2, size - 2)
    np.testing.assert_allclose(out[inner, inner, 0], rows[inner, inner], atol=0.05)
    np.testing.assert_allclose(out[inner, inner, 1], columns[inner, inner], atol=0.05)


@pytest.mark.parametrize("training", [True, False])
def test_integer_images_come_back_rounded_and_clipped_to_their_range_as_pil_gives_them(training):
    """Bicubic overshoots at sharp edges (-61..322 for a 0/255 pattern): timm's crop of a PIL image
    and `training_stream` clip and round, the layer alone handed them on."""
    seed = int(np.random.default_rng().integers(1 << 30))
    pixels = (np.random.default_rng(seed).integers(0, 2, (2, 40, 36, 3)) * 255).astype("uint8")
    as_integers = keras.ops.convert_to_numpy(RandomResizedCrop(24, 24, seed=seed)(pixels, training=training))
    as_floats = keras.ops.convert_to_numpy(RandomResizedCrop(24, 24, seed=seed)(pixels.astype("float32"),
                                                                               training=training))
    assert as_floats.min() < 0 and as_floats.max() > 255  # the overshoot the float image keeps
    np.testing.assert_array_equal(as_integers, np.clip(np.round(as_floats), 0, 255))


def test_inference_takes_the_central_square():
    layer = RandomResizedCrop(20, 20)
    out = keras.ops.convert_to_numpy(layer(coordinate_image(100, 60), training=False))
    # The central 60×60 of a 100×60 image: rows 20..80, all columns.
    assert out[..., 0].min() > 19 and out[..., 0].max() < 81
    assert out[..., 1].min() < 2 and out[..., 1].max() > 57


def test_training_crops_vary_and_keep_the_output_size_in_tf_data():
    layer = RandomResizedCrop(24, 24, seed=3)
    image = coordinate_image(100, 60)
    dataset = tf.data.Dataset.from_tensors(image).repeat(6).map(layer)
    crops = np.stack([crop.numpy() for crop in dataset])
    assert crops.shape == (6, 24, 24, 3)
    assert len({round(float(c[..., 0].mean()), 2) for c in crops}) > 1


def test_config_round_trip_and_argument_errors():
    layer = RandomResizedCrop(224, 192, scale=(0.35, 1.0), interpolation="bilinear")
    clone = RandomResizedCrop.from_config(layer.get_config())
    assert (clone.height, clone.width, clone.scale) == (224, 192, (0.35, 1.0))
    assert clone.interpolation == "bilinear"
    with pytest.raises(ValueError, match=r"scale=\(0.5, 0.1\)"):
        RandomResizedCrop(224, 224, scale=(0.5, 0.1))



def test_channels_first_is_refused_naming_data_format_and_where_it_came_from(monkeypatch):
    # Before: a plain ValueError showing the global format as if the caller had given it.
    with pytest.raises(ArgumentError, match=r"^data_format='channels_first': RandomResizedCrop crops channels-last "
                                            r"images \(H, W, C\); give data_format='channels_last'$") as refused:
        RandomResizedCrop(224, 224, data_format="channels_first")
    assert refused.value.argument == "data_format"
    monkeypatch.setattr(keras.config, "image_data_format", lambda: "channels_first")
    with pytest.raises(ArgumentError, match=r"^data_format=None: RandomResizedCrop crops channels-last images "
                                            r"\(H, W, C\) \(keras.config.image_data_format\(\) is 'channels_first'\)"):
        RandomResizedCrop(224, 224)
    assert RandomResizedCrop(224, 224, data_format="channels_last").data_format == "channels_last"


def test_the_box_pick_in_a_tf_data_stream_gives_onednn_nothing_to_complain_of():
    """The first fitting box is picked without integer ops that TensorFlow's oneDNN pass checks
    (a take_along_axis there transposed int32 indices and logged "oneDNN supports DT_INT32 only
    on platforms with AVX-512" in every run where oneDNN is on); oneDNN is turned on here, so
    the test holds on every x86 CPU kind."""
    code = (
        "import tensorflow as tf\n"
        "from keras_cait.training.random_resized_crop import ATTEMPTS, crop_boxes\n"
        "from keras_cait.training.stream import TF_OPS\n"
        "def boxes(index):\n"
        "    uniforms = tf.random.stateless_uniform((2, ATTEMPTS, 4), seed=tf.stack([index, 0]))\n"
        "    return crop_boxes(uniforms, 60, 100, (0.08, 1.0), (3 / 4, 4 / 3), ops=TF_OPS)\n"
        "print(sum(float(tf.reduce_sum(b)) for b in tf.data.Dataset.range(3).map(boxes)) > 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert done.returncode == 0 and done.stdout.split()[-1] == "True", done.stderr[-3000:]
    assert "oneDNN supports" not in done.stderr, done.stderr[-3000:]


def _refused(call, argument, line):
    with pytest.raises(ArgumentError, match=line) as caught:
        call()
    assert caught.value.argument == argument
    assert caught.value.usage


@pytest.mark.parametrize("name, value, line", [
    # int() truncated 24.5 and took '24'; 0 failed only when called, inside Keras
    ("height", 24.5, r"^height=24\.5: must be a positive integer, the output's height in pixels, not float; "
                     r"e\.g\. height=224$"),
    ("width", "24", r"^width='24': must be a positive integer, the output's width in pixels, not str; "
                    r"e\.g\. width=224$"),
    ("height", 0, r"^height=0: must be a positive integer, the output's height in pixels; e\.g\. height=224$"),
    # a TypeError ('float' object is not subscriptable), an IndexError, a third bound ignored
    ("scale", 0.5, r"^scale=0\.5: must be a pair \(min, max\) of numbers with 0 < min <= max <= 1; "
                   r"e\.g\. scale=\(0\.08, 1\.0\)$"),
    ("scale", (0.5,), r"^scale=\(0\.5,\): must be a pair"),
    ("scale", (0.1, 0.5, 1.0), r"^scale=\(0\.1, 0\.5, 1\.0\): must be a pair"),
    ("scale", ("0.1", "1"), r"^scale=\('0\.1', '1'\): must be a pair"),
    ("ratio", 1.0, r"^ratio=1\.0: must be a pair \(min, max\) of numbers with 0 < min <= max; "
                   r"e\.g\. ratio=\(3/4, 4/3\)$"),
    ("ratio", (0.75, float("inf")), r"^ratio=\(0\.75, inf\): must be a pair"),
    # failed only when called, as Keras' resize or scale_and_translate refused it
    ("interpolation", "cubic", r"^interpolation='cubic': not a resampling that crops both one image and a batch; "
                               r"give one of 'bicubic', 'bilinear', 'lanczos3', 'lanczos5', "
                               r"e\.g\. interpolation='bicubic'$"),
    ("interpolation", "nearest", r"^interpolation='nearest': not a resampling"),  # a batch of 2 failed
    # bool('no') is True
    ("antialias", "no", r"^antialias='no': must be True \(low-pass filter when downsampling\) or False, not str$"),
])
def test_a_bad_argument_is_refused_by_its_name_when_the_layer_is_made(name, value, line):
    _refused(lambda: RandomResizedCrop(**{"height": 24, "width": 24, name: value}), name, line)


def test_numpy_sizes_and_bounds_and_every_allowed_interpolation_still_work():
    layer = RandomResizedCrop(np.int64(24), np.int32(20), scale=[np.float32(0.25), 1], ratio=(np.float64(0.5), 2))
    assert (layer.height, layer.width, layer.scale, layer.ratio) == (24, 20, (0.25, 1.0), (0.5, 2.0))
    assert type(layer.height) is int
    images = np.zeros((2, 40, 50, 3), "float32")
    for interpolation in ("bicubic", "bilinear", "lanczos3", "lanczos5"):
        layer = RandomResizedCrop(16, 16, interpolation=interpolation, antialias=np.bool_(False))
        assert layer(images).shape == (2, 16, 16, 3) and layer(images[:1]).shape == (1, 16, 16, 3)
