"""What every export shares: the form that is traced, Keras quantisation and the checks of
destinations (paths, formats, quantisation modes), made before any model is traced."""

import functools
import os
import re

import keras
import tensorflow as tf

from keras_cait.export.inference_graph import InferenceGraph, folds
from keras_cait.training.lora import merge_lora

QUANTIZATIONS = (None, "dynamic_int8")
# Keras' own `model.quantize` modes that the SavedModel export takes (docs/export.md).
KERAS_QUANTIZATIONS = (None, "int8", "int4", "float8")
# ... and the ONNX export: tf2onnx unpacks int4 kernels to float32 and has no float8.
ONNX_QUANTIZATIONS = (None, "int8")


def inference_form(model, runtime="tensorflow"):
    """What an export traces: the folded `InferenceGraph` of a float32 CaiT classifier (the same
    outputs, fewer and fusable ops), or else the Keras model itself, called for inference.
    """
    if folds(model):
        return InferenceGraph(model, runtime=runtime)
    return functools.partial(model, training=False)


def traced(forward, model):
    """`forward` as a concrete function of `images` float32 (batch, H, W, 3)."""
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name="images")
    return tf.function(forward, input_signature=[spec], autograph=False).get_concrete_function()


def quantized(model, path, quantization):
    """`model`, or its Keras-quantised copy (`model.quantize` on every Dense); `model` itself is kept."""
    check_quantization(path, quantization)
    if quantization is None:
        return model
    copy = merge_lora(model)
    # Dense layers only: Keras would also visit layers it cannot quantise and warn for each.
    copy.quantize(quantization, filters=lambda layer: isinstance(layer, keras.layers.Dense))
    return copy


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

    A path ending in `.onnx`, `.tflite` or `.xml` is a file for `export_onnx` /
    `export_litert` / `export_openvino`; anything else is a SavedModel version folder,
    `MODEL_BASE_PATH/<positive integer>`. An existing destination is refused
    unless `overwrite`, and a `quantization` that the format does not take.
    """
    check_quantization(path, quantization)
    for suffix in (".onnx", ".tflite", ".xml"):
        if os.fspath(path).endswith(suffix):
            return check_file(path, suffix, overwrite)
    return check_version_folder(path, overwrite)


def check_quantization(path, quantization):
    """Raises unless the export to `path` (the format from its suffix) takes `quantization`."""
    path = os.fspath(path)
    if path.endswith(".xml") and quantization is not None:
        raise ValueError(
            f"quantization={quantization!r}: the OpenVINO export is float only, since Keras' int8 "
            "model does not convert to OpenVINO correctly; export the float model and compress it "
            "with OpenVINO's NNCF (nncf.compress_weights), or use int8 with a SavedModel or ONNX."
        )
    if path.endswith(".tflite") and quantization == "int8":
        raise ValueError(
            "quantization='int8': Keras' int8 model does not convert to LiteRT (TFLite's "
            "fully_connected takes no int8 activations); use quantization='dynamic_int8', "
            "TFLite's own int8 weights."
        )
    if path.endswith(".onnx") and quantization not in ONNX_QUANTIZATIONS:
        raise ValueError(
            f"quantization={quantization!r}: must be one of {ONNX_QUANTIZATIONS}, e.g. 'int8', for "
            "ONNX (tf2onnx unpacks int4 kernels to float32, no smaller than float, and has no "
            "float8); export a SavedModel for 'int4' or 'float8'."
        )
    allowed = QUANTIZATIONS if path.endswith(".tflite") else KERAS_QUANTIZATIONS
    if not path.endswith(".xml") and quantization not in allowed:
        smaller = " or ".join(repr(mode) for mode in allowed[2:])
        raise ValueError(
            f"quantization={quantization!r}: must be one of {allowed[:2]}, e.g. {allowed[1]!r}"
            + (f", or Keras' smaller {smaller}." if smaller else ".")
        )


def check_version_folder(path, overwrite):
    """Raises unless `path` is a TF Serving version folder that may be written."""
    path = os.fspath(path)
    base, version = os.path.split(os.path.normpath(path))
    if not re.fullmatch(r"[1-9][0-9]*", version):
        canonical = version.isascii() and version.isdigit() and int(version) > 0
        example = os.path.join(base, str(int(version))) if canonical else os.path.join(path, "1")
        raise ValueError(
            f"path {path!r}: TF Serving loads numbered version folders, so the last folder "
            f"must be a positive integer without leading zeros, e.g. {example!r}."
        )
    numbered = [name for name in os.listdir(base or ".") if name.isdigit()] if os.path.isdir(base or ".") else []
    twins = [name for name in numbered if int(name) == int(version) and name != version]
    if twins:
        raise FileExistsError(
            f"path {path!r}: TF Serving reads {os.path.join(base, twins[0])!r} as the same version "
            f"{int(version)}; remove or renumber that folder, or export to another version."
        )
    if os.path.exists(path) and not overwrite:
        newest = max(int(name) for name in numbered)
        raise FileExistsError(
            f"Version folder {path!r} exists; export to {os.path.join(base, str(newest + 1))!r} "
            "(TF Serving serves the highest version), or pass overwrite=True "
            "(keras-cait export --overwrite) to replace it."
        )


def check_file(path, suffix, overwrite):
    """Raises unless `path` ends in `suffix` and may be written."""
    path = os.fspath(path)
    if not path.endswith(suffix):
        raise ValueError(f"path {path!r} must end in {suffix}, e.g. cait{suffix}.")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(
            f"{path!r} exists; pass overwrite=True (keras-cait export --overwrite) to replace it."
        )
