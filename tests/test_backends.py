"""The layers and a small model give the same numbers on the JAX and PyTorch backends.

Keras fixes its backend at import, so each backend runs in its own process and
loads weights saved here (on the TensorFlow backend).
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.layers.reference import randomize

CLASSES = 10

SCRIPT = """
import json, sys
import keras, numpy as np
from keras_cait.models.architecture import build_cait
from keras_cait.layers import StochasticDepth
args = json.loads(sys.argv[1])
model = build_cait(**args["config"], drop_path_rate=0.2)
model.load_weights(args["weights"])
images = np.load(args["images"])
outputs = {"probabilities": keras.ops.convert_to_numpy(model(images, training=False))}
block = model.get_layer("self_attention_block_1")
tokens = keras.Model(model.input, model.get_layer("self_attention_block_0").output)(images)
_, scores = block(tokens, return_attention_scores=True)
outputs["self_attention_scores"] = keras.ops.convert_to_numpy(scores)
_, class_scores = model.get_layer("class_attention_block_0")(
    [tokens, keras.ops.zeros((2, 1, args["config"]["embed_dim"]))], return_attention_scores=True)
outputs["class_attention_scores"] = keras.ops.convert_to_numpy(class_scores)
dropped = keras.ops.convert_to_numpy(StochasticDepth(0.5, seed=0)(np.ones((64, 3), "float32"), training=True))
outputs["drop_fraction"] = np.array((dropped == 0).mean())
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
history = model.fit(images, np.array([1, 2]), epochs=3, verbose=0)
outputs["losses"] = np.array(history.history["loss"])
np.savez(args["out"], backend=keras.backend.backend(), **outputs)
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_cait):
    directory = tmp_path_factory.mktemp("backends")
    model = tiny_cait(classes=CLASSES)
    # What the other backends' processes pass to build_cait: tiny_cait(classes=CLASSES)'s arguments.
    config = {**TINY_CAIT, "input_shape": (TINY_SIZE, TINY_SIZE, 3), "classes": CLASSES}
    randomize(model, seed=3, scale=0.2)
    weights = str(directory / "small.weights.h5")
    model.save_weights(weights)
    images = np.random.RandomState(0).uniform(0, 255, (2, TINY_SIZE, TINY_SIZE, 3)).astype("float32")
    np.save(directory / "images.npy", images)
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    return dict(
        directory=directory, config=config, weights=weights, images=str(directory / "images.npy"), expected=expected
    )


@pytest.mark.large
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_model_runs_and_trains_on_backend(backend, reference):
    out = str(reference["directory"] / f"{backend}.npz")
    args = dict(config=reference["config"], weights=reference["weights"], images=reference["images"], out=out)
    env = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(args)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = np.load(out)
    assert str(result["backend"]) == backend
    np.testing.assert_allclose(result["probabilities"], reference["expected"], rtol=1e-4, atol=1e-6)
    scores = result["self_attention_scores"]
    assert scores.shape == (2, TINY_CAIT["num_heads"], 4, 4) and np.all(np.isfinite(scores))
    class_scores = result["class_attention_scores"]
    np.testing.assert_allclose(class_scores.sum(-1), 1.0, rtol=1e-5)
    assert 0.2 < float(result["drop_fraction"]) < 0.8
    losses = result["losses"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
