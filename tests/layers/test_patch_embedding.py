"""keras_cait.layers.PatchEmbedding."""

import keras
import numpy as np

from keras_cait.layers import PatchEmbedding
from tests.layers.reference import randomize


def test_patch_embedding_projects_each_patch_in_row_major_order():
    layer = PatchEmbedding(8, patch_size=4)
    images = np.random.RandomState(0).normal(size=(2, 8, 12, 3)).astype("float32")
    layer.build(images.shape)
    randomize(layer)
    tokens = keras.ops.convert_to_numpy(layer(images))
    assert tokens.shape == (2, 6, 8)
    kernel = keras.ops.convert_to_numpy(layer.projection.kernel).reshape(-1, 8)
    bias = keras.ops.convert_to_numpy(layer.projection.bias)
    for index, (row, col) in enumerate((r, c) for r in range(2) for c in range(3)):
        patch = images[:, 4 * row:4 * row + 4, 4 * col:4 * col + 4, :].reshape(2, -1)
        np.testing.assert_allclose(tokens[:, index], patch @ kernel + bias, rtol=1e-4, atol=1e-5)
