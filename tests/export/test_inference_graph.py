"""keras_cait.export.inference_graph: every export runs the folded graph and gives timm's logits.

The reference is timm's CaiT with every parameter random (LayerScale gammas
0.2..0.7, so a LayerScale folded into the wrong axis or block would show), its
state_dict loaded into keras_cait through the converter.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_cait.export import export_litert, export_onnx, export_openvino, export_saved_model
from keras_cait.export.inference_graph import InferenceGraph, folds
from keras_cait.models.architecture import build_cait
from keras_cait.weights import load_weights_file
from tests.conftest import TINY_CAIT, TINY_SIZE, TimmReference


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(timm model, Keras model with its weights and a linear head, images, timm's logits)."""
    timm_reference = TimmReference(tmp_path_factory.mktemp("timm"))
    timm_model = timm_reference.tiny_model(seed=3)
    model = build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classifier_activation=None)
    load_weights_file(model, str(timm_reference.save(timm_model)))
    images = timm_reference.images(4, TINY_SIZE, seed=3)
    logits, _ = TimmReference.outputs(timm_model, images)
    return model, images.astype("float32"), logits


def softmax(logits):
    exponentials = np.exp(logits - logits.max(-1, keepdims=True))
    return exponentials / exponentials.sum(-1, keepdims=True)


def run_saved_model(path, images):
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    return signature(images=tf.constant(images))["probabilities"].numpy()


def run_onnx(path, images):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": images})[0]


def run_openvino(path, images):
    import openvino

    return openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(images)[0]


def run_litert(path, images):
    from ai_edge_litert.interpreter import Interpreter

    (outputs,) = Interpreter(model_path=str(path)).get_signature_runner("serving_default")(images=images).values()
    return outputs


EXPORTS = {
    "saved_model": (lambda model, path: export_saved_model(model, path / "1"), lambda path, x: run_saved_model(
        path / "1", x)),
    "onnx": (lambda model, path: export_onnx(model, path / "cait.onnx"), lambda path, x: run_onnx(
        path / "cait.onnx", x)),
    "openvino": (lambda model, path: export_openvino(model, path / "cait.xml"), lambda path, x: run_openvino(
        path / "cait.xml", x)),
    "litert": (lambda model, path: export_litert(model, path / "cait.tflite"), lambda path, x: run_litert(
        path / "cait.tflite", x)),
}


def test_the_folded_graph_gives_timms_logits(reference):
    model, images, logits = reference
    assert folds(model)
    TimmReference.assert_matches(InferenceGraph(model)(tf.constant(images)), logits, "tensorflow form")
    TimmReference.assert_matches(InferenceGraph(model, runtime="onnx")(tf.constant(images)), logits, "onnx form")


@pytest.fixture(scope="module")
def exported(reference, tmp_path_factory):
    """`exported(format)`: the folder that format's export of the reference model was written to, once."""
    folders = {}

    def export(name):
        if name not in folders:
            folders[name] = tmp_path_factory.mktemp(name)
            EXPORTS[name][0](reference[0], folders[name])
        return folders[name]

    return export


@pytest.mark.large
@pytest.mark.parametrize("export", EXPORTS)
def test_every_export_gives_timms_outputs(reference, export, exported):
    model, images, logits = reference
    _, run = EXPORTS[export]
    outputs = run(exported(export), images)
    # The SavedModel's signatures return probabilities (a softmax of the logits).
    expected = softmax(logits) if export == "saved_model" else logits
    TimmReference.assert_matches(outputs, expected, export)


def test_folding_leaves_the_keras_model_as_it_is(reference):
    model, images, _ = reference
    before = [np.array(weight) for weight in model.weights]
    predictions = model.predict(images, verbose=0)
    InferenceGraph(model)
    assert all(np.array_equal(a, np.array(b)) for a, b in zip(before, model.weights))
    np.testing.assert_array_equal(model.predict(images, verbose=0), predictions)
    assert [weight.path for weight in model.weights if "layer_scale" in weight.path]  # still there


def test_the_graph_holds_no_layer_scale_normalisation_or_dropout(reference):
    model, _, _ = reference
    graph = InferenceGraph(model)
    names = [variable.name for variable in graph.variables]
    assert not [name for name in names if "layer_scale" in name or "gamma_" in name]
    ops = {
        op.type
        for op in tf.function(graph).get_concrete_function(tf.TensorSpec([None, TINY_SIZE, TINY_SIZE, 3])).graph
        .get_operations()
    }
    # Drop path and dropout are absent, not identities that draw random numbers.
    assert not {op for op in ops if "Random" in op}
    # 2 + 2 blocks: LayerScale gammas gone, mean/variance of the normalisation gone, and the
    # pre-softmax head mix's bias of the 2 self-attention blocks (the softmax cancels it).
    assert sum(int(np.prod(variable.shape)) for variable in graph.variables) == sum(
        int(np.prod(weight.shape)) for weight in model.weights
    ) - 4 * 2 * TINY_CAIT["embed_dim"] - TINY_CAIT["embed_dim"] - 2 * TINY_CAIT["num_heads"]


def openvino_constants(folder):
    import openvino

    model = openvino.Core().read_model(str(folder / "cait.xml"))
    return [op.get_data() for op in model.get_ops()
            if op.get_type_name() == "Constant" and op.get_element_type() == openvino.Type.f32]


def litert_constants(folder):
    """The float32 tensors with data in the flatbuffer (weights and constants, not activations)."""
    from tensorflow.lite.tools import flatbuffer_utils

    flatbuffer = flatbuffer_utils.read_model(str(folder / "cait.tflite"))
    float32 = 0  # TensorType.FLOAT32 in the LiteRT schema
    return [np.frombuffer(bytes(bytearray(flatbuffer.buffers[tensor.buffer].data)), "<f4").reshape(tensor.shape)
            for subgraph in flatbuffer.subgraphs for tensor in subgraph.tensors
            if tensor.type == float32 and flatbuffer.buffers[tensor.buffer].data is not None
            and len(flatbuffer.buffers[tensor.buffer].data)]


def onnx_constants(folder):
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(folder / "cait.onnx")).graph
    tensors = [numpy_helper.to_array(initializer) for initializer in graph.initializer]
    tensors += [numpy_helper.to_array(node.attribute[0].t) for node in graph.node if node.op_type == "Constant"]
    return [tensor for tensor in tensors if tensor.dtype == np.float32]


FLOAT_CONSTANTS = {"openvino": openvino_constants, "litert": litert_constants, "onnx": onnx_constants}


@pytest.mark.parametrize("export", FLOAT_CONSTANTS)
def test_every_file_export_holds_the_folded_weights(reference, export, exported):
    """The file holds the inference graph's weights, not the Keras model's: its float constants add up
    to the folded model's parameters, and no LayerScale gamma or patch-embedding bias is among them.
    An export of the unfolded model gives the same outputs, so only this tells them apart. The
    SavedModel's twin: test_saved_model.py::
    test_every_weight_is_saved_once_with_the_layer_scales_and_patch_bias_folded."""
    model, _, _ = reference
    # Scalars are the formulas' own numbers (0.5, √2, ε); LiteRT's convolution gets an all-zero bias.
    constants = [c for c in FLOAT_CONSTANTS[export](exported(export)) if c.size > 1 and np.any(c)]
    folded = [weight for weight in model.weights
              if "layer_scale" in weight.path or weight.path == "patch_embedding/projection/bias"]
    assert len(folded) == 2 * 4 + 1  # two LayerScales in each of the 2 + 2 blocks
    cancelled = [weight for weight in model.weights if "pre_softmax_head_mix/bias" in weight.path]
    assert len(cancelled) == 2  # the softmax cancels it: one in each self-attention block
    kept = sum(int(np.prod(weight.shape)) for weight in model.weights
               if not any(weight is f for f in folded + cancelled))
    stored = sum(constant.size for constant in constants)
    assert stored == kept, f"{export}: {stored} float weights in the file, {kept} in the folded model"
    for weight in folded:
        value = np.asarray(weight).ravel()
        assert not [c for c in constants if c.size == value.size and np.array_equal(c.ravel(), value)], weight.path


@pytest.mark.large
def test_our_onnx_runs_fewer_nodes_than_timms_under_onnx_runtime(reference, tmp_path):
    """ONNX Runtime's optimised graphs (its fusions applied): our LayerNorms fuse, no identity ops."""
    import onnx
    import onnxruntime
    import torch

    model, _, _ = reference
    timm_model = TimmReference(tmp_path).tiny_model(seed=3)
    torch.onnx.export(timm_model, (torch.zeros(1, 3, TINY_SIZE, TINY_SIZE),), str(tmp_path / "timm.onnx"),
                      input_names=["images"], dynamic_axes={"images": {0: "batch"}}, dynamo=False)
    export_onnx(model, tmp_path / "ours.onnx")

    def optimised_nodes(name):
        options = onnxruntime.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"optimised-{name}")
        onnxruntime.InferenceSession(str(tmp_path / name), options, providers=["CPUExecutionProvider"])
        return [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]

    ours, timms = optimised_nodes("ours.onnx"), optimised_nodes("timm.onnx")
    assert ours.count("LayerNormalization") >= 2 * TINY_CAIT["depth"] + 1
    assert "Identity" not in ours and "Dropout" not in ours
    assert len(ours) < len(timms), (len(ours), len(timms))


@pytest.mark.parametrize(
    "changes",
    [dict(classifier_activation="softmax", pooling="avg"), dict(include_top=False, pooling="token")],
)
def test_models_it_does_not_fold_are_exported_as_they_are(tiny_cait, changes):
    assert not folds(tiny_cait(**changes))


def test_a_mixed_precision_model_is_not_folded(tiny_cait, policy):
    policy("mixed_bfloat16")
    assert not folds(tiny_cait())
    keras.mixed_precision.set_global_policy("float32")
    assert folds(tiny_cait())


@pytest.mark.large
@pytest.mark.parametrize("runtime", ["onnx", "openvino", "litert"])
def test_a_mixed_precision_model_the_graph_does_not_fold_is_exported_from_its_float32_copy_too(tmp_path, runtime):
    """A CaiT pooling its patches ("avg"), trained under mixed_bfloat16, goes through Keras' own export.
    Before: its ONNX file held bfloat16 and float16 casts that ONNX Runtime refused to load, OpenVINO's
    converter failed ("Tensor was not initialized"), LiteRT computed in bfloat16. (Its SavedModel computes
    as the model does: test_saved_model.py's test_a_mixed_precision_model_serves_float32.)"""
    from keras_cait.models import with_dtype_policy

    float32 = build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), pooling="avg",
                         classifier_activation=None)
    rng = np.random.RandomState(5)
    for weight in float32.weights:  # every weight random, LayerScale included
        weight.assign(rng.normal(0, 0.1, weight.shape).astype("float32"))
    mixed = with_dtype_policy(float32, "mixed_bfloat16")
    assert not folds(mixed, any_policy=True)
    images = rng.uniform(0, 255, (3, TINY_SIZE, TINY_SIZE, 3)).astype("float32")
    logits = float32.predict(images, verbose=0)
    half = mixed.predict(images, verbose=0).astype("float32")
    assert np.abs(half - logits).max() > 1e-3 * np.abs(logits).max()  # bfloat16 shows at the tolerance below

    export, run = EXPORTS[runtime]
    export(mixed, tmp_path)
    np.testing.assert_allclose(run(tmp_path, images), logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())


@pytest.mark.parametrize("mixed", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_precision_classifier_is_exported_from_its_float32_copy(tiny_cait, policy, mixed):
    """keras-cait train's default precision is mixed_float16: the CaiT it saves is folded as its
    float32 copy (its weights are float32 already), so its exports are the fast graph, and its
    bfloat16 SavedModel is not refused."""
    from keras_cait.export.core import inference_form
    from keras_cait.training.transfer import with_dtype_policy

    policy(mixed)
    model = tiny_cait()
    keras.mixed_precision.set_global_policy("float32")
    rng = np.random.RandomState(0)
    for weight in model.weights:  # every weight random, LayerScale included
        weight.assign(rng.normal(0, 0.1, weight.shape).astype("float32"))
    images = rng.uniform(0, 255, (3, TINY_SIZE, TINY_SIZE, 3)).astype("float32")
    copy = with_dtype_policy(model, "float32")
    assert {layer.dtype_policy.name for layer in copy._flatten_layers()} == {"float32"}
    expected = copy.predict(images, verbose=0)
    half = model.predict(images, verbose=0).astype("float32")  # the same model, in half precision
    assert np.abs(half - expected).max() < 2e-2 * np.abs(expected).max()
    for precision, tolerance in (("float32", 1e-5), ("bfloat16", 5e-2)):
        form = inference_form(model, compute_dtype=precision)
        assert isinstance(form, InferenceGraph), precision
        np.testing.assert_allclose(form(tf.constant(images)).numpy(), expected, atol=tolerance)
