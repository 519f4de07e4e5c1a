"""keras_cait.training.sources: image folders, TFRecords, TFDS, held-out splits."""

import collections
import os
import sys

import pytest
from PIL import Image

from keras_cait.errors import ArgumentError
from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from keras_cait.training import Augmentation, sources, stream
from tests.training.helpers import NO_AUGMENTATION, digest, stream_images


def test_image_folder_lists_classes_in_sorted_order(tmp_path):
    for name, count in (("zebra", 2), ("ant", 3)):
        (tmp_path / name / "nested").mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / name / "nested" / f"{i}.PNG")
    (tmp_path / "ant" / "notes.txt").write_text("not an image")
    source = sources.image_folder(tmp_path)
    assert source.class_names == ["ant", "zebra"]
    assert source.num_examples == 5
    labels = [int(label) for _, label in source.examples]
    assert labels == [0, 0, 0, 1, 1]


def test_image_folder_errors_say_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sources.image_folder(tmp_path / "missing")
    (tmp_path / "cat").mkdir()
    with pytest.raises(ValueError, match="one subfolder per class"):
        sources.image_folder(tmp_path)


@pytest.mark.large
def test_tfrecords_round_trip(folder, tmp_path):
    source = sources.image_folder(folder)
    paths = sources.write_tfrecords(source, str(tmp_path / "digits"), num_shards=3)
    assert [os.path.basename(p) for p in paths] == [
        f"digits-{i:05d}-of-00003.tfrecord" for i in range(3)
    ]
    records = sources.source(f"tfrecord:{tmp_path}/digits-*", class_names=source.class_names)
    assert records.num_examples == 100

    def contents(src):
        return collections.Counter(
            (digest(encoded.numpy()), int(label)) for encoded, label in src.examples.map(src.load)
        )

    assert contents(records) == contents(source)
    augmentation = Augmentation(image_size=32, num_classes=10, **NO_AUGMENTATION)
    batches = stream_images(records, augmentation, batch_size=25, epochs=1, seed=0)
    streamed = {digest(image) for images, _ in batches for image in images}
    every_image = {digest(image) for image, _ in stream.evaluation_dataset(source, 32, 1).unbatch()}
    assert len(batches) == 4 and streamed == every_image


def test_tfds_without_tensorflow_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
        sources.source("tfds:imagenet2012:validation")
    with pytest.raises(ValueError, match="tfds:NAME:SPLIT"):
        sources.source("tfds:validation")
    with pytest.raises(ArgumentError) as raised:
        sources.source("tfrecord:train-*")
    assert (raised.value.argument, raised.value.value, raised.value.usage) == ("class_names", None, True)
    assert str(raised.value) == ("class_names=None: 'tfrecord:train-*' names TFRecords, which hold class indices, "
                                 "not names; give class_names, one name per class, in the order of the indices")


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.1])
def test_a_split_out_of_range_is_one_error_naming_the_fraction(folder, fraction):
    with pytest.raises(ArgumentError) as raised:
        sources.split(sources.image_folder(folder), fraction)
    assert (raised.value.argument, raised.value.value) == ("fraction", fraction)
    assert str(raised.value) == f"fraction={fraction!r}: must be above 0 and below 1; e.g. fraction=0.1"


def test_split_is_disjoint_and_repeatable(folder):
    source = sources.image_folder(folder)
    rest, held_out = sources.split(source, 0.2, seed=3)
    names = [{p.numpy() for p, _ in part.examples} for part in (rest, held_out)]
    assert (len(names[0]), len(names[1])) == (80, 20)
    assert not names[0] & names[1]
    assert names[1] == {p.numpy() for p, _ in sources.split(source, 0.2, seed=3)[1].examples}


def test_an_empty_class_folder_is_refused_by_name(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    os.mkdir(os.path.join(folder, "dog"))
    (tmp_path / "photos" / "fish").mkdir()
    (tmp_path / "photos" / "fish" / "notes.txt").write_text("no image here")
    with pytest.raises(ValueError) as refused:
        sources.image_folder(folder)
    dog, fish = os.path.join(folder, "dog"), os.path.join(folder, "fish")
    notes = os.path.join(fish, "notes.txt")
    assert str(refused.value) == (
        f"The class folders {dog!r}, {fish!r} hold no images ({IMAGE_FORMATS} files: "
        f"{', '.join(sources.IMAGE_EXTENSIONS)}), only files of other formats: {notes}; add images to them, or "
        "remove those folders.")
    os.rmdir(dog)
    with pytest.raises(ValueError, match=f"^The class folder {fish!r} holds no images .*; add images to it, "
                                         "or remove the folder.$"):
        sources.image_folder(folder)


def test_hidden_folders_are_neither_classes_nor_searched(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    (tmp_path / "photos" / ".ipynb_checkpoints").mkdir()  # empty, and hidden: not refused
    (tmp_path / "photos" / ".cache" / "x").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "photos" / ".cache" / "x" / "1.png")
    (tmp_path / "photos" / "0" / ".thumbnails").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "photos" / "0" / ".thumbnails" / "1.png")
    source = sources.image_folder(folder)
    assert source.class_names == ["0", "1"] and source.num_examples == 4
    assert not any("/." in path.numpy().decode() for path, _ in source.examples)


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
    assert sources.find_undecodable(sources.image_folder(folder)) == []


def test_a_text_file_named_jpg_is_found_by_its_first_bytes(tmp_path, digits, monkeypatch):
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _text_as_jpeg(tmp_path / "photos" / "1" / "broken.jpg")
    (tmp_path / "photos" / "2" / "empty.png").write_bytes(b"")
    # The first pass finds them: no image is decoded.
    monkeypatch.setattr(sources, "_decode_pass", lambda *args: pytest.fail("decoded every image"))
    assert sources.find_undecodable(sources.image_folder(folder)) == [
        sources.Undecodable(os.path.join(folder, "1", "broken.jpg"), "not an image file"),
        sources.Undecodable(os.path.join(folder, "2", "empty.png"), "an empty file"),
    ]


@pytest.mark.large
def test_a_truncated_jpeg_is_found_by_decoding(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    for name in ("0/cut.jpg", "2/cut.jpeg"):
        _truncated_jpeg(tmp_path / "photos" / name)
    source = sources.image_folder(folder)
    assert sources.find_undecodable(source, passes=("headers",)) == []  # their headers are a JPEG's
    found = sources.find_undecodable(source)
    assert [bad.name for bad in found] == [os.path.join(folder, "0", "cut.jpg"),
                                           os.path.join(folder, "2", "cut.jpeg")]
    assert all(bad.reason == "invalid JPEG data (a truncated or damaged file)" for bad in found)
    assert len(sources.find_undecodable(source, limit=1)) == 1


def test_undecodable_images_of_a_split_and_of_tfrecords(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=4, size=8, classes=range(2))
    _truncated_jpeg(tmp_path / "photos" / "1" / "cut.jpg")
    source = sources.image_folder(folder)
    parts = sources.split(source, 0.5, seed=0)
    found = [bad.name for part in parts for bad in sources.find_undecodable(part)]
    assert found == [os.path.join(folder, "1", "cut.jpg")]
    records = sources.tfrecords(sources.write_tfrecords(source, str(tmp_path / "digits")), source.class_names)
    index = [path.numpy().decode() for path, _ in source.examples].index(found[0])
    assert sources.find_undecodable(records) == [
        sources.Undecodable(f"record {index}", "invalid JPEG data (a truncated or damaged file)")]


def test_an_image_over_the_pixel_limit_is_found_with_its_size(tmp_path, digits, monkeypatch):
    from keras_cait.images import evaluation_transform

    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    Image.new("RGB", (40, 30)).save(tmp_path / "photos" / "0" / "large.png")
    monkeypatch.setattr(evaluation_transform, "MAX_PIXELS", 1000)
    assert sources.find_undecodable(sources.image_folder(folder)) == [sources.Undecodable(
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
    check = sources.check_images(sources.image_folder(folder))
    assert check.undecodable == [
        sources.Undecodable(os.path.join(folder, "0", "notes.jpg"), "not an image file"),
        sources.Undecodable(os.path.join(folder, "1", "cut.jpg"), "invalid JPEG data (a truncated or damaged file)"),
        sources.Undecodable(os.path.join(folder, "2", "cut.jpg"), "invalid JPEG data (a truncated or damaged file)"),
    ]
    assert check.complete and (check.decoded, check.total) == (12, 12)


def test_a_large_folder_is_decoded_in_part_the_files_that_end_early_first(tmp_path, digits):
    """Past `at_least` images the decode stops when its time is up (here at once): a cut file is
    decoded first, wherever it lies, since its last bytes are not its format's end."""
    folder = digits(tmp_path / "photos", per_class=40, size=8, classes=range(2))
    _truncated_jpeg(tmp_path / "photos" / "1" / "z_cut.jpg")  # the folder's last file
    check = sources.check_images(sources.image_folder(folder), seconds=0, at_least=1)
    assert check.undecodable == [sources.Undecodable(os.path.join(folder, "1", "z_cut.jpg"),
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
    found = sources.find_undecodable(sources.image_folder(folder))
    assert [os.path.basename(bad.name) for bad in found] == ["cut.jpg", "header.jpg"]
    assert capfd.readouterr().err == ""


def test_the_split_holds_out_about_the_fraction_of_each_class_and_never_its_last_image(tmp_path, digits):
    folder = digits(tmp_path / "photos", per_class=10, size=8, classes=range(3))
    for index in range(2):  # classes of 12, 2 and 28 images
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "0" / f"more{index}.png")
    for index in range(18):
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "2" / f"more{index}.png")
    for name in os.listdir(tmp_path / "photos" / "1")[2:]:
        os.remove(tmp_path / "photos" / "1" / name)
    source = sources.image_folder(folder)
    assert sources.class_counts(source) == [12, 2, 28]
    for seed in range(3):
        rest, held_out = sources.split(source, 0.25, seed=seed)
        counts = sources.class_counts(held_out)
        assert sum(counts) == round(42 * 0.25) and sources.class_counts(rest) == [12 - counts[0], 2 - counts[1],
                                                                                 28 - counts[2]]
        assert abs(counts[0] - 3) <= 0.5 and counts[1] in (0, 1) and abs(counts[2] - 7) <= 0.5, counts
    again = sources.split(source, 0.25, seed=2)[1]
    assert [p.numpy() for p, _ in again.examples] == [p.numpy() for p, _ in held_out.examples]
    with pytest.raises(ValueError, match="keep an example of each of the 3 classes"):
        sources.split(source, 0.95)


def test_the_check_of_records_names_them_in_the_one_list_s_words(tmp_path, digits):
    """TensorFlow's "Unknown image file format. One of JPEG, JPEG XL, ..." is a second list of formats."""
    folder = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    _text_as_jpeg(tmp_path / "photos" / "1" / "notes.jpg")
    source = sources.image_folder(folder)
    records = sources.tfrecords(sources.write_tfrecords(source, str(tmp_path / "digits")), source.class_names)
    check = sources.check_images(records)
    assert check.undecodable == [sources.Undecodable("record 4", "not an image file")]
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
        with sources.undecodable_named([("data", "photos", source)]):
            _read_all(source)
    broken = os.path.join(str(tmp_path), "photos", "1", "broken.jpg")
    assert str(failed.value) == (f"data='photos': {broken} cannot be decoded as an image ({IMAGE_FORMATS}): "
                                 "not an image file; remove or replace it")
    assert (failed.value.argument, failed.value.value, failed.value.usage) == ("data", "photos", False)
    assert isinstance(failed.value.__cause__, tf.errors.InvalidArgumentError)


def test_the_sources_are_searched_only_after_a_decode_error(tmp_path, digits, monkeypatch):
    source = _undecodable_folder(tmp_path, digits)
    monkeypatch.setattr(sources, "find_undecodable", lambda *args, **kwargs: pytest.fail("searched"))
    with sources.undecodable_named([("data", "photos", source), ("val_data", "v", source)]):
        pass


def test_other_errors_pass_the_search_unchanged(tmp_path, digits):
    import tensorflow as tf

    source = _undecodable_folder(tmp_path, digits)
    for error in (tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [4,3] vs. [4,10]"),
                  ValueError("another mistake"), tf.errors.ResourceExhaustedError(None, None, "OOM")):
        with pytest.raises(type(error)) as raised:
            with sources.undecodable_named([("data", "photos", source)]):
                raise error
        assert raised.value is error


def test_a_decode_error_that_no_search_finds_is_tensorflow_s(tmp_path, digits):
    import tensorflow as tf

    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = _undecodable_folder(tmp_path, digits)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
        with sources.undecodable_named([("data", "good", good)]):  # the error is not of this data
            _read_all(bad)


def test_the_validation_data_are_searched_under_their_argument(tmp_path, digits):
    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = _undecodable_folder(tmp_path, digits)
    with pytest.raises(ArgumentError, match=r"^val_data='photos': .*broken\.jpg cannot be decoded") as failed:
        with sources.undecodable_named([("data", "good", good), ("val_data", "photos", bad), ("x", "y", None)]):
            _read_all(bad)
    assert failed.value.argument == "val_data"


def test_class_names_given_with_a_folder_are_checked_against_its_classes(folder):
    """Given with a folder they used to be put aside without a word (and written to run.json)."""
    classes = sources.image_folder(folder).class_names
    assert sources.source(folder, list(classes)).class_names == classes
    wrong = ["cat", "dog"]
    with pytest.raises(ArgumentError) as raised:
        sources.source(folder, wrong)
    assert (raised.value.argument, raised.value.value, raised.value.usage) == ("class_names", wrong, True)
    assert str(raised.value).startswith(f"class_names=['cat', 'dog']: the folder {folder!r} has the classes "
                                        f"{', '.join(classes[:5])}")
    assert str(raised.value).endswith("; leave class_names out for a folder, or give those names in that order")
