"""Labelled image sources (tf.data): image folders, TFRecords, TFDS.

A source lists examples cheaply (file paths or serialized records) and loads
one as (encoded image bytes, class index); `keras_cait.training.stream` turns
a source into training batches and evaluation batches.
"""

import concurrent.futures
import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable

import numpy as np

from keras_cait.io.atomic import written_atomically
from keras_cait.images.decoder_messages import decoder_messages_dropped
from keras_cait.errors import ArgumentError, Named, listed, python_name
from keras_cait.images.evaluation_transform import (
    HEADER_BYTES,
    IMAGE_EXTENSIONS,
    IMAGE_FILE_FORMATS,
    IMAGE_FORMATS,
    decode_error_reason,
    decode_image,
    header_fault,
    is_image_file_name,
)
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
    """

    examples: tf.data.Dataset
    load: Callable
    num_examples: int
    class_names: list
    in_memory: bool = False
    folder: str | None = None
    skipped: tuple = ()

    @property
    def num_classes(self):
        return len(self.class_names)


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
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Image folder {directory!r} does not exist.")
    class_names = sorted(
        entry.name for entry in os.scandir(directory) if entry.is_dir() and not entry.name.startswith(".")
    )
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
        raise ValueError(
            f"Image folder {directory!r} has no images: expected one subfolder per class "
            f"holding {_IMAGE_FILES}, e.g. {directory}/cat/1.jpg"
            f"{_others([path for _, found in empty for path in found])}."
        )
    if empty:
        folders = listed([repr(folder) for folder, _ in empty])
        others = _others([path for _, found in empty for path in found])
        raise ValueError(
            f"The class folder {folders} holds no images ({_IMAGE_FILES}){others}; "
            "add images to it, or remove the folder."
            if len(empty) == 1 else
            f"The class folders {folders} hold no images ({_IMAGE_FILES}){others}; "
            "add images to them, or remove those folders."
        )
    examples = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    return ImageSource(
        examples,
        lambda path, label: (tf.io.read_file(path), label),
        len(paths),
        class_names,
        in_memory=True,
        folder=directory,
        skipped=tuple(skipped),
    )


def _others(paths):
    """`, only files of other formats: a.tiff, b.heic` where a folder holds those, else ``."""
    return f", only files of other formats: {listed(paths)}" if paths else ""


def skipped_files(what, source):
    """The sentence that says which files of an image folder are not read (their extension is
    none of the list), naming them (the first 10) and counting them; None where none is."""
    skipped = list(getattr(source, "skipped", ()))
    if not skipped:
        return None
    count = f"{len(skipped)} files are" if len(skipped) > 1 else "1 file is"
    return (f"{what}: {count} not read, for an extension other than {', '.join(IMAGE_EXTENSIONS)} "
            f"({IMAGE_FORMATS}): {listed(skipped, 10)}. Convert them to one of those formats to use them, "
            "or move them out of the class folders.")


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
    ImageNet TFRecords. Shards are written to a temporary name and renamed.
    """
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
        return tfrecords(spec[len("tfrecord:"):], class_names)
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
    if not 0 < fraction < 1:
        raise ArgumentError("fraction", fraction, "must be above 0 and below 1", ["e.g. ", Named("fraction", 0.1)])
    held_out = max(1, round(source.num_examples * fraction))
    if held_out >= source.num_examples:
        raise ValueError(f"Cannot hold out {fraction:.0%} of {source.num_examples} examples.")
    labelled = _paths_and_labels(source)
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
        raise ValueError(f"Cannot hold out {fraction:.0%} of {source.num_examples} examples and keep an "
                         f"example of each of the {classes} classes to train on.")
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


def _paths_and_labels(source):
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
    labelled = _paths_and_labels(source)
    if labelled is None:
        return None
    return np.bincount(labelled[1], minlength=source.num_classes).tolist()


# === Which examples cannot be decoded: before a run, and after a decode failure ===

# How many undecodable files a message names (the rest are counted).
BAD_IMAGES_SHOWN = 5
# The decode pass of `check_images`: at least this many images, then until this many seconds.
CHECK_DECODES_AT_LEAST = 256
CHECK_SECONDS = 5.0
# Bytes of a file's end that tell whether it is complete (`_looks_complete`).
_TAIL = 16


@dataclasses.dataclass(frozen=True)
class Undecodable:
    """An example that cannot be decoded: `name`, its path (image folders) or `record N` (its
    position in the source's order, from 0); `reason`, why, in a few words."""

    name: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ImageCheck:
    """What `check_images` found: the `undecodable` examples, how many examples were `decoded`
    of the `total`, and the `seconds` the check took."""

    undecodable: list
    decoded: int
    total: int
    seconds: float
    files: bool = True

    @property
    def complete(self):
        return self.decoded >= self.total

    def said(self):
        """What was checked, in words: `the first and last bytes of its 1,281,167 files read, 2,304
        of them decoded in 5.1 s; the others are decoded as the run reads them.`"""
        if self.files:
            checked = f"the first and last bytes of its {self.total:,} files read, {self.decoded:,} of them"
        else:
            checked = f"{self.decoded:,} of its {self.total:,} records"
        return f"{checked} decoded in {self.seconds:.1f} s; the others are decoded as the run reads them."


def _file_paths(source):
    """The file paths of a source whose examples are `(path, label)` (an image folder, or a split
    of one); None for records."""
    labelled = _paths_and_labels(source)
    return None if labelled is None else [os.fsdecode(path) for path in labelled[0]]


def _looks_complete(head, tail, size):
    """Whether a file of a listed format ends as a whole file of its format does (a JPEG's EOI
    marker, a PNG's IEND chunk, a GIF's trailer, the sizes a BMP's and a WebP's headers declare).
    A file that does not is decoded first by `check_images`: a truncated copy looks like this."""
    name = next(known.name for known in IMAGE_FILE_FORMATS if known.matches(head))
    if name == "JPEG":
        return tail.rstrip(b"\x00").endswith(b"\xff\xd9")
    if name == "PNG":
        return tail.endswith(b"IEND\xaeB`\x82")
    if name == "GIF":
        return tail.rstrip(b"\x00").endswith(b";")
    declared = int.from_bytes(head[2:6] if name == "BMP" else head[4:8], "little") + (8 if name == "WebP" else 0)
    return len(head) >= 8 and declared <= size


def _read_ends(paths):
    """`(head, complete)` of each file: its first `HEADER_BYTES` bytes and whether its last bytes
    end it as its format does (None where it cannot be read), read by a few threads."""

    def ends(chunk):
        found = []
        for path in chunk:
            try:
                with open(path, "rb") as file:
                    head = file.read(HEADER_BYTES)
                    complete = None
                    if header_fault(head) is None:
                        size = os.fstat(file.fileno()).st_size
                        file.seek(max(0, size - _TAIL))
                        complete = _looks_complete(head, file.read(_TAIL), size)
                    found.append((head, complete))
            except OSError:  # not a decoding matter: the stream reports it by its own error
                found.append(None)
        return found

    chunks = [paths[start:start + 1024] for start in range(0, len(paths), 1024)]
    with concurrent.futures.ThreadPoolExecutor(min(16, (os.cpu_count() or 1) + 4)) as pool:
        return [end for found in pool.map(ends, chunks) for end in found]


def _load(source, element):
    return source.load(*element) if isinstance(element, tuple) else source.load(element)


def _record_heads(source):
    """The first bytes of each record's image, in the source's order (every record is read)."""
    dataset = source.examples.map(
        lambda *element: tf.strings.substr(_load(source, element)[0], 0, HEADER_BYTES),
        num_parallel_calls=tf.data.AUTOTUNE)
    return [head for batch in dataset.batch(4096) for head in batch.numpy()]


def _decode_fault(encoded):
    """Why `encoded` fails the decode of the training and evaluation streams, or None."""
    fault = header_fault(encoded[:HEADER_BYTES])
    if fault is not None:
        return fault
    try:
        decode_image(tf.constant(encoded))
    except tf.errors.InvalidArgumentError as error:
        return decode_error_reason(error.message)
    return None


PASSES = ("headers", "decode")


def find_undecodable(source, limit=None, passes=PASSES):
    """The examples of `source` that the training and evaluation streams cannot decode.

    What a run searches (`undecodable_named`) after it failed on a decode error that the check before
    it (`check_images`) did not reach (TensorFlow's message names no file). Two passes,
    the second only where the first finds nothing:

    1. "headers": the first bytes of every example against the formats that are read
       (`keras_cait.images.evaluation_transform.IMAGE_FILE_FORMATS`): a text file named `.jpg`,
       an empty file, a TIFF, an animated WebP. An image folder reads the ends of each
       file (`check_images` gives the cost); TFRecords and TFDS read every record;
    2. "decode": the decode the streams use (`keras_cait.images.evaluation_transform.
       decode_image`) of every example, in parallel: a truncated or damaged file,
       an image over the pixel limit. It stops once `limit` examples are found.

    Args:
        source: an `ImageSource`.
        limit: at most this many examples from the decode pass (None: all).
            The first pass reports every example it finds.
        passes: the passes to make, e.g. `("headers",)` for the cheap one alone.

    Returns:
        a list of `Undecodable(name, reason)` in the source's order: file paths
        for an image folder (or a split of one), `record N` for TFRecords and TFDS.
        Empty when every example decodes.
    """
    unknown = set(passes) - set(PASSES)
    if unknown:
        raise ValueError(f"passes={tuple(passes)!r}: each must be one of {PASSES}.")
    paths = _file_paths(source)
    names = paths if paths is not None else [f"record {index}" for index in range(source.num_examples)]
    if "headers" in passes:
        if paths is not None:
            heads = [end[0] if end is not None else None for end in _read_ends(paths)]
        else:
            heads = _record_heads(source)
            if len(heads) != len(names):
                names = [f"record {index}" for index in range(len(heads))]
        found = [Undecodable(name, fault) for name, head in zip(names, heads)
                 if head is not None and (fault := header_fault(head)) is not None]
        if found:
            return found
    if "decode" in passes:
        return _decode_pass(source, names, limit)[0]
    return []


def check_images(source, seconds=CHECK_SECONDS, at_least=CHECK_DECODES_AT_LEAST):
    """The check of a run's data before it trains: the examples that cannot be decoded, all at once.

    An image folder (or a split of one): the first and last bytes of every file
    (`find_undecodable`'s header pass, and whether the file ends as its format does),
    then the decode of the files whose header passes, those that do not end as they
    should (a truncated copy) first, then the others in the folder's order: at least
    `at_least` files, then as many as `seconds` allow. A folder of up to a few thousand
    small images is decoded whole; of a larger one, every file's ends are read and the
    rest of its images are decoded as the run reads them (a decode error there is
    named by the run, `undecodable_named`). TFRecords and TFDS:
    the records' decode, from the first, as bounded. The decoders' own messages are
    kept off standard error (`keras_cait.images.decoder_messages`).

    Returns:
        an `ImageCheck`: the undecodable examples in the source's order (all of them
        where `complete`), how many of `total` examples were decoded, and the seconds.
    """
    start = time.monotonic()
    paths = _file_paths(source)
    if paths is None:
        names = [f"record {index}" for index in range(source.num_examples)]
        found, decoded = _decode_pass(source, names, None, seconds, at_least)
        return ImageCheck(found, decoded, source.num_examples, time.monotonic() - start, files=False)
    ends = _read_ends(paths)
    faults = {index: Undecodable(path, fault) for index, (path, end) in enumerate(zip(paths, ends))
              if end is not None and (fault := header_fault(end[0])) is not None}
    readable = [index for index, end in enumerate(ends) if end is not None and index not in faults]
    ordered = sorted(readable, key=lambda index: ends[index][1])  # False (not complete) first
    candidates = dataclasses.replace(
        source, examples=tf.data.Dataset.from_tensor_slices(
            ([paths[index] for index in ordered], tf.zeros([len(ordered)], tf.int32))),
        num_examples=len(ordered))
    left = max(0.0, seconds - (time.monotonic() - start))
    found, decoded = _decode_pass(candidates, [paths[index] for index in ordered], None, left, at_least)
    position = {path: index for index, path in enumerate(paths)}
    found = sorted([*faults.values(), *found], key=lambda undecodable: position[undecodable.name])
    unreadable = sum(end is None for end in ends)  # the stream names those itself (an OSError)
    return ImageCheck(found, len(faults) + decoded + unreadable, len(paths), time.monotonic() - start)


def _decode_pass(source, names, limit, seconds=None, at_least=0):
    """`(undecodable, examined)`: decodes the examples in order, those whose decode fails being the
    gaps in the indices that come out (`ignore_errors` drops them), read once more, together, and
    decoded one by one for the reason. Stops once `limit` are found, or, with `seconds`, once at
    least `at_least` examples are examined and `seconds` have passed."""

    def decodes(index, element):
        image = decode_image(_load(source, element)[0])
        return index, tf.shape(image)[0]

    start = None  # the time is counted from the first batch: building the pipeline is not decoding
    decoded = (source.examples.enumerate()
               .map(decodes, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
               .ignore_errors()
               .map(lambda index, _: index)
               .batch(32))
    failed, expected = [], 0
    with decoder_messages_dropped():
        for batch in decoded:
            for index in batch.numpy().tolist():
                failed.extend(range(expected, index))
                expected = index + 1
            if limit is not None and len(failed) >= limit:
                break
            start = time.monotonic() if start is None else start
            if seconds is not None and expected >= at_least and time.monotonic() - start > seconds:
                break
        else:  # the examples after the last one decoded failed too
            failed.extend(range(expected, len(names)))
            expected = max(expected, len(names))
        found = _refused(source, names, failed[:limit] if limit is not None else failed)
    return found, expected


def _refused(source, names, indices):
    """`Undecodable`s of the examples at `indices` whose decode fails again, with the reason."""
    if not indices:
        return []
    wanted = tf.constant(indices, tf.int64)
    elements = source.examples.enumerate().filter(lambda index, _: tf.reduce_any(tf.equal(index, wanted)))
    found = []
    for index, element in elements:
        index = int(index)
        try:
            encoded = _load(source, element)[0].numpy()
        except tf.errors.OpError:  # unreadable, not undecodable: not this function's to report
            continue
        reason = _decode_fault(encoded)
        if reason is not None:
            found.append(Undecodable(names[index] if index < len(names) else f"record {index}", reason))
    return found


def undecodable_message(found, complete=True):
    """The message naming the undecodable examples, `found` ({what: [Undecodable]}, `what` the
    argument and its value: `data='photos'`, or a flag: `--data photos`), the first's named, the
    others' counted; `complete`: whether every example was searched (else "at least N"):

        data='photos': photos/cat/x.jpg cannot be decoded as an image (JPEG, PNG, GIF, BMP or
        WebP): not an image file; remove or replace it.
    """
    (what, bad), *others = found.items()
    bad = sorted(bad, key=lambda undecodable: undecodable.name)
    records = bad[0].name.startswith("record ")
    several = len(bad) > 1 or bool(others)
    if not records:
        advice = "remove or replace them" if several else "remove or replace it"
    elif "tfds:" in what:
        advice = "prepare the dataset again (tfds build): its files are damaged"
    else:
        advice = ("write the TFRecords again without them, or with the images replaced" if several
                  else "write the TFRecords again without it, or with the image replaced")
    where = " (counting from 0 in the source's order)" if records else ""
    elsewhere = "".join(f" (and {_count(len(more), complete)} in {flag}: {_names(more, reasons=False)})"
                        for flag, more in others)
    if len(bad) == 1:
        return (f"{what}: {bad[0].name}{where} cannot be decoded as an image ({IMAGE_FORMATS}): "
                f"{bad[0].reason}{elsewhere}; {advice}.")
    kind = "records" if records else "files"
    return (f"{what}: {_count(len(bad), complete)} {kind}{where} cannot be decoded as images "
            f"({IMAGE_FORMATS}): {_names(bad)}{elsewhere}; {advice}.")


def undecodable_error(found, complete=True, error_type=ArgumentError):
    """The error naming the undecodable examples, `found` ({argument: (value, [Undecodable])}:
    `data` and `val_data` of a run, `value` what it was given), the first argument's files named,
    the others' counted; `complete`: whether every example was searched (else "at least N"):

        data='photos': photos/cat/x.jpg cannot be decoded as an image (JPEG, PNG, GIF, BMP or
        WebP): not an image file; remove or replace it

    `error_type`: an `ArgumentError` (e.g. the run's `RunError`), raised by the caller.
    """
    (argument, (value, bad)), *others = found.items()
    bad = sorted(bad, key=lambda undecodable: undecodable.name)
    records = bad[0].name.startswith("record ")
    several = len(bad) > 1 or bool(others)
    if not records:
        advice = "remove or replace them" if several else "remove or replace it"
    elif str(value).startswith("tfds:"):
        advice = "prepare the dataset again (tfds build): its files are damaged"
    else:
        advice = ("write the TFRecords again without them, or with the images replaced" if several
                  else "write the TFRecords again without it, or with the image replaced")
    where = " (counting from 0 in the source's order)" if records else ""
    elsewhere = [part for other, (other_value, more) in others
                 for part in (f" (and {_count(len(more), complete)} in ", _named(other, other_value), ": ",
                              _names(more, reasons=False), ")")]
    if len(bad) == 1:
        problem = [f"{bad[0].name}{where} cannot be decoded as an image ({IMAGE_FORMATS}): {bad[0].reason}",
                   *elsewhere]
    else:
        kind = "records" if records else "files"
        problem = [f"{_count(len(bad), complete)} {kind}{where} cannot be decoded as images ({IMAGE_FORMATS}): "
                   f"{_names(bad)}", *elsewhere]
    shown = "<ImageSource>" if isinstance(value, ImageSource) else None
    return error_type(argument, _plain(value), problem, advice, shown=shown)


def _plain(value):
    """A run's data as an error holds it: a path as a string, an `ImageSource` as it is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _named(argument, value):
    return Named(argument, _plain(value), "<ImageSource>" if isinstance(value, ImageSource) else None)


# TensorFlow's image decoders (op and node names) and their messages; the pixel limit's
# assertion (`keras_cait.images.evaluation_transform.decode_image`).
_DECODE_ERROR = re.compile(
    r"\b(Decode(Image|Jpeg|AndCropJpeg|Png|Gif|Bmp|WebP)|ExtractJpegShape)\b|Unknown image file format"
    r"|Invalid (JPEG|PNG|GIF) data|Invalid PNG|pixels; at most [\d,]+ are decoded"
)
# The search after a decode error stops after this many undecodable examples are found.
BAD_IMAGES_SEARCHED = 20


def is_decode_error(error):
    """Whether `error` is TensorFlow's failure to decode an image (its message names no file)."""
    return isinstance(error, tf.errors.InvalidArgumentError) and bool(_DECODE_ERROR.search(error.message))


@contextlib.contextmanager
def undecodable_named(named, error_type=ArgumentError):
    """Turns TensorFlow's failure to decode an image while a run reads its data (its message names
    the op, not the file) into `error_type` naming the file(s), as `undecodable_error` writes it.

    `named`: `(argument, value, source)` of each kind of data the run reads (`("data", "photos",
    train)`, `("val_data", None, validation)`; a source None is skipped, a split of `data` goes
    under `data`). The runs check their data before they train (`check_images`), but of a large
    folder they decode only what a few seconds allow; this is the net behind that check: the
    sources are searched (`find_undecodable`, the header pass of every source first, then the
    decode pass, stopping after `BAD_IMAGES_SEARCHED`) only once the body failed. Any other error,
    or a decode error whose image no search finds, passes through unchanged.
    """
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        if not is_decode_error(error):
            raise
        try:
            found = _search(named)
        except Exception:  # the search itself failed: TensorFlow's error is all there is
            found = None
        if found is None:
            raise
        raise undecodable_error(*found, error_type=error_type) from error


def _search(named):
    """`(found, complete)` for `undecodable_error` of the `(argument, value, source)` triples, or None."""
    named = [(argument, value, source) for argument, value, source in named if source is not None]
    if not named:
        return None
    shown = " and ".join(dict.fromkeys(python_name(_named(argument, value)) for argument, value, _ in named))
    print(f"An image of {shown} cannot be decoded; looking for it...", flush=True)
    for passes in (("headers",), ("decode",)):
        found = {}
        for argument, value, source in named:
            left = None if passes == ("headers",) else BAD_IMAGES_SEARCHED - sum(
                len(bad) for _, bad in found.values())
            if left is None or left > 0:
                found.setdefault(argument, (value, []))[1].extend(find_undecodable(source, limit=left, passes=passes))
        found = {argument: (value, bad) for argument, (value, bad) in found.items() if bad}
        if found:
            searched = sum(len(bad) for _, bad in found.values())
            return found, passes == ("headers",) or searched < BAD_IMAGES_SEARCHED
    return None


def _names(bad, reasons=True):
    """`a.jpg (reason), b.jpg (reason) and 3 more`: the first `BAD_IMAGES_SHOWN`, sorted."""
    bad = sorted(bad, key=lambda undecodable: undecodable.name)
    return listed([f"{undecodable.name} ({undecodable.reason})" if reasons else undecodable.name
                    for undecodable in bad], BAD_IMAGES_SHOWN)


def _count(count, complete):
    return str(count) if complete else f"at least {count}"
