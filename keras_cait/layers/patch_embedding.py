"""PatchEmbedding: non-overlapping patches projected to tokens."""

import keras
from keras import ops

from keras_cait.layers.initializers import torch_default_uniform
from keras_cait.layers.trainable import sublayers_follow


@keras.saving.register_keras_serializable(package="keras_cait")
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image into P×P patches and projects each one linearly.

        x_p = W · vec(patch_p) + b,   p = 1 ... (H/P)(W/P)

    implemented as a P×P convolution with stride P, flattened row by row.
    The reference (timm `PatchEmbed`) names the convolution `patch_embed.proj`.

    Args:
        embed_dim: token width D.
        patch_size: side P of the square patches.
        **kwargs: standard layer arguments.

    Shapes:
        input `(batch, height, width, channels)`, sides multiples of P;
        output `(batch, (height/P)·(width/P), D)`.

    Example:
        images = keras.random.normal((2, 224, 224, 3))
        PatchEmbedding(384, patch_size=16)(images).shape  # (2, 196, 384)
    """

    def __init__(self, embed_dim, patch_size=16, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = int(embed_dim)
        self.patch_size = int(patch_size)

    def build(self, input_shape):
        # PyTorch's default init, which timm's CaiT keeps for this convolution.
        fan_in = self.patch_size * self.patch_size * input_shape[-1]
        self.projection = keras.layers.Conv2D(
            self.embed_dim,
            self.patch_size,
            strides=self.patch_size,
            data_format="channels_last",  # whatever keras.config.image_data_format() says
            kernel_initializer=torch_default_uniform(fan_in),
            bias_initializer=torch_default_uniform(fan_in),
            name="projection",
            dtype=self.dtype_policy,
        )
        self.projection.build(input_shape)
        sublayers_follow(self)

    def call(self, images):
        patches = self.projection(images)
        batch, rows, cols, channels = ops.shape(patches)
        return ops.reshape(patches, (batch, rows * cols, channels))

    def compute_output_shape(self, input_shape):
        _, height, width, _ = input_shape
        if height is None or width is None:
            return (input_shape[0], None, self.embed_dim)
        tokens = (height // self.patch_size) * (width // self.patch_size)
        return (input_shape[0], tokens, self.embed_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "patch_size": self.patch_size,
        }
