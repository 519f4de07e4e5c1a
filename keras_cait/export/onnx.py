"""`export_onnx`: an ONNX file for ONNX Runtime (and OpenVINO), written with tf2onnx."""

import contextlib
import functools
import logging
import numbers
import os

import keras
import numpy as np
import tensorflow as tf

from keras_cait.errors import ArgumentError, Named, require_extra
from keras_cait.export.core import (
    check_file,
    check_quantization,
    converter_info_dropped,
    float32_copy,
    inference_form,
    quantized,
    require_tensorflow_backend,
)
from keras_cait.export.formats import by_exporter
from keras_cait.export.inference_graph import InferenceGraph
from keras_cait.io.atomic import written_atomically
from keras_cait.models.surgery import check_model_object

FORMAT = by_exporter("export_onnx")

# The lowest opset that holds the CaiT graph, float32 (folded) and int8 alike: below 10 tf2onnx cannot
# write TensorFlow's StridedSlice as ONNX Slice (which takes its starts and ends as inputs from opset 10)
# and leaves the TensorFlow op in the file, which ONNX Runtime refuses to load (measured: opsets 8 and 9
# "In Node strided_slice_1, StridedSlice", 7 BroadcastTo, 5 a Cast of Erf's; 10 to 18 load and match).
MIN_OPSET = 10
# The environment variables that tf2onnx sets for the rest of a session when `tf2onnx.convert` is first
# imported (TF_CPP_MIN_LOG_LEVEL=3), and the loggers whose levels its logging helpers set.
_TF2ONNX_ENVIRONMENT = ("TF_CPP_MIN_LOG_LEVEL",)
_TF2ONNX_LOGGERS = ("tensorflow", "tf2onnx")


def export_onnx(model, path, *, quantization=None, overwrite=False, opset_version=None):
    """Writes `model` as an ONNX file: input `images`, output `predictions`.

    `images` is `(batch, H, W, 3)` float32 RGB 0..255 and `predictions` is what
    the model outputs (probabilities, or logits with
    `classifier_activation=None`). Needs `pip install "keras-cait[onnx]"`.

    A float32 CaiT classifier is written as its folded inference graph
    (`keras_cait.export.inference_graph`: normalisation, LayerScale and attention
    scale folded into the weights, LayerNorm and GELU in the forms ONNX Runtime
    fuses). Any other model is exported as Keras' `model.export(path,
    format="onnx")` does on the TensorFlow backend (tf2onnx's public `from_function` on the traced model),
    with two fixes that export needs for CaiT: the mean and variance of Keras'
    `Normalization` are eager tensors that the traced function captures, which
    tf2onnx would turn into extra required graph inputs, so the exported copy
    of the model normalises with a `Rescaling` layer of the same constants
    (`keras.models.clone_model`, sharing every weight); and TensorFlow's exact
    GELU is `0.5·x·erfc(-x/√2)`, whose Erfc tf2onnx cannot convert, so it is
    taught erfc(x) = 1 - erf(x).

    `quantization="int8"` exports Keras' int8 model (`model.quantize`, on a
    copy): int8 kernels, dequantised inside the graph.

    `opset_version`: the ONNX opset, an integer from `MIN_OPSET` (10, the
    lowest that holds the CaiT graph) to the highest tf2onnx writes
    (`max_opset()`, 18 with tf2onnx 1.17); None is tf2onnx's default (15).

    tf2onnx's settings for the whole process (TF_CPP_MIN_LOG_LEVEL, which its
    import sets to 3) are put back afterwards, and TensorFlow's INFO lines
    from the conversion are kept off standard error.
    """
    require_tensorflow_backend("export_onnx")
    check_model_object(model, "export_onnx", inputs=True)
    check_file(path, FORMAT.suffix, overwrite)
    check_quantization(path, quantization)
    require_extra(FORMAT.exporter, FORMAT.extra, "onnx", "tf2onnx")
    check_opset_version(opset_version)
    model = float32_copy(quantized(model, path, quantization))
    _register_erfc_for_tf2onnx()
    forward = inference_form(model, runtime="onnx")
    if not isinstance(forward, InferenceGraph):
        exported = keras.models.clone_model(model, clone_function=_normalization_as_rescaling)
        forward = functools.partial(exported, training=False)
    spec = tf.TensorSpec(model.inputs[0].shape, tf.float32, name="images")
    with _tf2onnx_settings_kept(), written_atomically(path, overwrite) as temporary, converter_info_dropped():
        from tf2onnx import convert

        convert.from_function(
            tf.function(lambda images: {"predictions": forward(images)}),
            input_signature=[spec],
            opset=None if opset_version is None else int(opset_version),
            output_path=temporary,
        )
    return path


def max_opset():
    """The highest opset tf2onnx writes: the last of its table of opsets to ONNX IR versions (a
    higher one fails as the model is written, `make_sure failure`), and no higher than the installed
    onnx knows."""
    import onnx
    from tf2onnx import constants

    return min(max(constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version())


def check_opset_version(opset_version):
    """Raises `ArgumentError` unless `opset_version` is None (tf2onnx's default) or an integer from
    `MIN_OPSET` to `max_opset()`."""
    if opset_version is None:
        return
    highest = max_opset()
    integer = isinstance(opset_version, numbers.Integral) and not isinstance(opset_version, bool)
    if integer and MIN_OPSET <= opset_version <= highest:
        return
    if not integer:
        problem = "must be an integer"
    elif opset_version < MIN_OPSET:
        problem = f"the CaiT graph needs ONNX opset {MIN_OPSET} or later (its StridedSlice as ONNX Slice)"
    else:
        problem = f"tf2onnx writes ONNX opsets up to {highest}"
    example = Named("opset_version", min(17, highest))
    raise ArgumentError("opset_version", opset_version, problem,
                        [f"give an integer from {MIN_OPSET} to {highest}, e.g. ", example,
                         ", or leave it out for tf2onnx's default"], usage=True)


@contextlib.contextmanager
def _tf2onnx_settings_kept():
    """Runs its body (tf2onnx's import and conversion) and puts back what tf2onnx changes for the
    whole process: the first `import tf2onnx.convert` sets TF_CPP_MIN_LOG_LEVEL=3 (also when the
    conversion then fails), and its logging helpers set the levels of the TensorFlow and tf2onnx
    loggers. A variable that was absent is removed again."""
    environment = {name: os.environ.get(name) for name in _TF2ONNX_ENVIRONMENT}
    levels = {name: logging.getLogger(name).level for name in _TF2ONNX_LOGGERS}
    try:
        yield
    finally:
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            elif os.environ.get(name) != value:
                os.environ[name] = value
        for name, level in levels.items():
            if logging.getLogger(name).level != level:
                logging.getLogger(name).setLevel(level)


def _normalization_as_rescaling(layer):
    """`Normalization(mean, variance)` -> the same affine map as `Rescaling`; other layers as they are.

    Rescaling keeps its constants as Python numbers, which the traced graph
    holds as constants rather than as captured tensors.
    """
    if not isinstance(layer, keras.layers.Normalization):
        return layer
    config = layer.get_config()
    if config.get("invert") or config.get("mean") is None:
        return layer
    std = np.sqrt(np.maximum(np.asarray(config["variance"], "float64"), 0.0))
    std = np.maximum(std, keras.backend.epsilon())
    mean = np.asarray(config["mean"], "float64")
    return keras.layers.Rescaling(
        scale=(1.0 / std).tolist(), offset=(-mean / std).tolist(), name=layer.name, dtype=layer.dtype_policy
    )


@functools.cache
def _register_erfc_for_tf2onnx():
    """Teaches tf2onnx Erfc (in tf.nn.gelu) as 1 - Erf."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):  # ONNX has Erf from opset 9
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name("erfc_one"), np.array(1, dtype=dtype))
            node.type = "Erf"
            ctx.insert_new_node_on_output(
                "Sub", node.output[0], name=utils.make_name(node.name), inputs=[one.output[0], node.output[0]]
            )
