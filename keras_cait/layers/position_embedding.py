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


def source_grid_of(embedding, grid_size=None):
    """The `(rows, cols)` grid that a `(1, tokens, D)` position embedding covers.

    A stated `grid_size` (saved beside the weights) must hold exactly `tokens`
    positions. Without one (weights saved before the grid was recorded, timm
    and DeiT checkpoints) the grid is taken to be square, as all released CaiT
    checkpoints are.

    Raises:
        ValueError: naming the embedding's shape and the grid it does not fit.
    """
    shape = tuple(np.shape(embedding))
    tokens = shape[1]
    if grid_size is not None:
        rows, cols = (int(side) for side in grid_size)
        if rows * cols != tokens:
            raise ValueError(
                f"A position embedding of shape {shape} cannot cover the stated grid "
                f"{rows}×{cols} ({rows * cols} positions): the weights and their grid "
                "disagree; save the weights again from the model they belong to."
            )
        return rows, cols
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(
            f"A position embedding of shape {shape} states no grid and {tokens} is not "
            "a square number of patches (e.g. 196 = 14×14): its rows and columns are "
            "unknown. Pass its grid (source_grid=(rows, cols)), or save the weights "
            "with this version of keras_cait, which records it."
        )
    return side, side


def resize_position_embedding(embedding, grid_size, source_grid=None):
    """Resizes a `(1, rows*cols, D)` position embedding to another patch grid.

    Uses bicubic interpolation over the source grid with half-pixel centres and
    edge clamping, i.e. `torch.nn.functional.interpolate(..., mode="bicubic",
    align_corners=False)` as in DeiT's fine-tuning code, rows and columns each
    at their own scale. CaiT's position embedding has no class-token row, so
    every row is a grid position.

    Args:
        embedding: array of shape `(1, tokens, D)`.
        grid_size: target `(rows, cols)`.
        source_grid: `(rows, cols)` of `embedding`; None: square (see
            `source_grid_of`).

    Returns:
        float32 array of shape `(1, rows*cols, D)`.
    """
    embedding = np.asarray(embedding)
    source_rows, source_cols = source_grid_of(embedding, source_grid)
    dim = embedding.shape[2]
    rows, cols = grid_size
    grid = embedding[0].reshape(source_rows, source_cols, dim).astype(np.float64)
    resized = np.einsum(
        "rh,hwd,cw->rcd",
        _bicubic_matrix(source_rows, rows),
        grid,
        _bicubic_matrix(source_cols, cols),
    )
    return resized.reshape(1, rows * cols, dim).astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_cait")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding to each patch token: x_p + e_p.

    CaiT's position embedding covers the patch grid only (no class-token slot).
    Saved weights (`.weights.h5`, `.keras`) record the grid's `(rows, cols)`
    beside the table, under the key `grid_size`; weights saved for another grid
    are resized bicubically from that grid when loaded (see
    `resize_position_embedding`), so pretrained weights work at any input size
    whose sides are multiples of the patch size, square or not. Files written
    before the record existed load as before: as they are when the table fits,
    else resized from a square grid. The reference names the parameter
    `pos_embed`.

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

    def save_own_variables(self, store):
        super().save_own_variables(store)
        store["grid_size"] = np.array(self.grid_size, dtype="int32")

    def load_own_variables(self, store):
        value = np.asarray(store["0"])
        stated = tuple(np.asarray(store["grid_size"])) if "grid_size" in store.keys() else None
        if stated is not None or value.shape != tuple(self.embeddings.shape):
            source_grid = source_grid_of(value, stated)
            if source_grid != self.grid_size:
                value = resize_position_embedding(value, self.grid_size, source_grid)
        self.embeddings.assign(value)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size}
