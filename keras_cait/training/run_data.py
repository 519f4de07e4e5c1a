"""The data a run reads, and their checks: the sources opened, their images checked, the validation split.

Once listed, before a model is built or a file written, the images are checked
(`image_checks.check_images`: every file's first and last bytes, a decode bounded in time) and every
one that cannot be decoded is named; files of other formats in the class folders are said by
name; a class of 1 image is refused where a validation fraction is held out.
"""

import dataclasses
import hashlib
import numbers
import os

import keras
import numpy

from keras_cait.errors import Named, in_callers_words
from keras_cait.errors import listed
from keras_cait.training import image_checks, sources
from keras_cait.training.run_errors import RunError, about


@dataclasses.dataclass
class Data:
    """The sources of a run, and its training data as the run record keeps them (`spec`)."""

    train: sources.ImageSource
    validation: sources.ImageSource | None
    spec: str
    named: tuple = ()  # (argument, value as given, source) of each: the files a decode error names


def given(value):
    """A value as the run record keeps it: a path absolute where it exists (tfrecord:/tfds: as
    given), a name or JSON as given, a source or a model by what it is."""
    if isinstance(value, (str, os.PathLike)):
        value = os.fspath(value)
        return value if ":" in value or not os.path.exists(value) else os.path.abspath(value)
    if isinstance(value, sources.ImageSource):
        return recorded_source(value)
    if isinstance(value, keras.Model):
        return recorded_model(value)
    return value


def recorded_model(model):
    """A Keras model as run.json keeps it: by its name and a digest of its weights, so that a rerun
    given another model is told from one given the same (each was "<model NAME>", and another model of
    that name resumed the run from the first one's backup, or was handed its result)."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.path.encode())
        digest.update(numpy.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return f"<model {model.name}, weights {digest.hexdigest()[:16]}>"


def recorded_source(source):
    """An `ImageSource` as run.json keeps it: by its images, classes and folder, so that a rerun given
    another source is told from one given the same (each was "<ImageSource>", and another source
    resumed the run as if it were the same)."""
    names = ", ".join(source.class_names) if len(source.class_names) <= 5 else \
        f"{', '.join(source.class_names[:5])}, ..."
    folder = f" in {os.path.abspath(source.folder)}" if source.folder else ""
    return f"<ImageSource of {source.num_examples} images, {source.num_classes} classes ({names}){folder}>"


def shown(data):
    """`data` as a message names it: the path or spec as given."""
    return "<ImageSource>" if isinstance(data, sources.ImageSource) else os.fspath(data)


def check_tfds_dir(tfds_dir, data, val_data=None):
    """`tfds_dir` refused where no data of the run is a TFDS split: it was ignored without a word."""
    specs = [spec for spec in (data, val_data) if isinstance(spec, (str, os.PathLike))]
    if tfds_dir is not None and not any(os.fspath(spec).startswith("tfds:") for spec in specs):
        raise RunError("tfds_dir", tfds_dir, ["applies to TensorFlow Datasets' splits (", Named("data", shown=
                       "'tfds:NAME:SPLIT'"), "), and the run reads none"], ["leave ", Named("tfds_dir"), " out"],
                       usage=True)


def check_data(argument, data):
    """`data` (or `val_data`) of a run, checked before anything is read or said: a path or spec, or
    an `ImageSource`; a tf.data.Dataset or arrays, what `model.fit` takes, are refused naming it."""
    if isinstance(data, (str, os.PathLike, sources.ImageSource)):
        return
    kind = type(data).__name__
    raise RunError(argument, data, f"a run reads images from files, not from a {kind}",
                   "give a folder of class subfolders, 'tfrecord:PATTERN', 'tfds:NAME:SPLIT' or a "
                   "keras_cait.training.sources.ImageSource; a tf.data.Dataset or arrays of your own train "
                   "with model.fit (the README's 'Fine-tune with model.fit')", usage=True, shown=f"<{kind}>")


def open_source(argument, data, class_names, tfds_dir):
    """The source of `data`; the files of its class folders that are not read, said."""
    if isinstance(data, sources.ImageSource):
        return data
    check_data(argument, data)
    with about(argument, os.fspath(data), ValueError, ImportError, FileNotFoundError):
        source = sources.source(data, class_names, tfds_dir)
    # `data='photos'` from Python, `--data photos` from the command line
    skipped = sources.skipped_files(in_callers_words(Named(argument, shown(data))), source)
    if skipped:
        print(skipped, flush=True)
    return source


def open_data(data, val_data, val_fraction, class_names, tfds_dir, seed):
    """The sources of a run, their images checked (`check_images`), and `val_fraction` of `data`
    held out where `val_data` is not given."""
    train = open_source("data", data, class_names, tfds_dir)
    check_classes("data", data, train)
    validation = None if val_data is None else open_source("val_data", val_data, class_names, tfds_dir)
    check_images({"data": (data, train), "val_data": (val_data, validation)})
    if validation is not None:
        _check_same_classes(val_data, validation, data, train)
        return Data(train, validation, given(data), (("data", data, train), ("val_data", val_data, validation)))
    if val_fraction:
        _check_classes_can_be_split(data, train, val_fraction)
        with about("val_fraction", val_fraction, ValueError):
            train, validation = sources.split(train, val_fraction, seed=seed)
        return Data(train, validation, given(data), (("data", data, train), ("data", data, validation)))
    return Data(train, None, given(data), (("data", data, train),))


def check_images(named):
    """Refuses the data whose images cannot be decoded (`image_checks.check_images`), naming every one
    found in one `RunError`, before any model is built or file written; `named`: {argument:
    (value, source or None)}. Says so where a large folder was decoded only in part."""
    found, complete = {}, True
    for argument, (value, source) in named.items():
        if source is None:
            continue
        what = f"{argument}={shown(value)!r}"
        check = image_checks.check_images(source)
        if not check.complete:
            print(f"{what}: {check.said()}", flush=True)
        complete = complete and check.complete
        if check.undecodable:
            found[what] = (argument, value, check.undecodable)
    if not found:
        return
    for what, (_, _, bad) in found.items():
        if len(bad) > image_checks.BAD_IMAGES_SHOWN:  # the message names the first; here are all
            print(f"{what}: the {len(bad)} files that cannot be decoded:", flush=True)
            for undecodable in bad:
                print(f"  {undecodable.name} ({undecodable.reason})", flush=True)
    raise image_checks.undecodable_error({argument: (value, bad) for argument, value, bad in found.values()},
                                         complete, RunError)


def _check_classes_can_be_split(data, source, val_fraction):
    """A class of 1 image cannot give an image to validation and keep one to train on: refused by name."""
    counts = sources.class_counts(source)
    if counts is None or source.folder is None:
        return
    alone = [os.path.join(source.folder, str(name)) for name, count in zip(source.class_names, counts)
             if count < 2]
    if not alone:
        return
    folders = listed(map(repr, alone))
    which = f"the class folder {folders} holds" if len(alone) == 1 else f"the class folders {folders} hold"
    raise RunError(
        "data", _plain(data),
        [f"{which} 1 image, but ", Named("val_fraction", val_fraction), " holds a part of each class out for "
         "validation, and 1 image cannot be both trained on and validated: each class needs at least 2 images"],
        ["add images, or give ", Named("val_fraction", 0), " (no validation) or ", Named("val_data", shown="FOLDER"),
         " (validation images of their own)"], shown=_shown_as(data))


def validation_fraction(val_data, val_fraction):
    """`val_fraction` as the run holds it out: 0.1 when neither is given, none with `val_data`."""
    check_val_fraction(val_fraction)
    if val_data is None:
        return 0.1 if val_fraction is None else val_fraction
    if val_fraction is not None:
        raise RunError(
            "val_fraction", val_fraction, ["not with ", Named("val_data", _plain(val_data), _shown_as(val_data)),
                                           ", whose images validate: no part of data is held out"],
            "give one of them", usage=True)
    return None


def check_val_fraction(val_fraction):
    """`val_fraction` (None: the default) holds out a part of the data: at least 0 and below 1."""
    if val_fraction is None:
        return
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise RunError("val_fraction", val_fraction, f"must be a number, not {type(val_fraction).__name__}",
                       ["e.g. ", Named("val_fraction", 0.1), " (0: no validation)"], usage=True)
    if not 0 <= val_fraction < 1:
        raise RunError("val_fraction", val_fraction, "must be at least 0 and below 1: the part of data held out "
                       "for validation", ["e.g. ", Named("val_fraction", 0.1), " (0: no validation)"], usage=True)


def _check_same_classes(val_data, validation, data, train):
    """Validation data of other classes (or in another order) would be scored against the wrong
    indices, and best.keras picked on that: refused before anything is written."""
    if list(validation.class_names) == list(train.class_names):
        return
    raise RunError("val_data", _plain(val_data), [f"has the classes {listed(validation.class_names)} but ",
                   Named("data", given(data)), f" has {listed(train.class_names)}"],
                   "give validation images in class folders named as the training data's", shown=_shown_as(val_data))


def check_classes(argument, data, source):
    """Training data of one class are refused: a classifier of one class has nothing to tell apart."""
    if source.num_classes >= 2:
        return
    where = f"the folder {source.folder!r}" if source.folder else "the data"
    raise RunError(argument, _plain(data), f"{where} holds 1 class ({', '.join(map(str, source.class_names))}): "
                   "a classifier of one class has nothing to tell apart (it would score 100 %)",
                   "give a folder with a subfolder of images for each of 2 or more classes", shown=_shown_as(data))


def _plain(data):
    """The value of a data argument as an error holds it: a path as a string, a source as it is."""
    return os.fspath(data) if isinstance(data, os.PathLike) else data


def _shown_as(data):
    return "<ImageSource>" if isinstance(data, sources.ImageSource) else None
