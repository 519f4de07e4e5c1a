"""Labelled image sources (tf.data): image folders, TFRecords, TFDS.

A source lists examples cheaply (file paths or serialized records) and loads
one as (encoded image bytes, class index); `keras_cait.training.stream` turns
a source into training batches and evaluation batches.
"""

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


@dataclasses.dataclass
class ImageSource:
    """A labelled image collection.

    Attributes:
        examples: a finite `tf.data.Dataset` of cheap elements in a fixed order.
        load: element -> (encoded image bytes, int32 class index), a tf function.
        num_examples: how many elements `examples` has.
        class_names: the class of each index.
        in_memory: whether `examples` are held in memory (file paths), so that
            a whole epoch can be shuffled at once.
    """

    examples: tf.data.Dataset
    load: Callable
    num_examples: int
    class_names: list
    in_memory: bool = False

    @property
    def num_classes(self):
        return len(self.class_names)


def image_folder(directory):
    """The images of `directory/<class name>/*.{jpg,jpeg,png,bmp,gif}`, classes in sorted order.

    The layout of Keras' `image_dataset_from_directory` and torchvision's
    `ImageFolder`.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Image folder {directory!r} does not exist.")
    class_names = sorted(
        entry.name for entry in os.scandir(directory) if entry.is_dir()
    )
    paths, labels = [], []
    for index, name in enumerate(class_names):
        for root, _, files in sorted(os.walk(os.path.join(directory, name))):
            for file in sorted(files):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(root, file))
                    labels.append(index)
    if not paths:
        raise ValueError(
            f"Image folder {directory!r} has no images: expected one subfolder per class "
            f"holding {', '.join(IMAGE_EXTENSIONS)} files, e.g. {directory}/cat/1.jpg."
        )
    examples = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    return ImageSource(
        examples,
        lambda path, label: (tf.io.read_file(path), label),
        len(paths),
        class_names,
        in_memory=True,
    )


_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def _parse_record(record):
    example = tf.io.parse_single_example(record, _FEATURES)
    return example["image/encoded"], tf.cast(example["image/class/label"], tf.int32)


def write_tfrecords(source, path_prefix, num_shards=1):
    """Writes `source` as `path_prefix-00000-of-0000N.tfrecord` files; returns their paths.

    Each record is a `tf.train.Example` with `image/encoded` (the original file
    bytes) and `image/class/label` (int64), the layout of the TF-slim/TPU
    ImageNet TFRecords. Shards are written to a temporary name and renamed.
    """
    paths = [f"{path_prefix}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(path + ".partial") for path in paths]
    for index, (encoded, label) in enumerate(source.examples.map(source.load)):
        feature = {
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded.numpy()])),
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        }
        record = tf.train.Example(features=tf.train.Features(feature=feature))
        writers[index % num_shards].write(record.SerializeToString())
    for writer, path in zip(writers, paths):
        writer.close()
        os.replace(path + ".partial", path)
    return paths


def tfrecords(files, class_names, num_examples=None):
    """Images from TFRecord files of `tf.train.Example`s (see `write_tfrecords`).

    Args:
        files: a glob pattern or a list of paths.
        class_names: the class of each index (its length is the class count).
        num_examples: the record count, or None to count them once.
    """
    paths = sorted(tf.io.gfile.glob(files)) if isinstance(files, str) else list(files)
    if not paths:
        raise FileNotFoundError(f"No TFRecord files match {files!r}.")
    examples = tf.data.TFRecordDataset(paths)
    if num_examples is None:
        num_examples = int(examples.reduce(0, lambda count, _: count + 1))
    return ImageSource(examples, _parse_record, num_examples, list(class_names))


def tfds(name, split, data_dir=None):
    """A TensorFlow Datasets image classification split, e.g. `tfds("imagenet2012", "validation")`.

    Needs `pip install tensorflow-datasets` and the dataset prepared in
    `data_dir` (TFDS downloads most datasets itself; ImageNet needs the manual
    download described in its TFDS page). Images are read still encoded and
    decoded in the pipeline like the other sources.
    """
    try:
        import tensorflow_datasets
    except ImportError as error:
        raise ImportError(
            f"Reading the TFDS dataset {name!r} needs tensorflow-datasets, which is not "
            "installed: pip install tensorflow-datasets. Or use a folder of images or "
            "TFRecord files instead."
        ) from error
    builder = tensorflow_datasets.builder(name, data_dir=data_dir)
    examples = builder.as_dataset(
        split=split,
        decoders={"image": tensorflow_datasets.decode.SkipDecoding()},
        shuffle_files=False,
    )
    return ImageSource(
        examples,
        lambda example: (example["image"], tf.cast(example["label"], tf.int32)),
        builder.info.splits[split].num_examples,
        builder.info.features["label"].names,
    )


def source(spec, class_names=None, data_dir=None):
    """Opens a source from its command-line spelling.

    - `path/to/folder`: `image_folder`;
    - `tfrecord:PATTERN`: `tfrecords(PATTERN, class_names)` (class names needed);
    - `tfds:NAME:SPLIT`: `tfds(NAME, SPLIT, data_dir)`, e.g. `tfds:imagenet2012:validation`.
    """
    spec = os.fspath(spec)
    if spec.startswith("tfds:"):
        name, _, split = spec[len("tfds:"):].rpartition(":")
        if not name:
            raise ValueError(f"{spec!r}: write tfds:NAME:SPLIT, e.g. tfds:imagenet2012:validation.")
        return tfds(name, split, data_dir)
    if spec.startswith("tfrecord:"):
        if not class_names:
            raise ValueError(
                f"{spec!r}: TFRecords need the class names (--class-names FILE, one name per line)."
            )
        return tfrecords(spec[len("tfrecord:"):], class_names)
    return image_folder(spec)


def split(source, fraction, seed=0):
    """Splits an in-memory source (e.g. an image folder) into (rest, held-out `fraction`).

    The held-out examples are a seeded random choice, the same on every call.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"fraction={fraction}: must be in (0, 1), e.g. 0.1.")
    held_out = max(1, round(source.num_examples * fraction))
    if held_out >= source.num_examples:
        raise ValueError(f"Cannot hold out {fraction:.0%} of {source.num_examples} examples.")
    shuffled = source.examples.shuffle(source.num_examples, seed=seed, reshuffle_each_iteration=False)
    return (
        dataclasses.replace(
            source, examples=shuffled.skip(held_out), num_examples=source.num_examples - held_out
        ),
        dataclasses.replace(source, examples=shuffled.take(held_out), num_examples=held_out),
    )
