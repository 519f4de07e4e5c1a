"""`export_openvino`: OpenVINO IR, the `.xml` graph and its `.bin` weights."""

import importlib.util
import os

from keras_cait.atomic import written_atomically
from keras_cait.export.core import (
    check_file,
    check_quantization,
    inference_form,
    require_tensorflow_backend,
    traced,
)
from keras_cait.export.formats import by_exporter
from keras_cait.export.inference_graph import InferenceGraph

FORMAT = by_exporter("export_openvino")


def export_openvino(model, path, *, quantization=None, overwrite=False):
    """Writes `model` as OpenVINO IR with Keras' `model.export(format="openvino")`.

    `path` (`.xml`, the graph) and the weights beside it (the same name with
    `.bin`); input `images` `(batch, H, W, 3)` float32 RGB 0..255, one output
    (`predictions` for a CaiT classifier): what the model outputs. A float32
    CaiT classifier is written as its folded inference graph
    (`keras_cait.export.inference_graph`), any other model as Keras exports it.
    Needs `pip install "keras-cait[openvino]"`.

    OpenVINO's CPU plugin computes in bfloat16 where the CPU has it (AVX512-BF16,
    AMX) unless the model is compiled with `{"INFERENCE_PRECISION_HINT": "f32"}`;
    docs/export.md gives the difference to Keras for both.

    Example:
        export_openvino(model, "cait.xml")
        compiled = openvino.Core().compile_model("cait.xml", "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        probabilities = compiled(images)[0]
    """
    require_tensorflow_backend("export_openvino")
    check_file(path, FORMAT.suffix, overwrite)
    weights_path = os.fspath(path).removesuffix(FORMAT.suffix) + ".bin"
    check_file(weights_path, ".bin", overwrite)
    check_quantization(path, quantization)
    if importlib.util.find_spec("openvino") is None:
        raise ImportError(f'{FORMAT.exporter} needs {FORMAT.name}: pip install "keras-cait[{FORMAT.extra}]".')
    import openvino

    forward = inference_form(model, runtime="onnx")
    # OpenVINO writes the weights beside the graph, under the `.bin` name; they go into place first.
    with written_atomically(path, overwrite, companions=[weights_path]) as temporary:
        if isinstance(forward, InferenceGraph):
            converted = openvino.convert_model(traced(forward, model))
            (images,), (predictions,) = converted.inputs, converted.outputs
            images.get_node().set_friendly_name("images")
            images.get_tensor().set_names({"images"})
            predictions.get_tensor().set_names({"predictions"})
            openvino.save_model(converted, temporary, compress_to_fp16=False)
        else:
            model.export(temporary, format="openvino", verbose=False)
    return path
