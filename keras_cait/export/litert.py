"""`export_litert`: a LiteRT (TFLite) flatbuffer."""

import tensorflow as tf

from keras_cait.export.core import (
    check_file,
    check_float_model,
    check_quantization,
    converter_info_dropped,
    float32_copy,
    inference_form,
    loggers_kept,
    require_tensorflow_backend,
    traced,
)
from keras_cait.export.formats import by_exporter
from keras_cait.export.inference_graph import InferenceGraph
from keras_cait.io.atomic import written_atomically
from keras_cait.models.surgery import check_model_object

FORMAT = by_exporter("export_litert")


def export_litert(model, path, *, quantization=None, overwrite=False):
    """Writes `model` as a LiteRT (TFLite) flatbuffer.

    A float32 CaiT classifier is converted as its folded inference graph
    (`keras_cait.export.inference_graph`), any other model with Keras'
    `model.export(format="litert")`.

    Args:
        model: the Keras model; its input `(batch, H, W, 3)` float32 0..255.
        path: the `.tflite` file to write.
        quantization: None (float32) or "dynamic_int8": weights stored as int8,
            activations computed in float (TFLite dynamic-range quantisation,
            about 4× smaller; see docs/export.md for its top-1 agreement).
        overwrite: replace an existing file.

    TensorFlow's INFO lines from the conversion ("Reading SavedModel from: ...") and the
    converter's "Ignored output_format." notices are kept off standard error.
    """
    require_tensorflow_backend("export_litert")
    check_model_object(model, "export_litert", inputs=True)
    check_file(path, FORMAT.suffix, overwrite)
    check_quantization(path, quantization)
    check_float_model(model, FORMAT, quantization)
    converter_options = {}
    if quantization == "dynamic_int8":
        converter_options["optimizations"] = [tf.lite.Optimize.DEFAULT]
    forward = inference_form(model)
    with written_atomically(path, overwrite) as temporary, converter_info_dropped(), loggers_kept():
        if not isinstance(forward, InferenceGraph):
            float32_copy(model).export(temporary, format="litert", verbose=False, **converter_options)
            return path
        converter = tf.lite.TFLiteConverter.from_concrete_functions([traced(forward, model)], forward)
        for name, value in converter_options.items():
            setattr(converter, name, value)
        with open(temporary, "wb") as file:
            file.write(converter.convert())
    return path
