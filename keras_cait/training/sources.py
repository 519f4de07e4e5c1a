"""Labelled image sources (tf.data): image folders, TFRecords, TFDS.

A source lists examples cheaply (file paths or serialized records) and loads
one as (encoded image bytes, class index); `keras_cait.training.stream` turns
a source into training batches and evaluation batches, and
`keras_cait.training.image_checks` finds the examples that cannot be decoded.
"""

import collections.abc
import contextlib
import dataclasses
import glob
import numbers
import os
from collections.abc import Callable

import numpy as np

from keras_cait import deprecation
from keras_cait.errors import (ArgumentError, MissingPath, Named, check_names_not_mapping, checked_count, counted,
                               listed, quietly_caused, repeated)
from keras_cait.images.evaluation_transform import (
    HEADER_BYTES, IMAGE_EXTENSIONS, IMAGE_FORMATS, has_image_signature, is_image_file_name,
)
from keras_cait.io.atomic import unwritable, written_atomically
from keras_cait.io.stderr import load_tensorflow

tf = load_tensorflow()  # on JAX or PyTorch, its first import: without TensorFlow's start-up lines

# What an image folder's class folders hold: the one list of formats (evaluation_transform).
_IMAGE_FILES = f"{IMAGE_FORMATS} files: {', '.join(IMAGE_EXTENSIONS)}"


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
        folder: the image folder it lists (None for records).
        skipped: the files of the folder's classes that are not read: their
            extension is none of `IMAGE_EXTENSIONS` (`skipped_files` says so).
        outside: the images at the top of the folder, in no class folder, not read
            (`skipped_files` says so too).
    """

    examples: tf.data.Dataset
    load: Callable
    num_examples: int
    class_names: list
    in_memory: bool = False
    folder: str | None = None
    skipped: tuple = ()
    outside: tuple = ()

    @property
    def num_classes(self):
        return len(self.class_names)


def checked_source(source, needed_by):
    """`source` of `needed_by` (`split`, the streams), which takes an `ImageSource`: a path is refused
    saying how to read it, anything else naming its type; an `ArgumentError` naming `source`."""
    if isinstance(source, ImageSource):
        return source
    if isinstance(source, (str, os.PathLike)):
        raise ArgumentError("source", os.fspath(source), f"{needed_by} takes an ImageSource, not a path",
                            ["read the folder first: keras_cait.training.sources.image_folder(",
                             repr(os.fspath(source)), ")"], usage=True)
    raise ArgumentError("source", source, f"{needed_by} takes an ImageSource, not a {type(source).__name__}",
                        "e.g. keras_cait.training.sources.image_folder('photos')", usage=True,
                        shown=f"<{type(source).__name__}>")


def image_folder(directory):
    """The images of `directory/<class name>/*.{jpg,jpeg,png,gif,bmp,webp}`, classes in sorted order.

    The layout of Keras' `image_dataset_from_directory` and torchvision's
    `ImageFolder`. Hidden folders (`.ipynb_checkpoints`, `.thumbnails`: a name
    starting with '.') are not classes, as in Keras, and are not searched for
    images. Files of other extensions (`photo.tiff`, `notes.txt`) are not read
    but kept in `skipped`, for the run to say so; hidden ones (`.DS_Store`) are
    left out without a word. A class folder without
    images is refused by name, as torchvision does: a class the model is never
    shown is a mistake, not a class.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise ArgumentError("directory", directory, f"must be the path of a folder, not {type(directory).__name__}",
                            "e.g. image_folder('photos'), photos/<class name>/*.jpg", usage=True)
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ArgumentError("directory", directory, "is a file, not a folder",
                            "give the folder that holds one subfolder per class", usage=True)
    if not os.path.isdir(directory):
        raise MissingPath("directory", directory, "no such folder", "give the folder that holds one subfolder per "
                          f"class, e.g. {os.path.join(directory, 'cat', '1.jpg')}")
    class_names = sorted(
        entry.name for entry in os.scandir(directory) if entry.is_dir() and not entry.name.startswith(".")
    )
    # Images beside the class folders belong to no class: not read, as in Keras and torchvision, but said.
    outside = sorted(entry.path for entry in os.scandir(directory) if entry.is_file()
                     and not entry.name.startswith(".") and is_image_file_name(entry.name))
    paths, labels, empty, skipped = [], [], [], []
    for index, name in enumerate(class_names):
        count, others = len(paths), len(skipped)
        for root, files in sorted(_walk(os.path.join(directory, name))):
            for file in sorted(files):
                if is_image_file_name(file):
                    paths.append(os.path.join(root, file))
                    labels.append(index)
                elif not file.startswith("."):
                    skipped.append(os.path.join(root, file))
        if len(paths) == count:
            empty.append((os.path.join(directory, name), skipped[others:]))
    if not paths:
        raise ArgumentError(
            "directory", directory,
            f"has no images: expected one subfolder per class "
            f"holding {_IMAGE_FILES}, e.g. {directory}/cat/1.jpg"
            f"{_others([path for _, found in empty for path in found])}."
        )
    if empty:
        folders = listed([repr(folder) for folder, _ in empty])
        others = _others([path for _, found in empty for path in found])
        raise ArgumentError(
            "directory", directory,
            f"The class folder {folders} holds no images ({_IMAGE_FILES}){others}; "
            "add images to it, or remove the folder."
            if len(empty) == 1 else
            f"The class folders {folders} hold no images ({_IMAGE_FILES}){others}; "
            "add images to them, or remove those folders."
        )
    examples = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    return ImageSource(
        examples,
        lambda path, label: (read_image_file(path), label),
        len(paths),
        class_names,
        in_memory=True,
        folder=directory,
        skipped=tuple(skipped),
        outside=tuple(outside),
    )


# How the streams' error names a file of an image folder that is no image (`read_image_file`).
NOT_AN_IMAGE = f"is not an image file: its first bytes are those of no {IMAGE_FORMATS} file"


def read_image_file(path):
    """The bytes of the file `path` (a string tensor), where its first bytes are those of an image
    format read; else INVALID_ARGUMENT naming the file (TensorFlow's decoders name none), so that
    a stream of one's own fails saying which file. A file that starts as an image but is cut short
    fails in the decoder: `image_checks.check_images(source)` finds those before a run."""
    encoded = tf.io.read_file(path)
    check = tf.debugging.Assert(
        has_image_signature(tf.strings.substr(encoded, 0, HEADER_BYTES)),
        [path, f"{NOT_AN_IMAGE}; keras_cait.training.image_checks.check_images(source) lists every "
               "file of a source that cannot be decoded"],
        summarize=1,
    )
    with tf.control_dependencies([check]):
        return tf.identity(encoded)


def _others(paths):
    """`, only files of other formats: a.tiff, b.heic` where a folder holds those, else ``."""
    return f", only files of other formats: {listed(paths)}" if paths else ""


def skipped_files(what, source):
    """The sentences that say which files of an image folder are not read (their extension is none
    of the list; images outside the class folders), naming them (the first 10) and counting them;
    None where none is."""
    skipped, outside = list(getattr(source, "skipped", ())), list(getattr(source, "outside", ()))
    said = []
    if skipped:
        count = f"{len(skipped)} files are" if len(skipped) > 1 else "1 file is"
        said.append(f"{what}: {count} not read, for an extension other than {', '.join(IMAGE_EXTENSIONS)} "
                    f"({IMAGE_FORMATS}): {listed(skipped, 10)}. Convert them to one of those formats to use them, "
                    "or move them out of the class folders.")
    if outside:
        count = f"{len(outside)} images are" if len(outside) > 1 else "1 image is"
        said.append(f"{what}: {count} not read, being in no class folder: {listed(outside, 10)}. Move them into "
                    "the folder of their class to use them.")
    return "\n".join(said) or None


def _walk(folder):
    """`(folder, file names)` of `folder` and its subfolders, hidden ones left out."""
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        yield root, files


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
    ImageNet TFRecords. Shards are written to a temporary name and renamed. Shards of
    `path_prefix` that are there already are refused (another count of them was left beside the
    new ones, and a glob of the prefix read every example twice).
    """
    source = checked_source(source, "write_tfrecords")
    num_shards = checked_count("num_shards", num_shards, 1, note=", the files to write")
    if not isinstance(path_prefix, (str, os.PathLike)) or not os.fspath(path_prefix) or \
            os.path.isdir(path_prefix):
        raise ArgumentError("path_prefix", path_prefix, "must be the start of the shards' paths, not "
                            + ("a folder" if isinstance(path_prefix, (str, os.PathLike)) and os.fspath(path_prefix)
                               else type(path_prefix).__name__), ["e.g. ", Named("path_prefix", "records/train")],
                            usage=True)
    path_prefix = os.fspath(path_prefix)
    there = sorted(tf.io.gfile.glob(f"{glob.escape(path_prefix)}-?????-of-?????.tfrecord"))
    if there:
        raise ArgumentError("path_prefix", path_prefix, f"has {counted(len(there), 'shard')} already "
                            f"({listed([os.path.basename(p) for p in there], 2)})",
                            "give another prefix, or delete them first", usage=True)
    problem = unwritable(os.path.dirname(os.path.abspath(path_prefix)), given=path_prefix)
    if problem:
        raise ArgumentError("path_prefix", path_prefix, *problem, usage=True)
    paths = [f"{path_prefix}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    with contextlib.ExitStack() as stack:
        partials = [stack.enter_context(written_atomically(path)) for path in paths]
        writers = [stack.enter_context(tf.io.TFRecordWriter(partial)) for partial in partials]
        for index, (encoded, label) in enumerate(source.examples.map(source.load)):
            feature = {
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded.numpy()])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            record = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[index % num_shards].write(record.SerializeToString())
    return paths


def tfrecords(files, class_names, num_examples=None):
    """Images from TFRecord files of `tf.train.Example`s (see `write_tfrecords`).

    Args:
        files: a glob pattern or a list of paths.
        class_names: the class of each index (its length is the class count).
        num_examples: the record count, or None to count them once.
    """
    check_names_not_mapping("class_names", class_names)
    if isinstance(class_names, str) or not isinstance(class_names, collections.abc.Iterable):
        raise ArgumentError("class_names", class_names, "must be a list of names, one per class index",
                            ["e.g. ", Named("class_names", ["cat", "dog"])], usage=True)
    class_names = list(class_names)
    twice = repeated(class_names)
    if twice:
        raise ArgumentError("class_names", class_names, f"repeats {listed(twice)}",
                            "give each class its own name, in the order of the indices", usage=True)
    if isinstance(files, os.PathLike):
        files = os.fspath(files)
    if not isinstance(files, str) and not (isinstance(files, collections.abc.Iterable) and all(
            isinstance(path, (str, os.PathLike)) for path in files)):
        raise ArgumentError("files", files, "must be a glob pattern or a list of paths of TFRecord files",
                            ["e.g. ", Named("files", "records/train-*")], usage=True, shown=f"<{type(files).__name__}>")
    paths = sorted(tf.io.gfile.glob(files)) if isinstance(files, str) else [os.fspath(path) for path in files]
    if not paths:
        raise MissingPath("files", files, "matches no file", "give the files of write_tfrecords, e.g. "
                          "'records/train-*'")
    for path in paths:  # a folder or a missing file failed in the first pass as a TensorFlow graph error
        if tf.io.gfile.isdir(path) or not tf.io.gfile.exists(path):  # tf.io.gfile: gs:// paths too
            raise ArgumentError("files", files, f"{path!r} is {'a folder' if tf.io.gfile.isdir(path) else 'missing'}, "
                                "not a TFRecord file", "give the files of write_tfrecords, e.g. 'records/train-*'",
                                usage=True)
    if num_examples is not None:
        num_examples = checked_count("num_examples", num_examples, 1000,
                                     note=", the records in the files (None: counted)")
    examples = tf.data.TFRecordDataset(paths)
    if num_examples is None:  # one pass that counts the records and checks their labels
        labels = examples.map(lambda record: _parse_record(record)[1])
        num_examples, low, high = (int(value) for value in labels.reduce(
            (0, 2**31 - 1, -(2**31)), lambda state, label: (state[0] + 1, tf.minimum(state[1], label),
                                                           tf.maximum(state[2], label))))
        if num_examples and (low < 0 or high >= len(class_names)):
            raise ArgumentError("class_names", class_names, f"names {len(class_names)} classes, but the records' "
                                f"labels run from {low} to {high}", f"give one name per label, {high + 1} in index "
                                "order (a label past the names was trained on as no class)", shown="[...]")
    return ImageSource(examples, _parse_record, num_examples, class_names)


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

    - `path/to/folder`: `image_folder`; `class_names`, where given, must be its classes (its
      subfolders, sorted): they are checked, never silently put aside;
    - `tfrecord:PATTERN`: `tfrecords(PATTERN, class_names)` (class names needed);
    - `tfds:NAME:SPLIT`: `tfds(NAME, SPLIT, data_dir)`, e.g. `tfds:imagenet2012:validation`.
    """
    spec = os.fspath(spec)
    if spec.startswith("tfds:"):
        name, _, split = spec[len("tfds:"):].rpartition(":")
        if not name:
            raise ValueError("a TFDS split is written tfds:NAME:SPLIT, e.g. tfds:imagenet2012:validation.")
        return tfds(name, split, data_dir)
    if spec.startswith("tfrecord:"):
        if not class_names:
            raise ArgumentError("class_names", class_names, f"{spec!r} names TFRecords, which hold class indices, "
                                "not names", ["give ", Named("class_names"), ", one name per class, in the order "
                                "of the indices"], usage=True)
        try:
            return tfrecords(spec[len("tfrecord:"):], class_names)
        except ArgumentError as error:
            if error.argument != "files":
                raise
            # The pattern is the spec's: the spec named, not tfrecords' `files`, which its caller never gave.
            raise quietly_caused(type(error)("spec", spec, error.problem, error.allowed, usage=error.usage),
                                 error) from None
    folder = image_folder(spec)
    if class_names is not None and [str(name) for name in class_names] != folder.class_names:
        raise ArgumentError(
            "class_names", list(class_names), f"the folder {spec!r} has the classes {listed(folder.class_names)}: "
            "a folder's classes are its subfolders, in sorted order",
            ["leave ", Named("class_names"), " out for a folder, or give those names in that order"], usage=True)
    return folder


def split(source, fraction, seed=0):
    """Splits an in-memory source (e.g. an image folder) into (rest, held-out `fraction`).

    The held-out examples are a seeded random choice, the same on every call. Of an
    image folder (or a split of one) the choice is stratified: each class gives about
    `fraction` of its images, and never its last one, so that every class is trained on
    (`class_counts` tells the classes of 1 image, which cannot be split).
    """
    checked_source(source, "split")
    # None drew another held-out set on every call, which the next call could train on.
    seed = checked_count("seed", seed, 0, minimum=0, note=", which chooses the same held-out set each call")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
        kind = "" if isinstance(fraction, numbers.Real) and not isinstance(fraction, bool) else \
            f", not {type(fraction).__name__}"
        raise ArgumentError("fraction", fraction, f"must be above 0 and below 1{kind}",
                            ["e.g. ", Named("fraction", 0.1)])
    held_out = max(1, round(source.num_examples * fraction))
    if held_out >= source.num_examples:
        raise ArgumentError("fraction", fraction, f"holds out all {counted(source.num_examples, 'example')}",
                            "give a smaller fraction, or more examples")
    labelled = paths_and_labels(source)
    if labelled is None:
        shuffled = source.examples.shuffle(source.num_examples, seed=seed, reshuffle_each_iteration=False)
        return (
            dataclasses.replace(
                source, examples=shuffled.skip(held_out), num_examples=source.num_examples - held_out
            ),
            dataclasses.replace(source, examples=shuffled.take(held_out), num_examples=held_out),
        )
    paths, labels = labelled
    classes = len(set(labels.tolist()))
    if held_out > source.num_examples - classes:
        raise ArgumentError("fraction", fraction, f"holds out {held_out} of {counted(source.num_examples, 'example')}"
                            f" and cannot keep one of each of the {classes} classes to train on",
                            "give a smaller fraction, or more examples of each class")
    rank = np.random.default_rng(seed).permutation(source.num_examples)  # a random order of the examples
    # In that order the k-th of a class of n examples gets the key (k + 1/2) / n (its last: never held
    # out); the smallest keys, ties broken by the order, hold out about as much of each class.
    key = np.empty(source.num_examples)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[np.argsort(rank[members])]
        key[members] = (np.arange(len(members)) + 0.5) / len(members)
        key[members[-1]] = np.inf
    order = np.lexsort((rank, key))
    rest = order[held_out:][np.argsort(rank[order[held_out:]])]  # in the random order
    return tuple(
        dataclasses.replace(source, examples=tf.data.Dataset.from_tensor_slices((paths[part], labels[part])),
                            num_examples=len(part))
        for part in (rest, order[:held_out])
    )


def paths_and_labels(source):
    """`(paths, labels)` numpy arrays of a source whose examples are `(path, label)` in memory (an
    image folder, or a split of one); None for records."""
    spec = source.examples.element_spec
    if not (source.in_memory and isinstance(spec, tuple) and len(spec) == 2
            and spec[0].dtype == tf.string and spec[0].shape.rank == 0):
        return None
    batches = [(paths.numpy(), labels.numpy()) for paths, labels in source.examples.batch(1 << 16)]
    if not batches:
        return np.array([], object), np.array([], np.int32)
    return (np.concatenate([paths for paths, _ in batches]),
            np.concatenate([labels for _, labels in batches]).astype(np.int32))


def class_counts(source):
    """The number of examples of each class of an image folder (or a split of one), in label
    order; None for records (counting them would read them all)."""
    labelled = paths_and_labels(source)
    if labelled is None:
        return None
    return np.bincount(labelled[1], minlength=source.num_classes).tolist()


__getattr__ = deprecation.moved_names(__name__)  # the image checks, now in `image_checks`
