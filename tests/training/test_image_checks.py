"""keras_cait.training.image_checks: the examples of a source that cannot be decoded, found before a run
(`check_images`) and named after a decode error (`undecodable_named`)."""

import dataclasses
import os

import pytest
from PIL import Image

from keras_cait.errors import ArgumentError
from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from keras_cait.training import image_checks, sources, stream


def _text_as_jpeg(path):
    path.write_text("This is not an image, whatever its name says.\n")


def _truncated_jpeg(path):
    Image.new("RGB", (64, 48), (200, 30, 60)).save(path, format="JPEG", quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_folder_that_decodes_has_no_undecodable_images(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "1" / "photo.jpg")
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "2" / "photo.gif")
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "2" / "photo.bmp")
    assert image_checks.find_undecodable(sources.image_folder(folder)) == []


def test_a_text_file_named_jpg_is_found_by_its_first_bytes(tmp_path, digits, monkeypatch):
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _text_as_jpeg(tmp_path / "photos" / "1" / "broken.jpg")
    (tmp_path / "photos" / "2" / "empty.png").write_bytes(b"")
    # The first pass finds them: no image is decoded.
    monkeypatch.setattr(image_checks, "_decode_pass", lambda *args: pytest.fail("decoded every image"))
    assert image_checks.find_undecodable(sources.image_folder(folder)) == [
        image_checks.Undecodable(os.path.join(folder, "1", "broken.jpg"), "not an image file"),
        image_checks.Undecodable(os.path.join(folder, "2", "empty.png"), "an empty file"),
    ]


@pytest.mark.large
def test_a_truncated_jpeg_is_found_by_decoding(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    for name in ("0/cut.jpg", "2/cut.jpeg"):
        _truncated_jpeg(tmp_path / "photos" / name)
    source = sources.image_folder(folder)
    assert image_checks.find_undecodable(source, passes=("headers",)) == []  # their headers are a JPEG's
    found = image_checks.find_undecodable(source)
    assert [bad.name for bad in found] == [os.path.join(folder, "0", "cut.jpg"),
                                           os.path.join(folder, "2", "cut.jpeg")]
    assert all(bad.reason == "invalid JPEG data (a truncated or damaged file)" for bad in found)
    assert len(image_checks.find_undecodable(source, limit=1)) == 1


def test_undecodable_images_of_a_split_and_of_tfrecords(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=4, size=8, classes=range(2))
    _truncated_jpeg(tmp_path / "photos" / "1" / "cut.jpg")
    source = sources.image_folder(folder)
    parts = sources.split(source, 0.5, seed=0)
    found = [bad.name for part in parts for bad in image_checks.find_undecodable(part)]
    assert found == [os.path.join(folder, "1", "cut.jpg")]
    records = sources.tfrecords(sources.write_tfrecords(source, str(tmp_path / "digits")), source.class_names)
    index = [path.numpy().decode() for path, _ in source.examples].index(found[0])
    assert image_checks.find_undecodable(records) == [
        image_checks.Undecodable(f"record {index}", "invalid JPEG data (a truncated or damaged file)")]


def test_an_image_over_the_pixel_limit_is_found_with_its_size(tmp_path, digits, monkeypatch):
    from keras_cait.images import evaluation_transform

    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    Image.new("RGB", (40, 30)).save(tmp_path / "photos" / "0" / "large.png")
    monkeypatch.setattr(evaluation_transform, "MAX_PIXELS", 1000)
    assert image_checks.find_undecodable(sources.image_folder(folder)) == [image_checks.Undecodable(
        os.path.join(folder, "0", "large.png"),
        "30x40 pixels, more than the 1,000 that are decoded (PIL's decompression-bomb limit)")]


# === Before a run: every undecodable image at once, in bounded time, without the decoders' noise ===


def _cut_progressive_jpeg(path, keep=0.5):
    """A progressive JPEG cut short: libjpeg prints "Improper call to JPEG library ..." on decoding it."""
    Image.new("RGB", (64, 48), (200, 30, 60)).save(path, format="JPEG", quality=90, progressive=True)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_the_check_names_every_undecodable_image_at_once(tmp_path, digits):
    """The header faults and the decode faults together (the search after a failure stops at the first kind)."""
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _text_as_jpeg(tmp_path / "photos" / "0" / "notes.jpg")
    _truncated_jpeg(tmp_path / "photos" / "1" / "cut.jpg")
    _cut_progressive_jpeg(tmp_path / "photos" / "2" / "cut.jpg")
    check = image_checks.check_images(sources.image_folder(folder))
    truncated = "invalid JPEG data (a truncated or damaged file)"
    assert check.undecodable == [
        image_checks.Undecodable(os.path.join(folder, "0", "notes.jpg"), "not an image file"),
        image_checks.Undecodable(os.path.join(folder, "1", "cut.jpg"), truncated),
        image_checks.Undecodable(os.path.join(folder, "2", "cut.jpg"), truncated),
    ]
    assert check.complete and (check.decoded, check.total) == (12, 12)


def test_a_large_folder_is_decoded_in_part_the_files_that_end_early_first(tmp_path, digits):
    """Past `at_least` images the decode stops when its time is up (here at once): a cut file is
    decoded first, wherever it lies, since its last bytes are not its format's end."""
    folder = digits(tmp_path / "photos", per_class=40, size=8, classes=range(2))
    _truncated_jpeg(tmp_path / "photos" / "1" / "z_cut.jpg")  # the folder's last file
    check = image_checks.check_images(sources.image_folder(folder), seconds=0, at_least=1)
    assert check.undecodable == [image_checks.Undecodable(os.path.join(folder, "1", "z_cut.jpg"),
                                                     "invalid JPEG data (a truncated or damaged file)")]
    assert not check.complete and check.decoded < check.total == 81
    assert check.said().startswith("the first and last bytes of its 81 files read, ")
    assert check.said().endswith(" s; the others are decoded as the run reads them.")


def test_the_decoders_own_lines_stay_off_standard_error(tmp_path, digits, capfd):
    """libjpeg prints "Improper call to JPEG library in state 203" with fprintf, which
    TF_CPP_MIN_LOG_LEVEL does not hide; the image is named by keras_cait instead."""
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    _cut_progressive_jpeg(tmp_path / "photos" / "1" / "cut.jpg")
    (tmp_path / "photos" / "1" / "header.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")  # read error
    capfd.readouterr()
    found = image_checks.find_undecodable(sources.image_folder(folder))
    assert [os.path.basename(bad.name) for bad in found] == ["cut.jpg", "header.jpg"]
    assert capfd.readouterr().err == ""


def test_the_check_of_records_names_them_in_the_one_list_s_words(tmp_path, digits):
    """TensorFlow's "Unknown image file format. One of JPEG, JPEG XL, ..." is a second list of formats."""
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    _text_as_jpeg(tmp_path / "photos" / "1" / "notes.jpg")
    import tensorflow as tf

    # Records written from the files as they are (`write_tfrecords` refuses a file that is no image).
    source = dataclasses.replace(sources.image_folder(folder), load=lambda path, label: (tf.io.read_file(path), label))
    records = sources.tfrecords(sources.write_tfrecords(source, str(tmp_path / "digits")), source.class_names)
    check = image_checks.check_images(records)
    assert check.undecodable == [image_checks.Undecodable("record 4", "not an image file")]
    assert check.complete and not check.files


# === A decode error while a run reads its data: the run names the file (undecodable_named) ===


def _undecodable_folder(root, digits):
    folder = digits(root / "photos", per_class=2, size=8, classes=range(2))
    (root / "photos" / "1" / "broken.jpg").write_text("This is not an image, whatever its name says.\n")
    return sources.image_folder(folder)


def _read_all(source):
    for _ in stream.evaluation_dataset(source, 8, 2):
        pass


def test_a_decode_error_becomes_the_error_naming_the_file(tmp_path, digits):
    import tensorflow as tf

    source = _undecodable_folder(tmp_path, digits)
    with pytest.raises(ArgumentError) as failed:
        with image_checks.undecodable_named([("data", "photos", source)]):
            _read_all(source)
    broken = os.path.join(str(tmp_path), "photos", "1", "broken.jpg")
    assert str(failed.value) == (f"data='photos': {broken} cannot be decoded as an image ({IMAGE_FORMATS}): "
                                 "not an image file; remove or replace it")
    assert (failed.value.argument, failed.value.value, failed.value.usage) == ("data", "photos", False)
    assert isinstance(failed.value.cause, tf.errors.InvalidArgumentError) and failed.value.__cause__ is None


def test_the_sources_are_searched_only_after_a_decode_error(tmp_path, digits, monkeypatch):
    source = _undecodable_folder(tmp_path, digits)
    monkeypatch.setattr(image_checks, "find_undecodable", lambda *args, **kwargs: pytest.fail("searched"))
    with image_checks.undecodable_named([("data", "photos", source), ("val_data", "v", source)]):
        pass


def test_other_errors_pass_the_search_unchanged(tmp_path, digits):
    import tensorflow as tf

    source = _undecodable_folder(tmp_path, digits)
    for error in (tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [4,3] vs. [4,10]"),
                  ValueError("another mistake"), tf.errors.ResourceExhaustedError(None, None, "OOM")):
        with pytest.raises(type(error)) as raised:
            with image_checks.undecodable_named([("data", "photos", source)]):
                raise error
        assert raised.value is error


def test_a_decode_error_that_no_search_finds_is_tensorflow_s(tmp_path, digits):
    import tensorflow as tf

    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = _undecodable_folder(tmp_path, digits)
    with pytest.raises(tf.errors.InvalidArgumentError, match=sources.NOT_AN_IMAGE):
        with image_checks.undecodable_named([("data", "good", good)]):  # the error is not of this data
            _read_all(bad)


def test_the_validation_data_are_searched_under_their_argument(tmp_path, digits):
    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = _undecodable_folder(tmp_path, digits)
    with pytest.raises(ArgumentError, match=r"^val_data='photos': .*broken\.jpg cannot be decoded") as failed:
        with image_checks.undecodable_named([("data", "good", good), ("val_data", "photos", bad), ("x", "y", None)]):
            _read_all(bad)
    assert failed.value.argument == "val_data"
