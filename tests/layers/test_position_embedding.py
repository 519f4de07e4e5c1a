"""keras_cait.layers.PositionEmbedding."""

import keras
import numpy as np

from keras_cait.layers import PositionEmbedding
from keras_cait.model import build_cait
from tests.layers.reference import randomize


def test_position_embedding_adds_one_vector_per_grid_position():
    layer = PositionEmbedding((2, 3))
    x = np.random.RandomState(0).normal(size=(2, 6, 4)).astype("float32")
    layer.build(x.shape)
    randomize(layer)
    table = keras.ops.convert_to_numpy(layer.embeddings)
    assert table.shape == (1, 6, 4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), x + table, rtol=1e-6)


def test_position_embedding_saved_for_one_grid_loads_resized_into_another(tmp_path):
    small = build_cait(embed_dim=32, depth=1, num_heads=2, init_values=0.1, input_shape=(64, 64, 3))
    randomize(small.get_layer("position_embedding"), seed=5)
    path = str(tmp_path / "small.weights.h5")
    small.save_weights(path)
    large = build_cait(embed_dim=32, depth=1, num_heads=2, init_values=0.1, input_shape=(96, 64, 3))
    large.load_weights(path)
    from keras_cait.layers.position_embedding import resize_position_embedding

    expected = resize_position_embedding(
        keras.ops.convert_to_numpy(small.get_layer("position_embedding").embeddings), (6, 4)
    )
    got = keras.ops.convert_to_numpy(large.get_layer("position_embedding").embeddings)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert got.shape == (1, 24, 32)
