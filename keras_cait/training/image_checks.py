"""Which examples of a labelled image source cannot be decoded: checked before a run, searched
after a decode failure, and said in one message.

- `check_images(source)`, once the data are listed and before a model is built or a file
  written: the first and last bytes of every file, then the streams' own decode of as many
  images as a bounded time allows, those that end early first (`ImageCheck`).
- `find_undecodable(source)`: the search behind it, every example's first bytes, then a decode
  of each where those find nothing (`Undecodable`: its name and why).
- `undecodable_named(named)`, around `fit` and `evaluate`: a decode error that a check did not
  reach becomes the error naming the file and the argument that gave it (`undecodable_error`).
"""

import concurrent.futures
import contextlib
import dataclasses
import os
import re
import time

from keras_cait.errors import ArgumentError, Named, listed, python_name, quietly_caused
from keras_cait.images.decoder_messages import decoder_messages_dropped
from keras_cait.images.evaluation_transform import (
    HEADER_BYTES,
    IMAGE_FILE_FORMATS,
    IMAGE_FORMATS,
    decode_error_reason,
    decode_image,
    header_fault,
)
from keras_cait.io.stderr import load_tensorflow
from keras_cait.training.sources import NOT_AN_IMAGE, ImageSource, paths_and_labels

tf = load_tensorflow()

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
    labelled = paths_and_labels(source)
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
    r"|Invalid (JPEG|PNG|GIF) data|Invalid PNG|pixels; at most [\d,]+ are decoded|" + re.escape(NOT_AN_IMAGE)
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
        raise quietly_caused(undecodable_error(*found, error_type=error_type), error) from None


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
