"""PositionEmbedding: learned absolute positions of the patch grid."""

import math

import keras
import numpy as np
from keras import ops

from keras_cait.layers.initializers import linear_kernel

_BICUBIC_A = -0.75  # the cubic-convolution constant of PyTorch's bicubic mode


def _cubic_weights(t):
    """Weights of the 4 neighbours at offsets -1, 0, 1, 2 for a fraction t."""
    a = _BICUBIC_A

    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def _bicubic_matrix(size_in, size_out):
    """(size_out, size_in) matrix of 1-D bicubic resampling, half-pixel centres."""
    matrix = np.zeros((size_out, size_in), dtype=np.float64)
    source = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    start = np.floor(source).astype(int)
    weights = _cubic_weights(source - start)
    for row in range(size_out):
        for tap in range(4):
            column = min(max(start[row] - 1 + tap, 0), size_in - 1)
            matrix[row, column] += weights[row, tap]
    return matrix


def resize_position_embedding(embedding, grid_size):
    """Resizes a `(1, rows*cols, D)` position embedding to another patch grid.

    Uses bicubic interpolation over the square source grid with half-pixel
    centres and edge clamping, i.e. `torch.nn.functional.interpolate(...,
    mode="bicubic", align_corners=False)` as in DeiT's fine-tuning code. CaiT's
    position embedding has no class-token row, so every row is a grid position.

    Args:
        embedding: array of shape `(1, tokens, D)`, `tokens` a perfect square.
        grid_size: target `(rows, cols)`.

    Returns:
        float32 array of shape `(1, rows*cols, D)`.
    """
    embedding = np.asarray(embedding)
    tokens, dim = embedding.shape[1], embedding.shape[2]
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(
            f"Cannot resize a position embedding of {tokens} tokens: the source "
            "grid must be square (e.g. 196 = 14×14) to know its rows and columns."
        )
    rows, cols = grid_size
    grid = embedding[0].reshape(side, side, dim).astype(np.float64)
    resized = np.einsum(
        "rh,hwd,cw->rcd", _bicubic_matrix(side, rows), grid, _bicubic_matrix(side, cols)
    )
    return resized.reshape(1, rows * cols, dim).astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_cait")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding to each patch token: x_p + e_p.

    CaiT's position embedding covers the patch grid only (no class-token slot).
    Weights saved for another grid are resized bicubically when loaded (see
    `resize_position_embedding`), so pretrained weights work at any input size
    whose sides are multiples of the patch size. The reference names the
    parameter `pos_embed`.

    Args:
        grid_size: `(rows, cols)` of the patch grid.
        **kwargs: standard layer arguments.

    Shapes:
        input and output `(batch, rows*cols, channels)`.

    Example:
        patches = keras.random.normal((2, 196, 384))
        PositionEmbedding(grid_size=(14, 14))(patches).shape  # (2, 196, 384)
    """

    def __init__(self, grid_size, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(side) for side in grid_size)

    def build(self, input_shape):
        rows, cols = self.grid_size
        if input_shape[1] is not None and input_shape[1] != rows * cols:
            raise ValueError(
                f"{self.name}: got {input_shape[1]} tokens, but the grid "
                f"{rows}×{cols} has {rows * cols}."
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(1, rows * cols, input_shape[-1]),
            initializer=linear_kernel(),
        )

    def call(self, inputs):
        return inputs + ops.cast(self.embeddings, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def load_own_variables(self, store):
        value = np.asarray(store["0"])
        if value.shape != tuple(self.embeddings.shape):
            value = resize_position_embedding(value, self.grid_size)
        self.embeddings.assign(value)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size}
