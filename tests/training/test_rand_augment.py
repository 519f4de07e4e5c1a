"""RandAugment computes only the drawn ops and gives Keras core's RandAugment's images, bit for bit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_cait.training import RandAugment, rand_augment


def photos(batch=None):
    rng = np.random.default_rng(0)
    shape = (24, 32, 3) if batch is None else (batch, 24, 32, 3)
    # Smooth gradients plus noise: every op (equalisation, posterisation, sharpness...) changes them.
    return (rng.uniform(0, 255, shape) * 0.5 + np.linspace(0, 127, 32)[:, None]).astype("float32")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("batch", [None, 4])
def test_the_same_images_as_keras_randaugment_for_the_same_seed(seed, batch):
    arguments = dict(value_range=(0, 255), num_ops=2, factor=0.075, seed=seed)
    ours, keras_own = RandAugment(**arguments), keras.layers.RandAugment(**arguments)
    images = photos(batch)
    for _ in range(3):  # successive draws of the layers' seed generators
        want = keras.ops.convert_to_numpy(keras_own(images))
        got = keras.ops.convert_to_numpy(ours(images))
        assert not np.array_equal(want, images)
        np.testing.assert_array_equal(got, want)


def test_in_tf_data_it_runs_only_the_drawn_ops():
    """Keras' layer traces all 11 ops per drawn op; ours puts them in one switch per op."""
    image = tf.constant(photos())

    def traced(layer):
        graph = tf.function(lambda x: layer(x)).get_concrete_function(tf.TensorSpec(image.shape)).graph
        return [op.type for op in graph.get_operations()]

    ours = traced(rand_augment(9, seed=0))
    keras_own = traced(keras.layers.RandAugment(value_range=(0, 255), factor=0.075, seed=0))
    assert ours.count("StatelessCase") + ours.count("Case") == 2
    assert keras_own.count("StatelessCase") + keras_own.count("Case") == 0
    assert keras_own.count("SelectV2") >= 22  # every op, twice, then chosen by `where`


def test_inference_passes_images_through():
    images = photos(2)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(rand_augment(9)(images, training=False)), images)


def test_it_round_trips_its_config():
    layer = rand_augment(9, num_ops=3, seed=1)
    again = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(again) is RandAugment and again.get_config() == layer.get_config()


TRACE = """
import json, sys
import numpy as np, tensorflow as tf
from keras_cait.training import rand_augment

images = np.asarray(json.load(sys.stdin), "float32")
layer = rand_augment(9, seed=0)
definition = tf.function(layer).get_concrete_function(tf.TensorSpec(images.shape[1:])).graph.as_graph_def()
ops = [node.op for node in definition.node]
ops += [node.op for function in definition.library.function for node in function.node_def]
equalised = [image.numpy().tolist() for image in
             tf.data.Dataset.from_tensor_slices(images).map(lambda image: layer.equalization(image))]
print(json.dumps({"ops": len(ops), "bincount": "Bincount" in ops or "DenseBincount" in ops,
                  "equalised": equalised}))
"""


@pytest.mark.large
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_in_tf_data_its_equalisation_is_tensorflows_bincount_under_any_backend(backend):
    """Under KERAS_BACKEND=jax, Keras' Equalization put JAX's 256-step histogram loop into tf.data
    (16 times the ops); ours counts with bincount there too, and equalises the same."""
    import json
    import os
    import subprocess
    import sys

    images = photos(3)
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", TRACE], input=json.dumps(images.tolist()), env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    traced = json.loads(done.stdout.strip().splitlines()[-1])
    assert traced["bincount"]
    assert traced["ops"] < 2000  # Keras' loop: 256 (Equal, Cast, Sum, ...) per channel and drawn op
    equalization = keras.layers.Equalization(value_range=(0, 255))  # this process: TensorFlow's
    want = [keras.ops.convert_to_numpy(equalization(image)) for image in images]
    np.testing.assert_array_equal(np.asarray(traced["equalised"], "float32"), want)
