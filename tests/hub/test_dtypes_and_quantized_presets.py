"""Every dtype keras-hub passes a CaiT (a policy name, a DTypePolicy, a DTypePolicyMap), and quantized
presets: `backbone.quantize(mode)`, `save_to_preset`, `keras_hub.models.ImageClassifier.from_preset`."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import keras_hub
import numpy as np
import pytest

from keras_cait.hub import (
    CaiTBackbone,
    CaiTImageClassifier,
    CaiTImageClassifierPreprocessor,
    CaiTImageConverter,
)
from tests.conftest import TINY_CAIT, TINY_SIZE

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Keras quantizes Dense layers and warns for each other layer that has no quantized form.
pytestmark = pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")

# The layers that keep timm's float32 stream under a mixed policy (as torch.autocast leaves them).
FLOAT32_UNDER_MIXED = ("position_embedding", "class_token", "final_norm", "attention_norm", "mlp_norm",
                       "attention_layer_scale", "mlp_layer_scale", "stochastic_depth")
# max |quantized - float| / max |float| of the tiny classifier's logits, about twice what was measured
# (int8 0.015, int4 0.445, float8 0.080); an int8 kernel used without its scale moves them by 0.3.
QUANTIZATION_ERROR = {"int8": 0.04, "int4": 0.9, "float8": 0.2}


def tiny_backbone(seed=0, **kwargs):
    """A tiny backbone whose every weight is random (LayerScale and LayerNorm too, not their init)."""
    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT, **kwargs)
    rng = np.random.default_rng(seed)
    for weight in backbone.weights:
        scale = 1.0 / np.sqrt(weight.shape[0]) if len(weight.shape) == 2 else 0.3
        weight.assign(rng.normal(0.0, scale, weight.shape).astype("float32")
                      + (1.0 if weight.name == "gamma" and "norm" in weight.path else 0.0))
    return backbone


def tiny_classifier(backbone, num_classes=3):
    converter = CaiTImageConverter(image_size=(TINY_SIZE, TINY_SIZE))
    classifier = CaiTImageClassifier(backbone, num_classes, preprocessor=CaiTImageClassifierPreprocessor(converter))
    head = classifier.output_dense
    rng = np.random.default_rng(1)
    head.kernel.assign(rng.normal(0.0, 0.3, head.kernel.shape).astype("float32"))
    head.bias.assign(rng.normal(0.0, 0.3, head.bias.shape).astype("float32"))
    return classifier


def images(batch=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, 40, 52, 3)).astype("uint8")


def stream_and_matmul_dtypes(backbone):
    """({compute dtypes of the float32-stream layers}, {compute dtypes of the Dense layers})."""
    stream, dense = set(), set()
    for layer in backbone._flatten_layers(include_self=False):
        if layer.name in FLOAT32_UNDER_MIXED:
            stream.add(layer.compute_dtype)
        elif isinstance(layer, keras.layers.Dense):
            dense.add(layer.compute_dtype)
    return stream, dense


@pytest.mark.parametrize("dtype", [
    "mixed_bfloat16",
    keras.DTypePolicy("mixed_float16"),
    keras.dtype_policies.DTypePolicyMap("mixed_bfloat16"),
], ids=["name", "DTypePolicy", "DTypePolicyMap"])
def test_mixed_policies_keep_timm_s_float32_stream(dtype):
    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT, dtype=dtype)
    half = keras.dtype_policies.get(dtype).compute_dtype
    classifier = tiny_classifier(backbone)

    tokens = backbone(np.zeros((1, TINY_SIZE, TINY_SIZE, 3), "float32"))

    assert stream_and_matmul_dtypes(backbone) == ({"float32"}, {half})
    assert {weight.dtype for weight in backbone.weights} == {"float32"}
    assert keras.backend.standardize_dtype(tokens.dtype) == "float32"
    assert classifier.output_dense.compute_dtype == "float32"
    revived = CaiTBackbone.from_config(backbone.get_config())
    assert stream_and_matmul_dtypes(revived) == ({"float32"}, {half})


def test_a_dtype_policy_map_sets_each_layer_by_its_path():
    """keras-hub rebuilds a quantized backbone with one map of layer paths: each layer takes its own entry."""
    policy_map = keras.dtype_policies.DTypePolicyMap("float32")
    policy_map["self_attention_block_1/attention/qkv"] = keras.dtype_policies.get("int8_from_float32")
    policy_map["class_attention_block_0/mlp_dense_1"] = keras.dtype_policies.get("float8_from_float32")

    backbone = CaiTBackbone(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT, dtype=policy_map)

    modes = {layer.path: layer.quantization_mode for layer in backbone._flatten_layers()
             if isinstance(layer, keras.layers.Dense) and layer.quantization_mode}
    assert modes == {"self_attention_block_1/attention/qkv": "int8", "class_attention_block_0/mlp_dense_1": "float8"}
    assert stream_and_matmul_dtypes(backbone) == ({"float32"}, {"float32"})


@pytest.mark.large
def test_keras_hub_s_from_preset_passes_a_dtype_to_a_saved_cait(tmp_path):
    tiny_classifier(tiny_backbone()).save_to_preset(str(tmp_path / "preset"))

    loaded = keras_hub.models.ImageClassifier.from_preset(str(tmp_path / "preset"), dtype="mixed_bfloat16")

    assert stream_and_matmul_dtypes(loaded.backbone) == ({"float32"}, {"bfloat16"})
    assert loaded.predict(images(), verbose=0).dtype == "float32"


@pytest.mark.large
def test_a_released_preset_refuses_a_quantized_backbone_before_fetching_anything(no_network):
    policy_map = keras.dtype_policies.DTypePolicyMap("float32")
    policy_map["self_attention_block_0/mlp_dense_1"] = keras.dtype_policies.get("int8_from_float32")

    with pytest.raises(ValueError, match=r"cait_xxs24_224: the backbone's self_attention_block_0/mlp_dense_1/kernel "
                                         r"holds integers \(quantized\) .* then call backbone.quantize"):
        CaiTBackbone.from_preset("cait_xxs24_224", dtype=policy_map)


@pytest.mark.large
@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_a_quantized_preset_loads_back_through_keras_hub_with_equal_outputs(tmp_path, mode):
    classifier = tiny_classifier(tiny_backbone())
    float_logits = classifier.predict(images(), verbose=0)

    classifier.backbone.quantize(mode)
    classifier.make_predict_function(force=True)  # the one compiled before quantize() is float
    quantized_logits = classifier.predict(images(), verbose=0)
    classifier.save_to_preset(str(tmp_path / "preset"))
    loaded = keras_hub.models.ImageClassifier.from_preset(str(tmp_path / "preset"))

    assert type(loaded) is CaiTImageClassifier
    dense = [layer for layer in loaded.backbone._flatten_layers() if isinstance(layer, keras.layers.Dense)]
    assert {layer.quantization_mode for layer in dense} == {mode}
    np.testing.assert_array_equal(loaded.predict(images(), verbose=0), quantized_logits)
    error = np.abs(quantized_logits - float_logits).max() / np.abs(float_logits).max()
    assert 0 < error < QUANTIZATION_ERROR[mode], f"{mode}: logits moved by {error:.3g} of their range"
    config = json.loads((tmp_path / "preset" / "config.json").read_text())
    assert config["config"]["dtype"]["class_name"] == "DTypePolicyMap"


SAVE = """
import sys
import tests.conftest  # timm before TensorFlow, as pytest imports them (the other order aborts)
import numpy as np
from tests.hub.test_dtypes_and_quantized_presets import images, tiny_backbone, tiny_classifier

classifier = tiny_classifier(tiny_backbone())
classifier.backbone.quantize("int8")
classifier.save_to_preset(sys.argv[1])
np.save(sys.argv[2], classifier.predict(images(), verbose=0))
"""

LOAD = """
import sys
import numpy as np
import keras_hub
import keras_cait.hub  # registers CaiT's classes with Keras, as for any keras-hub model of another package

loaded = keras_hub.models.ImageClassifier.from_preset(sys.argv[1])
np.save(sys.argv[2], loaded.predict(np.load(sys.argv[3]), verbose=0))
print(sorted({layer.quantization_mode for layer in loaded.backbone._flatten_layers()
              if type(layer).__name__ == "Dense"}))
"""


def run_python(code, *args):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=REPOSITORY,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.mark.large
def test_a_quantized_preset_saved_by_one_process_loads_in_another_through_keras_hub(tmp_path):
    np.save(tmp_path / "images.npy", images())
    run_python(SAVE, tmp_path / "preset", tmp_path / "saved.npy")

    modes = run_python(LOAD, tmp_path / "preset", tmp_path / "loaded.npy", tmp_path / "images.npy")

    assert modes.splitlines()[-1] == "['int8']"
    np.testing.assert_array_equal(np.load(tmp_path / "loaded.npy"), np.load(tmp_path / "saved.npy"))
