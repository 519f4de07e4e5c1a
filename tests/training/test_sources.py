"""keras_cait.training.sources: image folders, TFRecords, TFDS, held-out splits."""

import collections
import os
import pickle
import re
import sys

import pytest
from PIL import Image

from keras_cait.errors import ArgumentError
from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from keras_cait.training import Augmentation, run, sources, stream
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
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError) as raised:  # Python's own type still, and an ArgumentError naming it
        sources.image_folder(missing)
    assert isinstance(raised.value, ArgumentError) and raised.value.argument == "directory"
    assert str(raised.value) == (f"directory={str(missing)!r}: no such folder; give the folder that holds one "
                                 f"subfolder per class, e.g. {missing / 'cat' / '1.jpg'}")
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)  # as a process pool sends it
    (tmp_path / "cat").mkdir()
    with pytest.raises(ArgumentError, match=f"^directory={str(tmp_path)!r}: has no images: expected one subfolder "
                                            "per class"):
        sources.image_folder(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ArgumentError, match=r"^directory='.*notes.txt': is a file, not a folder; give the folder "):
        sources.image_folder(tmp_path / "notes.txt")  # was: "does not exist"
    with pytest.raises(ArgumentError, match=r"^directory=None: must be the path of a folder, not NoneType; e.g. "):
        sources.image_folder(None)  # was: TypeError from os.fspath


@pytest.mark.parametrize("class_names, problem", [
    (["cat", "dog", "cat"], r"repeats cat; give each class its own name"),
    (None, "must be a list of names"), ("cat,dog", "must be a list of names"), (3, "must be a list of names"),
    ({"dog": 1, "cat": 0}, r"is a dict \(its keys: 'dog', 'cat'\), which is read by its keys")])
def test_tfrecords_refuse_class_names_that_name_no_class_each_before_reading(tmp_path, class_names, problem):
    """A repeated name gave two indices one name: predictions read the wrong class. Refused before
    any file is globbed (the pattern here matches nothing: it is not what is reported)."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError, match=rf"^class_names=.*: {problem}") as caught:
        sources.tfrecords(str(tmp_path / "none-*"), class_names)
    assert caught.value.argument == "class_names"


@pytest.mark.large
def test_tfrecords_refuse_class_names_fewer_than_their_labels(folder, tmp_path):
    """Labels past the names became all-zero rows of the one-hot labels: trained on as no class."""
    from keras_cait.errors import ArgumentError

    source = sources.image_folder(folder)
    paths = sources.write_tfrecords(source, str(tmp_path / "digits"))
    with pytest.raises(ArgumentError) as caught:
        sources.tfrecords(paths, source.class_names[:3])
    assert str(caught.value) == ("class_names=[...]: names 3 classes, but the records' labels run from 0 to 9; give "
                                 "one name per label, 10 in index order (a label past the names was trained on as no "
                                 "class)")
    assert sources.tfrecords(paths, source.class_names).num_examples == 100


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
    with pytest.raises(ArgumentError) as refused:
        sources.image_folder(folder)
    dog, fish = os.path.join(folder, "dog"), os.path.join(folder, "fish")
    notes = os.path.join(fish, "notes.txt")
    assert str(refused.value) == (
        f"directory={folder!r}: The class folders {dog!r}, {fish!r} hold no images ({IMAGE_FORMATS} files: "
        f"{', '.join(sources.IMAGE_EXTENSIONS)}), only files of other formats: {notes}; add images to them, or "
        "remove those folders.")
    os.rmdir(dog)
    with pytest.raises(ArgumentError, match=f"^directory={folder!r}: The class folder {fish!r} holds no images .*; add images to it, "
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
    with pytest.raises(ArgumentError) as refused:
        sources.split(source, 0.95)
    assert (refused.value.argument, refused.value.value) == ("fraction", 0.95)
    assert str(refused.value) == ("fraction=0.95: holds out 40 of 42 examples and cannot keep one of each of the "
                                  "3 classes to train on; give a smaller fraction, or more examples of each class")



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


@pytest.mark.parametrize("seed, kind", [(None, ", not NoneType"), (-1, ""), ("1", ", not str")])
def test_split_refuses_a_seed_that_chooses_no_one_held_out_set(folder, seed, kind):
    """seed=None drew another held-out set on each call, which a second call trained on; '1' and -1 were
    numpy's errors."""
    with pytest.raises(ArgumentError, match=rf"^seed={re.escape(repr(seed))}: must be a non-negative integer, which "
                                            rf"chooses the same held-out set each call{kind}; e\.g\. seed=0$"):
        sources.split(sources.image_folder(folder), 0.1, seed=seed)


def test_write_tfrecords_refuses_a_prefix_with_shards_already_and_arguments_it_cannot_take(folder, tmp_path):
    """Written again with fewer shards, the old ones stayed beside the new and a glob of the prefix read
    every example twice; num_shards=0 was a ZeroDivisionError, a path for the source an AttributeError."""
    source = sources.image_folder(folder)
    first = sources.write_tfrecords(source, str(tmp_path / "digits"), num_shards=2)
    with pytest.raises(ArgumentError, match=r"^path_prefix='.*digits': has 2 shards already \(digits-00000-of-00002"
                                            r"\.tfrecord, digits-00001-of-00002\.tfrecord\); give another prefix, "
                                            r"or delete them first$"):
        sources.write_tfrecords(source, str(tmp_path / "digits"), num_shards=1)
    for arguments, line in [
        (dict(num_shards=0), r"^num_shards=0: must be a positive integer, the files to write; e\.g\. num_shards=1$"),
        (dict(path_prefix=str(tmp_path)), r"^path_prefix='.*': must be the start of the shards' paths, not a folder"),
        (dict(path_prefix=None), r"^path_prefix=None: must be the start of the shards' paths, not NoneType"),
        (dict(source=str(folder)), r"^source='.*': write_tfrecords takes an ImageSource, not a path"),
    ]:
        with pytest.raises(ArgumentError, match=line):
            sources.write_tfrecords(**{"source": source, "path_prefix": str(tmp_path / "other"), **arguments})
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(path) for path in first)


def test_tfrecords_refuse_files_and_a_count_they_cannot_take_naming_them(folder, tmp_path):
    """A folder or a missing file failed as TensorFlow graph errors on the first pass, a pathlib path
    as `'PosixPath' object is not iterable`, and num_examples='12' was taken."""
    import pathlib

    source = sources.image_folder(folder)
    (path,) = sources.write_tfrecords(source, str(tmp_path / "digits"))
    assert sources.tfrecords(pathlib.Path(path), source.class_names).num_examples == 100
    for files, line in [(str(tmp_path), r"is a folder, not a TFRecord file"),
                        ([str(tmp_path / "missing.tfrecord")], r"is missing, not a TFRecord file")]:
        with pytest.raises(ArgumentError, match=rf"^files=.*: '.*' {line}; give the files of write_tfrecords"):
            sources.tfrecords(files, source.class_names)
    with pytest.raises(ArgumentError, match=r"^num_examples='100': must be a positive integer, the records in the "
                                            r"files \(None: counted\), not str"):
        sources.tfrecords(path, source.class_names, num_examples="100")
    pattern = str(tmp_path / "none-*.tfrecord")
    with pytest.raises(FileNotFoundError) as raised:  # was a bare one naming no argument
        sources.tfrecords(pattern, source.class_names)
    assert str(raised.value) == f"files={pattern!r}: matches no file; give the files of write_tfrecords, e.g. " \
                                "'records/train-*'"
    # Through a spec, the spec is named (its caller gave no `files`), and so a run's `data`.
    with pytest.raises(FileNotFoundError, match=rf"^spec='tfrecord:{re.escape(pattern)}': matches no file"):
        sources.source(f"tfrecord:{pattern}", source.class_names)
    with pytest.raises(ArgumentError, match=rf"^data='tfrecord:{re.escape(pattern)}': matches no file"):
        run.evaluate("XXS24", f"tfrecord:{pattern}", class_names=source.class_names, weights=None, image_size=32)


def test_split_given_a_path_or_a_fraction_of_another_type_names_the_argument(folder):
    # Before: AttributeError: 'str' object has no attribute 'num_examples'; TypeError: '<' not supported.
    with pytest.raises(ArgumentError, match=rf"^source='{folder}': split takes an ImageSource, not a path; read the "
                                            rf"folder first: keras_cait.training.sources.image_folder\('{folder}'\)$"):
        sources.split(str(folder), 0.1)
    with pytest.raises(ArgumentError, match=r"^fraction='0.1': must be above 0 and below 1, not str; e.g. "
                                            r"fraction=0.1$"):
        sources.split(sources.image_folder(folder), "0.1")
