"""Exports a CaiT classifier for serving: TF Serving SavedModel, ONNX, LiteRT, OpenVINO.

One module per format over a shared core, and the table of formats:

    formats.py          FORMATS, a row per format: suffix, exporter, the quantisation
                        modes it takes, the extra to install, the refusal of the others
    saved_model.py      export_saved_model: the TF Serving version folder and its signatures
    onnx.py             export_onnx (tf2onnx)
    litert.py           export_litert (TFLite)
    openvino.py         export_openvino (OpenVINO IR)
    core.py             what every format shares: the traced inference form, Keras
                        quantisation, the checks of destinations and quantisation modes
    inference_graph.py  the folded forward pass that a float32 CaiT classifier is exported as

These modules are TensorFlow by nature (SavedModel signatures, tf.image, TFLite);
the model code they export stays backend-neutral. A float32 CaiT classifier is
exported as its inference graph (`keras_cait.export.inference_graph`): the same
outputs, with the normalisation, LayerScale and attention scale folded into the
weights and a graph that oneDNN, ONNX Runtime and OpenVINO fuse; any other
model (mixed precision, quantised, other heads) as the Keras model itself.

This package itself loads only the table: the exporters (each row's `exporter`) and
`check_destination` import their modules, and TensorFlow, on first use, so that the
command line can read the table on any backend.
"""

import importlib

from keras_cait.export.formats import (
    EXPORTERS,
    FORMATS,
    KERAS_QUANTIZATIONS,
    ONNX_QUANTIZATIONS,
    QUANTIZATIONS,
    Format,
    by_exporter,
    format_of,
)

_CORE = ("check_destination", "check_quantization")

__all__ = [
    "EXPORTERS",
    "FORMATS",
    "KERAS_QUANTIZATIONS",
    "ONNX_QUANTIZATIONS",
    "QUANTIZATIONS",
    "Format",
    "check_destination",
    "format_of",
    *EXPORTERS,
]


def __getattr__(name):
    if name in _CORE:
        value = getattr(importlib.import_module("keras_cait.export.core"), name)
    elif name in EXPORTERS:
        value = by_exporter(name).load()
    else:
        raise AttributeError(f"module 'keras_cait.export' has no attribute {name!r}")
    globals()[name] = value  # found once; monkeypatch.setattr and `from ... import` see it as any other
    return value


def __dir__():
    return sorted({*globals(), *__all__})
