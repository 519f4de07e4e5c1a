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
from collections.abc import Callable

import tensorflow as tf

from keras_cait.atomic import written_atomically
from keras_cait.evaluation_transform import MAX_PIXELS, decode_image

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
    `ImageFolder`. Hidden folders (`.ipynb_checkpoints`, `.thumbnails`: a name
    starting with '.') are not classes, as in Keras, and are not searched for
    images. A class folder without images is refused by name, as torchvision
    does: a class the model is never shown is a mistake, not a class.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Image folder {directory!r} does not exist.")
    class_names = sorted(
        entry.name for entry in os.scandir(directory) if entry.is_dir() and not entry.name.startswith(".")
    )
    paths, labels, empty = [], [], []
    for index, name in enumerate(class_names):
        count = len(paths)
        for root, files in sorted(_walk(os.path.join(directory, name))):
            for file in sorted(files):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(root, file))
                    labels.append(index)
        if len(paths) == count:
            empty.append(os.path.join(directory, name))
    if not paths:
        raise ValueError(
            f"Image folder {directory!r} has no images: expected one subfolder per class "
            f"holding {', '.join(IMAGE_EXTENSIONS)} files, e.g. {directory}/cat/1.jpg."
        )
    if empty:
        folders = ", ".join(repr(folder) for folder in empty[:5])
        folders += f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise ValueError(
            f"The class folder {folders} holds no images ({', '.join(IMAGE_EXTENSIONS)} files); "
            "add images to it, or remove the folder."
            if len(empty) == 1 else
            f"The class folders {folders} hold no images ({', '.join(IMAGE_EXTENSIONS)} files); "
            "add images to them, or remove those folders."
        )
    examples = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    return ImageSource(
        examples,
        lambda path, label: (tf.io.read_file(path), label),
        len(paths),
        class_names,
        in_memory=True,
    )


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


# === After a decode failure: which examples cannot be decoded ===

# The first bytes of the formats TensorFlow's image decoders take (what `tf.io.decode_image`
# classifies a file by); a file that starts with none of them fails to decode whatever follows.
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF8", b"BM", b"\xff\x0a",
          b"\x00\x00\x00\x0cJXL \r\n\x87\n")
_HEAD = 16
_NOT_AN_IMAGE = "not an image file"
_EMPTY = "an empty file"


@dataclasses.dataclass(frozen=True)
class Undecodable:
    """An example that cannot be decoded: `name`, its path (image folders) or `record N` (its
    position in the source's order, from 0); `reason`, why, in a few words."""

    name: str
    reason: str


def _header_fault(head):
    """Why bytes starting with `head` cannot be an image, or None where they may be one."""
    if not head:
        return _EMPTY
    if head.startswith(_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return None
    return _NOT_AN_IMAGE


def _file_paths(source):
    """The file paths of a source whose examples are `(path, label)` (an image folder, or a split
    of one); None for records."""
    spec = source.examples.element_spec
    if not (source.in_memory and isinstance(spec, tuple) and len(spec) == 2
            and spec[0].dtype == tf.string and spec[0].shape.rank == 0):
        return None
    return [os.fsdecode(path) for batch in source.examples.map(lambda path, _: path).batch(1 << 16)
            for path in batch.numpy()]


def _read_heads(paths):
    """The first bytes of each file (None where it cannot be read), read by a few threads."""

    def heads(chunk):
        found = []
        for path in chunk:
            try:
                with open(path, "rb") as file:
                    found.append(file.read(_HEAD))
            except OSError:  # not a decoding matter: the stream reports it by its own error
                found.append(None)
        return found

    chunks = [paths[start:start + 1024] for start in range(0, len(paths), 1024)]
    with concurrent.futures.ThreadPoolExecutor(min(16, (os.cpu_count() or 1) + 4)) as pool:
        return [head for found in pool.map(heads, chunks) for head in found]


def _load(source, element):
    return source.load(*element) if isinstance(element, tuple) else source.load(element)


def _record_heads(source):
    """The first bytes of each record's image, in the source's order (every record is read)."""
    dataset = source.examples.map(lambda *element: tf.strings.substr(_load(source, element)[0], 0, _HEAD),
                                  num_parallel_calls=tf.data.AUTOTUNE)
    return [head for batch in dataset.batch(4096) for head in batch.numpy()]


def _decode_fault(encoded):
    """Why `encoded` fails the decode of the training and evaluation streams, or None."""
    try:
        decode_image(tf.constant(encoded))
    except tf.errors.InvalidArgumentError as error:
        return _reason(error.message)
    return None


def _reason(message):
    """TensorFlow's decode error, in a few words: `jpeg::Uncompress failed. Invalid JPEG data or crop
    window.` -> `Invalid JPEG data or crop window`; the pixel limit's assertion -> `WxH pixels, ...`."""
    too_large = re.search(r"The image is (.*?) pixels;", message)
    if too_large:
        return (f"{too_large.group(1)} pixels, more than the {MAX_PIXELS:,} that are decoded "
                "(PIL's decompression-bomb limit)")
    message = re.sub(r"\{\{function_node [^}]*\}\}", "", message)
    message = re.sub(r"\s*\[Op:\w+\].*", "", message).strip().splitlines()
    reason = message[0].strip().rstrip(".") if message else ""
    if "Invalid JPEG data" in reason:  # "... or crop window": the full decode has none
        return "invalid JPEG data (a truncated or damaged file)"
    return reason or "a decoder error"


PASSES = ("headers", "decode")


def find_undecodable(source, limit=None, passes=PASSES):
    """The examples of `source` that the training and evaluation streams cannot decode.

    Meant for after a run failed on a decode error (TensorFlow's message names no
    file): nothing is checked before training, which would cost a decode of every
    image. Two passes, the second only where the first finds nothing:

    1. "headers": the first bytes of every example against the formats TensorFlow
       decodes (JPEG, PNG, GIF, BMP, WebP, JPEG XL): a text file named `.jpg`, an
       empty file. An image folder reads 16 bytes of each file (about 3 s per
       100,000 files on a 2-core machine, page cache warm); TFRecords and TFDS
       read every record;
    2. "decode": the decode the streams use (`keras_cait.evaluation_transform.
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
        heads = _read_heads(paths) if paths is not None else _record_heads(source)
        if paths is None and len(heads) != len(names):
            names = [f"record {index}" for index in range(len(heads))]
        found = [Undecodable(name, fault) for name, head in zip(names, heads)
                 if head is not None and (fault := _header_fault(head)) is not None]
        if found:
            return found
    if "decode" in passes:
        return _decode_pass(source, names, limit)
    return []


def _decode_pass(source, names, limit):
    """Decodes every example; those whose decode fails are the gaps in the indices that come out
    (`ignore_errors` drops them), then read once more, together, and decoded one by one for the
    reason."""

    def decodes(index, element):
        image = decode_image(_load(source, element)[0])
        return index, tf.shape(image)[0]

    decoded = (source.examples.enumerate()
               .map(decodes, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
               .ignore_errors()
               .map(lambda index, _: index)
               .batch(1024))
    failed, expected = [], 0
    for batch in decoded:
        for index in batch.numpy().tolist():
            failed.extend(range(expected, index))
            expected = index + 1
        if limit is not None and len(failed) >= limit:
            break
    else:
        failed.extend(range(expected, max(expected, len(names))))
    return _refused(source, names, failed[:limit] if limit is not None else failed)


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
