"""keras_cait.training.sources: image folders, TFRecords, TFDS, held-out splits."""

import collections
import os
import sys

import pytest
from PIL import Image

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
    with pytest.raises(ValueError, match="--class-names"):
        sources.source("tfrecord:train-*")


def test_split_is_disjoint_and_repeatable(folder):
    source = sources.image_folder(folder)
    rest, held_out = sources.split(source, 0.2, seed=3)
    names = [{p.numpy() for p, _ in part.examples} for part in (rest, held_out)]
    assert (len(names[0]), len(names[1])) == (80, 20)
    assert not names[0] & names[1]
    assert names[1] == {p.numpy() for p, _ in sources.split(source, 0.2, seed=3)[1].examples}
