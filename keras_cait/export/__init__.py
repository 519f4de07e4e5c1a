"""Exports a CaiT classifier for serving: TF Serving SavedModel, ONNX, LiteRT, OpenVINO.

One module per format over a shared core:

    saved_model.py   export_saved_model: the TF Serving version folder and its signatures
    onnx.py          export_onnx (tf2onnx)
    litert.py        export_litert (TFLite)
    openvino.py      export_openvino (OpenVINO IR)
    core.py          what every format shares: the traced inference form, Keras
                     quantisation, the checks of destinations and quantisation modes

These modules are TensorFlow by nature (SavedModel signatures, tf.image, TFLite);
the model code they export stays backend-neutral. A float32 CaiT classifier is
exported as its inference graph (`keras_cait.export.inference_graph`): the same
outputs, with the normalisation, LayerScale and attention scale folded into the
weights and a graph that oneDNN, ONNX Runtime and OpenVINO fuse; any other
model (mixed precision, quantised, other heads) as the Keras model itself.
"""

from keras_cait.export.core import (
    KERAS_QUANTIZATIONS,
    ONNX_QUANTIZATIONS,
    QUANTIZATIONS,
    check_destination,
)
from keras_cait.export.litert import export_litert
from keras_cait.export.onnx import export_onnx
from keras_cait.export.openvino import export_openvino
from keras_cait.export.saved_model import export_saved_model

__all__ = [
    "KERAS_QUANTIZATIONS",
    "ONNX_QUANTIZATIONS",
    "QUANTIZATIONS",
    "check_destination",
    "export_litert",
    "export_onnx",
    "export_openvino",
    "export_saved_model",
]
