"""keras_cait.images.evaluation_transform against timm's evaluation transform for CaiT's checkpoints."""

import io
import re
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_cait.errors import ArgumentError
from keras_cait.images.evaluation_transform import (
    IMAGE_FORMATS,
    MAX_PIXELS,
    crop_geometry,
    decode_image,
    decoded_size,
    evaluation_transform,
    header_size,
)
from keras_cait.preprocessing import load_image
from tests.export.helpers import gif_of_frames, png_header

# (size, crop_pct): CaiT's 224 and 1.0, DeiT's 0.875, a small side, and non-square targets
# in both orientations (timm keeps the aspect ratio and crops the centre).
TARGETS = [(224, 1.0), (224, 0.875), (64, 1.0), ((96, 160), 1.0), ((160, 96), 1.0)]


def variants(image):
    """Real photographs of several sizes and aspect ratios, from one 427×640 photo."""
    return {
        "landscape 427x640": image,
        "portrait 400x180": image[10:410, 200:380],
        "wide 90x500": image[200:290, 50:550],
        "small 45x61 (upsampled)": np.asarray(Image.fromarray(image).resize((61, 45), Image.BICUBIC)),
        "square 256x256": np.asarray(Image.fromarray(image[:, 100:527]).resize((256, 256), Image.BICUBIC)),
    }


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory):
    """{name: path} of JPEG and PNG files made from scikit-learn's two sample photographs."""
    from sklearn.datasets import load_sample_images

    folder = tmp_path_factory.mktemp("photos")
    files = {}
    for photo_name, photo in zip(("china", "flower"), load_sample_images().images):
        for name, pixels in variants(photo).items():
            for image_format in ("JPEG", "PNG"):
                path = folder / f"{photo_name} {name}.{image_format.lower()}"
                Image.fromarray(pixels).save(path, image_format, quality=90)
                files[path.name] = path
    return files


def timm_evaluation(path, size, crop_pct):
    """timm's eval transform with CaiT's pretrained config, at `size` and `crop_pct`, as uint8 HWC."""
    import timm
    from timm.data import create_transform, resolve_data_config

    height, width = (size, size) if isinstance(size, int) else size
    config = resolve_data_config(
        {"input_size": (3, height, width), "crop_pct": crop_pct},
        pretrained_cfg=timm.models.get_pretrained_cfg("cait_xxs24_224").to_dict(),
    )
    assert config["interpolation"] == "bicubic" and config["crop_mode"] == "center"
    transform = create_transform(**config, normalize=False)
    return transform(Image.open(path).convert("RGB")).numpy().transpose(1, 2, 0).astype("float32")


@pytest.mark.parametrize("size, crop_pct", TARGETS, ids=str)
def test_pixels_are_timms_up_to_bicubic_rounding(photo_files, size, crop_pct):
    for name, path in photo_files.items():
        expected = timm_evaluation(path, size, crop_pct)
        got = load_image(path, size, crop_pct)
        assert got.shape == expected.shape, name
        difference = np.abs(got - expected)
        # TF's antialiased bicubic is PIL's kernel computed in float32 and rounded once; PIL
        # rounds to uint8 between its two passes. Measured on these photos: mean 0.17-0.23
        # levels, 99th percentile 1 (max 13, next to saturated edges when upsampling). A crop
        # one pixel off gives a mean of ~10, a bilinear or non-antialiased resize 1-2.5.
        assert difference.mean() <= 0.3, (name, difference.mean())
        assert np.percentile(difference, 99) <= 1, (name, np.percentile(difference, 99))


def test_jpeg_is_decoded_as_pil_decodes_it(photo_files):
    for name, path in photo_files.items():
        if name.endswith(".jpeg"):
            expected = np.asarray(Image.open(path).convert("RGB"))
            np.testing.assert_array_equal(decode_image(path.read_bytes()).numpy(), expected, err_msg=name)


def test_a_window_is_the_same_pixels_as_the_whole_image_sliced(photo_files):
    """The training crop decodes only its box (a JPEG through decode_and_crop_jpeg): it must be
    the box of PIL's pixels, bit for bit, at the edges too (chroma upsampling reads neighbours)."""
    for name, path in photo_files.items():
        encoded = path.read_bytes()
        whole = decode_image(encoded).numpy()
        height, width = whole.shape[:2]
        for top, left, box_height, box_width in [(0, 0, height, width), (height // 3, width // 5, height // 2,
                                                 width // 3), (height - 7, width - 9, 7, 9), (1, 3, 1, 2)]:
            window = decode_image(encoded, window=[top, left, box_height, box_width]).numpy()
            np.testing.assert_array_equal(window, whole[top:top + box_height, left:left + box_width],
                                          err_msg=f"{name} at {(top, left, box_height, box_width)}")


def test_geometry_is_torchvisions_resize_and_timms_resize_keep_ratio():
    from timm.data.transforms import ResizeKeepRatio
    from torchvision import transforms

    sizes = [(h, w) for h in range(1, 60, 3) for w in range(1, 60, 4)] + [(135, 270), (270, 135), (375, 500)]
    for side in (32, 224):
        resize = transforms.Resize(side)
        for height, width in sizes:
            # torchvision computes the longer side as int(side * long / short): 135x270 -> 448.
            expected_width, expected_height = resize(Image.new("L", (width, height))).size
            got = [int(x) for x in crop_geometry(height, width, side)]
            assert got[:2] == [expected_height, expected_width], (height, width, side)
            assert got[2:] == [round((expected_height - side) / 2), round((expected_width - side) / 2)]
    for target in ((96, 160), (160, 96)):
        for height, width in sizes:
            expected = ResizeKeepRatio.get_params(Image.new("L", (width, height)), target, longest=0.0)
            got = [int(x) for x in crop_geometry(height, width, target)]
            assert got[:2] == list(expected), (height, width, target)


def test_only_the_crop_is_resized_so_a_thin_image_stays_small():
    # Resizing then cropping would make a 224 x 33,600 image; the window is the same pixels.
    image = np.random.default_rng(0).integers(0, 256, (4, 600, 3)).astype("float32")
    height, width, top, left = (int(x) for x in crop_geometry(4, 600, 224))
    whole = tf.image.resize(image, (height, width), "bicubic", antialias=True)[top : top + 224, left : left + 224]
    got = evaluation_transform(image, 224).numpy()
    np.testing.assert_array_less(np.abs(got - np.clip(np.round(whole), 0, 255)), 1.01)

    # The 99-byte 1 x 5000 PNG that a whole-image resize turns into 224 x 1,120,000 x 3 floats.
    encoded = io.BytesIO()
    Image.new("RGB", (1, 5000), (200, 30, 90)).save(encoded, "PNG")
    got = evaluation_transform(decode_image(encoded.getvalue()), 224).numpy()
    assert got.shape == (224, 224, 3)
    np.testing.assert_array_equal(got, np.broadcast_to([200, 30, 90], got.shape))


def test_header_sizes_of_every_format_and_the_pixel_limit():
    pixels = np.zeros((37, 51, 3), np.uint8)
    for image_format in ("JPEG", "PNG", "GIF", "BMP"):
        encoded = io.BytesIO()
        Image.fromarray(pixels).save(encoded, image_format)
        assert [int(x) for x in header_size(encoded.getvalue())] == [37, 51], image_format
    assert [int(x) for x in header_size(png_header(20_000, 9_000))] == [9_000, 20_000]

    side = int(MAX_PIXELS**0.5) + 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{side}x{side} pixels; at most 89,478,485"):
        decode_image(png_header(side, side))


def test_load_image_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        load_image(tmp_path / "missing.jpg")
    (tmp_path / "notes.jpg").write_text("not an image")
    with pytest.raises(ValueError, match=rf"Cannot read image .*notes.jpg.* \({IMAGE_FORMATS} expected\): not an "
                                         r"image file\.$"):
        load_image(tmp_path / "notes.jpg")
    (tmp_path / "bomb.png").write_bytes(png_header(20_000, 9_000))
    with pytest.raises(ValueError, match=r"bomb.png' is 9000x20000 pixels; at most 89,478,485 .* Downscale"):
        load_image(tmp_path / "bomb.png")
    with pytest.raises(ValueError, match=r"crop_pct=1.5: must be in \(0, 1\]"):
        crop_geometry(10, 10, 224, crop_pct=1.5)
    whole = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(whole, "JPEG")
    (tmp_path / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    with pytest.raises(ValueError, match=r"cut.jpg.*invalid JPEG data \(a truncated or damaged file\)") as refused:
        load_image(tmp_path / "cut.jpg")
    # One traceback in a notebook: TensorFlow's own error is kept as `cause`, not chained.
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert refused.value.cause is not None


def test_load_image_given_no_path_or_a_crop_pct_of_another_type_names_the_argument(tmp_path):
    from keras_cait.images.evaluation_transform import evaluation_transform

    Image.new("RGB", (40, 30)).save(tmp_path / "photo.png")
    photo = Image.open(tmp_path / "photo.png")
    in_memory = ("; give the path of a JPEG, PNG, GIF, BMP or WebP file; an image already in memory is resized and "
                 "cropped by keras_cait.images.evaluation_transform.evaluation_transform(np.asarray(image), "
                 "image_size)")
    for given, line in [(photo, "path=<PngImageFile>: load_image reads an image file, not a PngImageFile"),
                        (np.zeros((30, 40, 3)), "path=<ndarray of shape (30, 40, 3)>: load_image reads an image file, "
                                                "not a ndarray"),
                        ((tmp_path / "photo.png").read_bytes(), "path=<bytes>: load_image reads an image file, not a "
                                                                "bytes")]:
        with pytest.raises(ValueError) as caught:  # were a TypeError of os.stat, a FileNotFoundError of its repr
            load_image(given, 32)
        assert str(caught.value) == line + in_memory
    assert evaluation_transform(np.asarray(photo), 32).shape == (32, 32, 3)  # what the line says works
    with pytest.raises(ValueError, match=r"^path='https://example.com/cat.jpg': load_image reads local files, not "
                                         r"URLs; download it first, e.g. keras.utils.get_file\(origin=url\)"):
        load_image("https://example.com/cat.jpg")  # was TensorFlow's UnimplementedError
    for crop_pct in ("0.875", None, True):
        with pytest.raises(ValueError, match=rf"^crop_pct={re.escape(repr(crop_pct))}: must be a number in \(0, 1\], "
                                             rf"not {type(crop_pct).__name__}; e.g. crop_pct=1.0 \(CaiT\)"):
            load_image(tmp_path / "photo.png", 32, crop_pct)  # was TypeError: '<' not supported


@pytest.mark.parametrize("image, shown", [
    (np.zeros((30, 40), "uint8"), "<ndarray of uint8 and shape (30, 40)>"),  # a grey PIL image's np.asarray
    (np.zeros((30, 40, 4), "uint8"), "<ndarray of uint8 and shape (30, 40, 4)>"),  # an RGBA PNG's
    (np.zeros((2, 30, 40, 3), "float32"), "<ndarray of float32 and shape (2, 30, 40, 3)>"),  # a batch
])
def test_evaluation_transform_names_an_image_that_is_no_rgb_pixels(image, shown):
    """Were ScaleAndTranslate's `input must be 4-dimensional[1,30,40]` or set_shape's `Tensor's shape
    (32, 32, 4) is not compatible with supplied shape (32, 32, 3)`."""
    with pytest.raises(ArgumentError, match=rf"^image={re.escape(shown)}: must be RGB pixels, numbers of shape "
                                            r"\(height, width, 3\); convert a grey or RGBA image to RGB first") as caught:
        evaluation_transform(image, 32)
    assert caught.value.argument == "image" and caught.value.usage


def test_evaluation_transform_names_a_path_an_empty_image_and_an_infinite_size():
    for call, argument, line in [
        (lambda: evaluation_transform("cat.jpg", 32), "image",  # was StridedSlice's `slice index 0 ... out of bounds`
         r"^image='cat\.jpg': evaluation_transform takes decoded pixels, not a path; read a file with "),
        (lambda: evaluation_transform(np.zeros((0, 5, 3), "uint8"), 32), "image",  # was `Integer division by zero`
         r"^image=<ndarray of uint8 and shape \(0, 5, 3\)>: has no pixels; give an image of at least 1x1 pixels$"),
        (lambda: crop_geometry(30, 40, float("inf")), "image_size",  # was OverflowError: cannot convert float infinity
         r"^image_size=inf: must be a positive integer or a \(height, width\) pair of them; e\.g\. image_size=224$"),
    ]:
        with pytest.raises(ArgumentError, match=line) as caught:
            call()
        assert caught.value.argument == argument


def test_evaluation_transform_still_takes_lists_tensors_and_graph_images_of_unknown_size():
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3)).astype("uint8")
    expected = evaluation_transform(pixels, 32).numpy()
    np.testing.assert_array_equal(evaluation_transform(pixels.tolist(), 32).numpy(), expected)
    np.testing.assert_array_equal(evaluation_transform(tf.constant(pixels, tf.float32), 32).numpy(), expected)
    graph = tf.function(lambda image: evaluation_transform(image, 32),
                        input_signature=[tf.TensorSpec([None, None, None], tf.uint8)])
    np.testing.assert_array_equal(graph(pixels).numpy(), expected)


def test_load_image_refuses_a_missing_file_and_a_bad_size_before_tensorflow_reads_anything(tmp_path):
    """From a notebook (no TF_CPP_MIN_LOG_LEVEL): a missing file printed TensorFlow's `OP_REQUIRES failed
    ... NOT_FOUND` and `Local rendezvous is aborting` lines above the error, and image_size=0 was
    'Cannot read image ...: output dimensions must be positive'. Standard error stays empty now."""
    import os
    import subprocess
    import sys

    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    (tmp_path / "fake.jpg").write_bytes(b"\xff\xd8\xff\xe0 no JPEG beyond its first bytes")
    script = """
from keras_cait.preprocessing import load_image
try:
    load_image("missing.jpg")
except FileNotFoundError as error:
    print(error)
for size in (0, -3, 2.5, (32,), "224", True):
    try:
        load_image("photo.png", size)
    except ValueError as error:
        print(error)
print(load_image("photo.png", 32.0).shape == load_image("photo.png", (32, 32)).shape)
try:  # refused before anything is allocated (it was 13 GiB and a raw out-of-memory error)
    load_image("photo.png", 20000)
except ValueError as error:
    print(error)
try:  # reading its size printed libjpeg's "Input file read error" and a rendezvous line above the error
    load_image("fake.jpg", 32)
except ValueError as error:
    print(error)
"""
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Image 'missing.jpg' does not exist."
    assert lines[1:-3] == [f"image_size={size!r}: must be a positive integer or a (height, width) pair of them; "
                           "e.g. image_size=224" for size in (0, -3, 2.5, (32,), "224", True)]
    assert lines[-1] == ("Cannot read image 'fake.jpg' (JPEG, PNG, GIF, BMP or WebP expected): invalid JPEG data "
                         "(a truncated or damaged file).")
    assert lines[-3] == "True"
    assert lines[-2] == ("image_size=20000: is 400,000,000 pixels, more than the 89,478,485 an image may have here; "
                         "e.g. image_size=224")


def webp_of(sides, lossless):
    encoded = io.BytesIO()
    Image.new("RGB", sides[::-1], (10, 20, 30)).save(encoded, "WEBP", lossless=lossless)
    return encoded.getvalue()


def test_every_gif_frame_counts_at_its_real_size():
    assert [int(x) for x in decoded_size(gif_of_frames(3))] == [3, 64, 64]
    assert [int(x) for x in decoded_size(gif_of_frames(1, (70, 65)))] == [1, 70, 65]
    # A 64×64 screen holding a 9500×9500 frame (the decoder allocates the frame's size).
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 frames of 9500x9500 pixels; at most"):
        decode_image(gif_of_frames(2, (9500, 9500)))
    # 22,000 frames of 64×64: 90 million pixels from a few hundred KB.
    with pytest.raises(tf.errors.InvalidArgumentError, match="22000 frames of 64x64 pixels; at most"):
        decode_image(gif_of_frames(22_000))


@pytest.mark.parametrize("lossless", [False, True], ids=["lossy", "lossless"])
def test_webp_and_bmp_sizes_are_read_before_decoding(lossless):
    assert [int(x) for x in header_size(webp_of((37, 51), lossless))] == [37, 51]
    assert decode_image(webp_of((37, 51), lossless)).shape == (37, 51, 3)
    webp = bytearray(webp_of((37, 51), lossless))
    if lossless:  # VP8L: 14-bit width - 1 and height - 1 after the signature byte 0x2f
        webp[21:25] = struct.pack("<I", (9499 << 14) | 9499 | (int.from_bytes(webp[21:25], "little") & ~((1 << 28) - 1)))
    else:  # VP8: 14-bit width and height after the key frame's start code
        webp[26:30] = struct.pack("<HH", 9500, 9500)
    with pytest.raises(tf.errors.InvalidArgumentError, match="9500x9500 pixels; at most"):
        decode_image(bytes(webp))

    bmp = io.BytesIO()
    Image.new("RGB", (51, 37)).save(bmp, "BMP")
    bomb = bytearray(bmp.getvalue())
    bomb[18:26] = struct.pack("<ii", 10_000, -10_000)  # top-down: a negative height
    with pytest.raises(tf.errors.InvalidArgumentError, match="10000x10000 pixels; at most"):
        decode_image(bytes(bomb))


def test_load_image_refuses_frame_bombs_and_folders_with_value_error(tmp_path):
    (tmp_path / "bomb.gif").write_bytes(gif_of_frames(2, (12_000, 12_000)))
    with pytest.raises(ValueError, match=r"bomb.gif' is 2 frames of 12000x12000 pixels; at most"):
        load_image(tmp_path / "bomb.gif", 32)
    (tmp_path / "folder.jpg").mkdir()
    with pytest.raises(ValueError, match=r"folder.jpg' is a folder; pass an image file"):
        load_image(tmp_path / "folder.jpg", 32)


def test_a_16_bit_png_keeps_the_high_byte_of_each_value():
    values = (np.arange(32 * 32).reshape(32, 32) * 61 % 65536).astype(np.uint16)
    encoded = io.BytesIO()
    Image.fromarray(values).save(encoded, "PNG")

    decoded = decode_image(encoded.getvalue()).numpy()

    np.testing.assert_array_equal(decoded, np.repeat((values >> 8)[..., None], 3, axis=-1))


# === The one list of formats: what every path reads, and what every path refuses alike ===


def image_file(path, image_format, size=(12, 9)):
    """A small RGB image of `image_format` (PIL's name) at `path`."""
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(
        path, image_format)
    return path


# The formats TensorFlow 2.21 decodes in every path (PIL's name: extensions).
READ = {"JPEG": (".jpg", ".jpeg"), "PNG": (".png",), "GIF": (".gif",), "BMP": (".bmp",), "WEBP": (".webp",)}


def test_every_listed_format_is_read_by_every_path(tmp_path):
    """Folder sources (train, finetune, evaluate), load_image (predict) and serving_bytes read the
    same formats: a .webp used to be skipped by the folder, read by predict, refused by serving."""
    from keras_cait.export.saved_model import _decode_and_crop
    from keras_cait.training import sources, stream

    (tmp_path / "photos" / "cat").mkdir(parents=True)
    files = [image_file(tmp_path / "photos" / "cat" / f"a{extension}", name)
             for name, extensions in READ.items() for extension in extensions]
    source = sources.image_folder(tmp_path / "photos")
    assert source.num_examples == len(files), "the folder skipped some"
    batches = list(stream.evaluation_dataset(source, 8, len(files)))
    assert batches[0][0].shape == (len(files), 8, 8, 3)
    served = _decode_and_crop(tf.constant([path.read_bytes() for path in files]), 8, 8).numpy()
    for path, image in zip(files, served):
        np.testing.assert_array_equal(load_image(path, 8), image)
    from keras_cait.images.evaluation_transform import IMAGE_EXTENSIONS, IMAGE_FILE_FORMATS

    assert {known.name.upper(): known.extensions for known in IMAGE_FILE_FORMATS} == READ
    assert sources.IMAGE_EXTENSIONS == IMAGE_EXTENSIONS and source.skipped == ()
    assert IMAGE_FORMATS == "JPEG, PNG, GIF, BMP or WebP"


def test_a_format_outside_the_list_is_refused_alike_by_every_path(tmp_path):
    from keras_cait.export.saved_model import _decode_and_crop
    from keras_cait.training import sources

    (tmp_path / "photos" / "cat").mkdir(parents=True)
    image_file(tmp_path / "photos" / "cat" / "a.png", "PNG")
    tiff = image_file(tmp_path / "photos" / "cat" / "b.tiff", "TIFF")
    source = sources.image_folder(tmp_path / "photos")
    assert source.num_examples == 1 and source.skipped == (str(tiff),)
    assert sources.skipped_files("data='photos'", source) == (
        f"data='photos': 1 file is not read, for an extension other than {', '.join(sources.IMAGE_EXTENSIONS)} "
        f"({IMAGE_FORMATS}): {tiff}. Convert them to one of those formats to use them, or move them out of "
        "the class folders.")
    with pytest.raises(ValueError) as refused:
        load_image(tiff)
    assert str(refused.value) == f"Cannot read image {str(tiff)!r} ({IMAGE_FORMATS} expected): a TIFF file."
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"must be {IMAGE_FORMATS} files; entries \\[0\\]"):
        _decode_and_crop(tf.constant([tiff.read_bytes()]), 8, 8)


def test_a_text_file_named_jpg_lists_the_formats_once(tmp_path):
    """load_image (keras-cait predict) used to list two sets: its own and TensorFlow's (with JPEG XL)."""
    notes = tmp_path / "notes.jpg"
    notes.write_text("not an image")
    with pytest.raises(ValueError) as refused:
        load_image(notes)
    assert str(refused.value) == f"Cannot read image {str(notes)!r} ({IMAGE_FORMATS} expected): not an image file."


def test_the_file_faults_are_told_from_the_first_bytes():
    from keras_cait.images.evaluation_transform import HEADER_BYTES, IMAGE_FILE_FORMATS, decode_error_reason, header_fault

    assert header_fault(b"") == "an empty file"
    assert header_fault(b"hello") == "not an image file"
    assert header_fault(b"II*\x00\x08\x00") == "a TIFF file"
    assert header_fault(b"\x00\x00\x00\x18ftypheic") == "a HEIC file"
    assert header_fault(b"\xff\x0a\xfa\x7f") == "a JPEG XL file"
    animated = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), color) for color in ((0, 0, 0), (255, 255, 255))]
    frames[0].save(animated, "WEBP", save_all=True, append_images=frames[1:])
    assert header_fault(animated.getvalue()[:HEADER_BYTES]).startswith("an animated WebP")
    with pytest.raises(tf.errors.InvalidArgumentError) as failed:  # what the decoder says of it
        decode_image(animated.getvalue())
    assert decode_error_reason(failed.value.message).startswith("an animated WebP")
    for known in IMAGE_FILE_FORMATS:
        encoded = io.BytesIO()
        Image.new("RGB", (8, 8)).save(encoded, known.name.upper())
        assert header_fault(encoded.getvalue()[:HEADER_BYTES]) is None, known.name
