"""export_saved_model(..., compute_dtype="bfloat16"): bfloat16 matmuls, float32 in and out, the same three
signatures, read by TensorFlow's loader alone; `keras-cait export --compute-dtype bfloat16`."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_cait.cli.errors import UserError
from keras_cait.export import export_saved_model
from keras_cait.export.core import inference_form
from keras_cait.models.architecture import build_cait
from keras_cait.models.blocks import SelfAttentionBlock
from tests.export.helpers import SIDE, encode, photo, small_model

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# TensorFlow alone (no keras_cait, no Keras): the three signatures on the same images.
LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
path, images, jpeg = sys.argv[1], np.load(sys.argv[2]), open(sys.argv[3], "rb").read()
loaded = tf.saved_model.load(path)
answers = {
    "serving_default": loaded.signatures["serving_default"](images=tf.constant(images)),
    "serving_uint8": loaded.signatures["serving_uint8"](images=tf.constant(images.astype("uint8"))),
    "serving_bytes": loaded.signatures["serving_bytes"](image_bytes=tf.constant([jpeg] * len(images))),
}
print(json.dumps({"dtypes": {name: {key: value.dtype.name for key, value in answer.items()}
                             for name, answer in answers.items()},
                  "probabilities": {name: answer["probabilities"].numpy().tolist() for name, answer in answers.items()},
                  "keras_cait_loaded": any(name.startswith("keras_cait") for name in sys.modules)}))
"""


def matmul_dtypes(path):
    """{(op, T)} of the matmuls and convolutions in the SavedModel's functions."""
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as file:
        saved.ParseFromString(file.read())
    seen = set()
    for function in saved.meta_graphs[0].graph_def.library.function:
        for node in function.node_def:
            if node.op in ("MatMul", "BatchMatMulV2", "Conv2D"):
                seen.add((node.op, node.attr["T"].type))
    return seen


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    model = small_model(seed=3, classes=10)
    paths = {dtype: str(root / dtype / "1") for dtype in ("float32", "bfloat16")}
    for dtype, path in paths.items():
        export_saved_model(model, path, compute_dtype=dtype, class_names=[f"class {i}" for i in range(10)])
    images = np.random.RandomState(4).randint(0, 256, (8, SIDE, SIDE, 3)).astype("float32")
    np.save(root / "images.npy", images)
    (root / "photo.jpg").write_bytes(encode(photo(SIDE + 8, SIDE + 4), "JPEG"))
    answers = {}
    for dtype, path in paths.items():
        done = subprocess.run([sys.executable, "-c", LOADER, path, str(root / "images.npy"), str(root / "photo.jpg")],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 0, done.stderr[-3000:]
        answers[dtype] = json.loads(done.stdout.strip().splitlines()[-1])
    return paths, answers


@pytest.mark.large
def test_a_bfloat16_savedmodel_answers_all_three_signatures_in_float32_with_tensorflow_alone(exported):
    _, answers = exported
    answer = answers["bfloat16"]
    assert not answer["keras_cait_loaded"]
    for name, dtypes in answer["dtypes"].items():
        assert dtypes == {"probabilities": "float32", "top_k_classes": "string", "top_k_indices": "int32",
                          "top_k_probabilities": "float32"}, name
    # Close to the float32 export (every parameter random), and not equal to it: bfloat16 did compute.
    for name in ("serving_default", "serving_uint8"):
        float32 = np.array(answers["float32"]["probabilities"][name])
        bfloat16 = np.array(answer["probabilities"][name])
        assert np.abs(float32 - bfloat16).max() < 0.05, name
        assert np.mean(float32.argmax(1) == bfloat16.argmax(1)) >= 0.75, name
        assert not np.array_equal(float32, bfloat16)


@pytest.mark.large
def test_the_bfloat16_export_computes_its_matmuls_in_bfloat16(exported):
    paths, _ = exported
    bfloat16, float32 = 14, 1  # DataType enum values
    assert ("Conv2D", bfloat16) in matmul_dtypes(paths["bfloat16"])
    assert ("MatMul", bfloat16) in matmul_dtypes(paths["bfloat16"])
    assert ("BatchMatMulV2", bfloat16) in matmul_dtypes(paths["bfloat16"])
    assert {dtype for _, dtype in matmul_dtypes(paths["float32"])} == {float32}


def trained_scale_cait(rng, **kwargs):
    """A small float32 CaiT whose weights have the scales training gives them: kernels of std
    fan_in^-1/2, norms and LayerScale near 1. Every part then moves the logits by tens of % (with
    `small_model`'s weights of std 0.2 the attention branch is a few % of them, near bfloat16's error)."""
    model = build_cait(**{**dict(embed_dim=32, depth=2, num_heads=4, init_values=1.0, patch_size=8,
                                 input_shape=(SIDE, SIDE, 3), classes=10, classifier_activation=None), **kwargs})
    for weight in model.weights:
        shape, path = tuple(weight.shape), weight.path
        if path.endswith("layer_scale/gamma"):
            value = rng.uniform(0.5, 1.5, shape)
        elif path.endswith("norm/gamma"):
            value = rng.uniform(0.7, 1.3, shape)
        elif path.endswith("kernel"):
            value = rng.normal(0.0, np.prod(shape[:-1]) ** -0.5, shape)
        elif path.endswith(("bias", "beta")):
            value = rng.uniform(-0.2, 0.2, shape)
        else:  # position embedding, class token
            value = rng.normal(0.0, 0.5, shape)
        weight.assign(value.astype("float32"))
    return model


def test_the_bfloat16_forward_pass_mixes_the_heads_after_the_softmax():
    """What export_saved_model(precision="bfloat16") traces (`inference_form`) is far nearer the float32
    model than that model without its post-softmax talking-heads mix is (every parameter random; over
    25 seeds leaving the mix out moved the logits 25 to 100 times as far as bfloat16's rounding)."""
    rng = np.random.default_rng(5)
    model = trained_scale_cait(rng)
    images = rng.integers(0, 256, (4, SIDE, SIDE, 3)).astype("float32")
    reference = keras.ops.convert_to_numpy(model(images, training=False))
    bfloat16 = inference_form(model, compute_dtype="bfloat16")(tf.constant(images)).numpy()
    for block in (layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)):
        mix = block.attention.post_softmax_head_mix
        mix.kernel.assign(np.eye(mix.kernel.shape[0], dtype="float32"))
        mix.bias.assign(np.zeros(mix.bias.shape, "float32"))
    without_mix = keras.ops.convert_to_numpy(model(images, training=False))
    error, gap = np.abs(bfloat16 - reference).max(), np.abs(without_mix - reference).max()
    print(f"bfloat16: max |Δ| {error:.3g}; without the post-softmax mix: {gap:.3g}")
    assert 0 < error < gap / 8


def test_bfloat16_refuses_what_it_cannot_compute(tmp_path):
    model = small_model(seed=5)
    with pytest.raises(ValueError, match="choose one"):
        export_saved_model(model, str(tmp_path / "a" / "1"), compute_dtype="bfloat16", quantization="int8")
    with pytest.raises(ValueError, match="must be 'float32' or 'bfloat16'"):
        export_saved_model(model, str(tmp_path / "b" / "1"), compute_dtype="float16")
    # A classifier that is not CaiT's own graph (another head) has no folded form to compute in bf16.
    features = small_model(seed=5, include_top=False, pooling="token")
    other = keras.Model(features.input, keras.layers.Dense(3, activation="softmax")(features.output))
    with pytest.raises(ValueError, match="takes a CaiT classifier as build_cait makes it"):
        export_saved_model(other, str(tmp_path / "c" / "1"), compute_dtype="bfloat16", class_names=list("xyz"))
    assert not any(os.path.exists(tmp_path / name) for name in "abc")


@pytest.mark.parametrize("argv, message", [
    (["out.onnx", "--compute-dtype", "bfloat16"], "--compute-dtype bfloat16: ONNX .* computes in float32;.* For bfloat16, export to a SavedModel version folder"),
    (["out.xml", "--jit"], "--jit applies to a SavedModel version folder only"),
    (["serving/cait/1", "--compute-dtype", "bfloat16", "--quantization", "int8"], "choose one"),
])
def test_the_command_line_refuses_bfloat16_where_it_does_not_apply(argv, message, tmp_path, monkeypatch):
    from keras_cait.cli import commands

    monkeypatch.chdir(tmp_path)
    args = commands.build_parser().parse_args(["export", *argv])
    with pytest.raises(UserError, match=message):
        commands.export(args)


def xla_functions(path):
    """{name: op types} of the SavedModel's functions that XLA must compile (`_XlaMustCompile`)."""
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as file:
        saved.ParseFromString(file.read())
    library = {function.signature.name: function for function in saved.meta_graphs[0].graph_def.library.function}
    must = {node.attr["f"].func.name for function in library.values() for node in function.node_def
            if node.attr["_XlaMustCompile"].b}
    return {name: {node.op for node in library[name].node_def} for name in must}


@pytest.mark.large
def test_jit_compile_compiles_the_forward_pass_alone_and_answers_the_same(tmp_path):
    """`jit_compile=True` (keras-cait export --jit) marks the forward pass, and only it, for XLA:
    TF Serving without --xla_cpu_compilation_enabled refuses exactly such functions, and the
    default export has none. Its answers are the float32 export's."""
    import tensorflow as tf

    model = small_model(seed=6, classes=10)
    names = [f"class {i}" for i in range(10)]
    plain = export_saved_model(model, str(tmp_path / "plain" / "1"), class_names=names)
    compiled = export_saved_model(model, str(tmp_path / "xla" / "1"), class_names=names, jit_compile=True)
    assert xla_functions(plain) == {}
    compiled_functions = xla_functions(compiled)
    assert compiled_functions  # the forward pass: its matmuls, and none of the string ops around it
    for ops in compiled_functions.values():
        assert "MatMul" in ops and not {op for op in ops if op.startswith(("String", "Regex", "Decode", "AsString"))}
    images = tf.constant(np.random.RandomState(7).randint(0, 256, (3, SIDE, SIDE, 3)).astype("float32"))
    answers = [tf.saved_model.load(path).signatures["serving_default"](images=images)
               for path in (plain, compiled)]
    np.testing.assert_allclose(answers[1]["probabilities"], answers[0]["probabilities"], atol=2e-6)
    assert answers[1]["top_k_classes"].numpy().tolist() == answers[0]["top_k_classes"].numpy().tolist()
