"""keras_cait.layers.ClassToken."""

import keras
import numpy as np

from keras_cait.layers import ClassToken
from tests.layers.reference import randomize


def test_class_token_is_one_learned_vector_repeated_over_the_batch():
    layer = ClassToken()
    patches = np.zeros((3, 5, 4), "float32")
    layer.build(patches.shape)
    randomize(layer)
    out = keras.ops.convert_to_numpy(layer(patches))
    assert out.shape == (3, 1, 4)
    np.testing.assert_array_equal(out, np.repeat(keras.ops.convert_to_numpy(layer.token), 3, axis=0))
