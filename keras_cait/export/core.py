"""What every export shares: the form that is traced, Keras quantisation, the checks of
destinations (paths, formats, quantisation modes), made before any model is traced, and the
converters' INFO lines kept off standard error."""

import contextlib
import functools
import logging
import os
import re

import keras
import tensorflow as tf

from keras_cait.errors import ArgumentError, Named, Said, checked_bool
from keras_cait.io.atomic import unwritable
from keras_cait.io.stderr import drop_startup_info, stderr_through, write_all
from keras_cait.export.formats import FORMATS, file_formats, folder_format, format_of, listed
from keras_cait.export.inference_graph import InferenceGraph, folds
from keras_cait.models.precision import is_mixed
from keras_cait.models.surgery import merge_lora, with_dtype_policy


def inference_form(model, runtime="tensorflow", compute_dtype="float32"):
    """What an export traces: the folded `InferenceGraph` of a float32 CaiT classifier (the same
    outputs, fewer and fusable ops), or else the Keras model itself, called for inference.
    A CaiT classifier trained under a mixed policy (`keras-cait train`'s default) is folded from
    its float32 copy: its weights are float32 already, and a CPU server has no use for float16.
    `compute_dtype="bfloat16"` needs the folded graph (`InferenceGraph`'s argument)."""
    if folds(model, any_policy=True):
        return InferenceGraph(with_dtype_policy(model, "float32"), runtime=runtime, compute_dtype=compute_dtype)
    if compute_dtype != "float32":
        raise ArgumentError("compute_dtype", compute_dtype, "takes a CaiT classifier as build_cait makes it (not a "
                            "quantized, headless or LoRA model)", "export this model in float32", usage=True)
    return functools.partial(model, training=False)


def traced(forward, model):
    """`forward` as a concrete function of `images` float32 (batch, H, W, 3)."""
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name="images")
    return tf.function(forward, input_signature=[spec], autograph=False).get_concrete_function()


def float32_copy(model):
    """`model`, or its float32 copy where its layers compute under a mixed policy (`with_dtype_policy`):
    what the ONNX, OpenVINO and LiteRT files of a model that does not fold are made from (their
    converters and runtimes take no graph of bfloat16 and float16 casts), and what int8 quantises.
    The SavedModel of such a model computes as the model does (TensorFlow runs either)."""
    if any(is_mixed(layer.dtype_policy) for layer in model.layers):
        return with_dtype_policy(model, "float32")
    return model


def quantized(model, path, quantization):
    """`model`, or its Keras-quantised copy (`model.quantize` on every Dense); `model` itself is kept.
    A model trained under a mixed policy is quantised from its float32 copy (`float32_copy`)."""
    check_quantization(path, quantization)
    check_float_model(model, format_of(path), quantization)
    if quantization is None:
        return model
    copy = float32_copy(merge_lora(model))
    # Dense layers only: Keras would also visit layers it cannot quantise and warn for each.
    copy.quantize(quantization, filters=lambda layer: isinstance(layer, keras.layers.Dense))
    return copy


def quantization_of(model):
    """The mode `model.quantize` gave `model`'s layers ("int8", ...), or None for a float model."""
    return next((layer.quantization_mode for layer in model._flatten_layers(include_self=False)
                 if getattr(layer, "quantization_mode", None) is not None), None)


def check_float_model(model, row, quantization):
    """Refuses a model that `model.quantize` quantised already where the export of `row` (a row of
    `FORMATS`) cannot take it: asked to quantise it again, or for a format whose converter fails on
    Keras' quantised layers or computes them wrongly (`Format.quantized_model`)."""
    mode = quantization_of(model)
    if mode is None:
        return
    if quantization is not None:
        raise ArgumentError("quantization", quantization, f"the model is quantised already ({mode}, by model.quantize)",
                            ["give the float model to quantise it, or ", Named("quantization", None),
                             " to export this one as it is"], usage=True)
    if row.quantized_model:
        takers = listed([each.name for each in FORMATS if not each.quantized_model], "or")
        raise ArgumentError("model", None, f"quantised by Keras ({mode}): {row.quantized_model}",
                            ["export the float model (with ", Named("quantization", shown="..."),
                             f" for a smaller file), or this one to {takers}"], usage=True, shown=f"<{model.name}>")


def require_tensorflow_backend(function):
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"{function} writes TensorFlow graphs and needs the TensorFlow backend; the backend "
            f"is {keras.backend.backend()!r}. Save the weights (model.save_weights) and export "
            "from a process started with KERAS_BACKEND=tensorflow."
        )


# === Checks of the destination ===


def check_destination(path, overwrite=False, quantization=None):
    """Raises unless an export may write `path`; cheap, so callers check before building a model.

    The format is the row of `keras_cait.export.formats.FORMATS` that `path` names: a path
    ending in a file format's suffix (`.onnx`, `.tflite`, `.xml`) is a file for its
    exporter; anything else is a SavedModel version folder,
    `MODEL_BASE_PATH/<positive integer>`. An existing destination is refused
    unless `overwrite`, and a `quantization` that the format does not take.
    """
    path = checked_path(path)
    check_quantization(path, quantization)
    row = format_of(path)
    if row.suffix is not None:
        return check_files(row, path, overwrite)
    _check_no_other_suffix(path)
    return check_version_folder(path, overwrite)


class DestinationExists(Said, FileExistsError):
    """The destination of an export exists and `overwrite` is not given; the message names it and
    `overwrite` (a `Named`, which the command line writes as its flag)."""


def _check_no_other_suffix(path):
    """A path whose last part ends in a suffix no format writes (`model.pt`) is refused, naming the
    suffixes that are written, rather than taken for a version folder."""
    path = os.fspath(path)
    suffix = os.path.splitext(os.path.basename(os.path.normpath(path)))[1]
    if re.fullmatch(r"\.[A-Za-z][\w.]*", suffix):
        files = listed([f"{row.suffix} ({row.name})" for row in file_formats()], "or")
        raise ArgumentError("path", path, f"no export format writes a {suffix} file",
                            f"give a path ending in {files}, or a {folder_format().name} version folder "
                            "(e.g. serving/cait/1)", usage=True)


def checked_path(path):
    """`path` as a str, or an `ArgumentError` naming it where it is no path (None, a number)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError("path", path, f"must be a str or os.PathLike, not {type(path).__name__}",
                            "e.g. 'serving/cait/1' (a SavedModel version folder) or 'cait.onnx'", usage=True)
    return os.fspath(path)


def check_quantization(path, quantization):
    """Raises unless the export to `path` (the format from its suffix) takes `quantization`."""
    refused = format_of(path).refused(quantization)
    if refused:
        raise refused


def check_version_folder(path, overwrite):
    """Raises unless `path` is a TF Serving version folder that may be written."""
    path = checked_path(path)
    base, version = os.path.split(os.path.normpath(path))
    if not re.fullmatch(r"[1-9][0-9]*", version):
        numeral = version.isascii() and version.isdigit()
        suffix = os.path.splitext(version)[1]
        writer = next((row.exporter for row in file_formats() if suffix and row.suffix == suffix),
                      "model.save" if suffix == ".keras" else None)
        example = os.path.join(base if numeral or writer else path, str(max(1, int(version))) if numeral else "1")
        raise ArgumentError(
            "path", path, "TF Serving loads numbered version folders, so the last folder must be a positive "
            "integer without leading zeros", [f"e.g. {example!r}"] + (
                [f"; a {suffix} file is {writer}'s"] if writer else []), usage=True)
    overwrite = _checked_overwrite(overwrite)
    _check_writable(path, "a version folder")
    numbered = [name for name in os.listdir(base or ".") if name.isdigit()] if os.path.isdir(base or ".") else []
    twins = [name for name in numbered if int(name) == int(version) and name != version]
    if twins:
        raise DestinationExists(
            Named("path", path), f": TF Serving reads {os.path.join(base, twins[0])!r} as the same version "
            f"{int(version)}; remove or renumber that folder, or export to another version."
        )
    if os.path.exists(path) and not overwrite:
        newest = max(int(name) for name in numbered)
        raise DestinationExists(
            f"Version folder {path!r} exists; export to {os.path.join(base, str(newest + 1))!r} "
            "(TF Serving serves the highest version), or pass ", Named("overwrite", True), " to replace it."
        )


def _checked_overwrite(overwrite):
    """`overwrite` as a bool: a str such as 'no' from a config is truthy and would replace the export."""
    return checked_bool("overwrite", overwrite, "True (replace an existing export) or False (refuse it)")


def check_files(row, path, overwrite):
    """Raises unless `path` ends in the suffix of the format `row` and it and the files written beside
    it (`row.companions`: an `.xml`'s `.bin`) may be written."""
    check_file(path, row.suffix, overwrite)
    for companion, suffix in zip(row.companion_paths(path), row.companions):
        check_file(companion, suffix, overwrite)


def check_file(path, suffix, overwrite):
    """Raises unless `path` ends in `suffix` and may be written."""
    path = checked_path(path)
    if not path.endswith(suffix):
        raise ArgumentError("path", path, f"must end in {suffix}, e.g. cait{suffix}", usage=True)
    overwrite = _checked_overwrite(overwrite)
    _check_writable(path, "a file")
    if os.path.exists(path) and not overwrite:
        raise DestinationExists(f"{path!r} exists; pass ", Named("overwrite", True), " to replace it.")


def _check_writable(path, written):
    """Refuses a destination where the export cannot write `written` ("a file", "a version folder"):
    the other kind of entry there (which `overwrite` would delete), or a folder above it that is a
    file or not writable (`keras_cait.io.atomic.unwritable`), before any model is traced."""
    folder = written != "a file"
    if os.path.exists(path) and os.path.isdir(path) != folder:
        there = "a folder" if os.path.isdir(path) else "a file"
        raise ArgumentError("path", path, f"is {there}, where the export writes {written}",
                            "choose another path, or move that one away")
    problem = unwritable(os.path.dirname(os.path.abspath(path)), given=path)
    if problem:
        raise ArgumentError("path", path, *problem)


# === The converters' own lines ===

# The TFLite converter's notice of the flags that TensorFlow's own Python converter passes and its
# C++ side ignores ("W0000 00:00:1795945018.491298   12357 tf_tfl_flatbuffer_helpers.cc:364] Ignored
# output_format."), printed by every conversion.
_IGNORED_FLAG = re.compile(rb"W\d{4} \d\d:\d\d:\d+\.\d+ +\d+ tf_tfl_flatbuffer_helpers\.cc:\d+\] Ignored \w+\.$")


@contextlib.contextmanager
def loggers_kept():
    """Python's logging as the caller had it after a SavedModel is written: TensorFlow's tracking
    turns absl's verbosity to FATAL while it lists the graph's objects and then back, which leaves
    the `absl` logger at WARNING where it was NOTSET (taking the root's level), and the first
    warning it logs gives the root logger a handler where it had none, after which the caller's
    own `logging.basicConfig(...)` does nothing."""
    absl, root = logging.getLogger("absl"), logging.getLogger()
    level, handlers = absl.level, list(root.handlers)
    try:
        yield
    finally:
        absl.setLevel(level)
        for handler in [each for each in root.handlers if each not in handlers]:
            root.removeHandler(handler)


@contextlib.contextmanager
def converter_info_dropped():
    """Runs a conversion (tf2onnx, the TFLite converter) with TensorFlow's INFO records kept off
    standard error: grappler's "devices.cc:67] Number of eligible GPUs ..." and "single_machine.cc:376]
    Starting new session" for ONNX, "reader.cc:83] Reading SavedModel from: ..." and eight more for
    LiteRT, and the LiteRT converter's "Ignored output_format." notices. Everything else
    (warnings, errors, tracebacks) goes on to standard error as it is written, in order: file
    descriptor 2 flows through a pipe that a thread reads, so a crash inside loses at most the last
    lines. TF_CPP_MIN_LOG_LEVEL=0 keeps every line, as it does at `import keras_cait`."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    with stderr_through(_forward_kept, "keras_cait-converter-info"):
        yield


def converter_lines_kept(lines):
    """`lines` (bytes, whole lines) without TensorFlow's INFO records and the ignored-flag notices."""
    return b"".join(line for line in drop_startup_info(lines).splitlines(keepends=True)
                    if not _IGNORED_FLAG.match(line.rstrip(b"\r\n")))


def _forward_kept(read_end, original):
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            complete, newline, pending = (pending + chunk).rpartition(b"\n")
            if newline:
                write_all(original, converter_lines_kept(complete + newline))
    write_all(original, converter_lines_kept(pending))
