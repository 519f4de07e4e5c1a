"""`export_onnx`: an ONNX file for ONNX Runtime (and OpenVINO), written with tf2onnx."""

import functools

import keras
import numpy as np
import tensorflow as tf

from keras_cait.io.atomic import written_atomically
from keras_cait.errors import require_extra
from keras_cait.export.core import check_file, inference_form, quantized, require_tensorflow_backend
from keras_cait.export.formats import by_exporter
from keras_cait.export.inference_graph import InferenceGraph

FORMAT = by_exporter("export_onnx")


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
    """
    require_tensorflow_backend("export_onnx")
    check_file(path, FORMAT.suffix, overwrite)
    tf2onnx = require_extra(FORMAT.exporter, FORMAT.extra, "onnx", "tf2onnx")
    model = quantized(model, path, quantization)
    _register_erfc_for_tf2onnx()
    forward = inference_form(model, runtime="onnx")
    if not isinstance(forward, InferenceGraph):
        exported = keras.models.clone_model(model, clone_function=_normalization_as_rescaling)
        forward = functools.partial(exported, training=False)
    spec = tf.TensorSpec(model.inputs[0].shape, tf.float32, name="images")
    with written_atomically(path, overwrite) as temporary:
        tf2onnx.convert.from_function(
            tf.function(lambda images: {"predictions": forward(images)}),
            input_signature=[spec],
            opset=opset_version,
            output_path=temporary,
        )
    return path


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
