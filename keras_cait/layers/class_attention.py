"""Class attention: only the class token attends (CaiT, Sec. 2.2)."""

import keras
from keras import ops

from keras_cait.layers.initializers import linear_kernel
from keras_cait.layers.quantization import sublayer_policy, with_quantized_sublayers
from keras_cait.layers.trainable import sublayers_follow


@keras.saving.register_keras_serializable(package="keras_cait")
class ClassAttention(keras.layers.Layer):
    """Multi-head attention in which the class token is the only query.

    With z = [x_class, x_patches] and H heads of size d, per head h:

        Q_h = x_class W_q,h + b_q,h           (one query)
        K_h = z W_k,h + b_k,h,   V_h = z W_v,h + b_v,h
        S_h = softmax(Q_h K_h^T d^-1/2)        (1 × (1 + N))
        y   = concat_h(S_h V_h) W_o + b_o

    The patch tokens are only read, never updated, so the cost is linear in the
    number of patches. The reference (timm `ClassAttn`) names the projections
    `q`, `k`, `v`, `proj`; here they are `query`, `key`, `value`,
    `output_projection`. Softmax runs in float32 under mixed precision.

    Args:
        num_heads: number of heads H; `channels` must be divisible by it.
        qkv_bias: whether the query/key/value projections have a bias.
        **kwargs: standard layer arguments.

    Shapes:
        input `(batch, 1 + patches, channels)` with the class token first;
        output `(batch, 1, channels)`, the class token's update. With
        `return_attention_scores=True` also `S` as `(batch, heads, 1, 1 + patches)`.

    Example:
        tokens = keras.random.normal((2, 197, 384))
        ClassAttention(num_heads=8)(tokens).shape  # (2, 1, 384)
    """

    def __init__(self, num_heads, qkv_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.qkv_bias = bool(qkv_bias)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels % self.num_heads:
            raise ValueError(
                f"{self.name}: {channels} channels cannot be split into "
                f"{self.num_heads} heads; channels must be a multiple of num_heads."
            )
        for name in ("query", "key", "value"):
            dense = keras.layers.Dense(
                channels,
                use_bias=self.qkv_bias,
                kernel_initializer=linear_kernel(),
                name=name,
                dtype=sublayer_policy(self, name),
            )
            dense.build(input_shape)
            setattr(self, name, dense)
        self.output_projection = keras.layers.Dense(
            channels,
            kernel_initializer=linear_kernel(),
            name="output_projection",
            dtype=sublayer_policy(self, "output_projection"),
        )
        self.output_projection.build(input_shape)
        sublayers_follow(self)

    def _split_heads(self, x):
        batch, tokens, channels = ops.shape(x)
        x = ops.reshape(x, (batch, tokens, self.num_heads, channels // self.num_heads))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, inputs, return_attention_scores=False):
        batch, _, channels = ops.shape(inputs)
        head_dim = channels // self.num_heads
        query = self._split_heads(self.query(inputs[:, :1]))
        key = self._split_heads(self.key(inputs))
        value = self._split_heads(self.value(inputs))

        query = query * ops.cast(head_dim**-0.5, query.dtype)
        logits = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2)))
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        weights = ops.cast(weights, self.compute_dtype)

        outputs = ops.matmul(weights, value)
        outputs = ops.reshape(ops.transpose(outputs, (0, 2, 1, 3)), (batch, 1, channels))
        outputs = self.output_projection(outputs)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1, input_shape[-1])

    def get_config(self):
        return with_quantized_sublayers(self, {
            **super().get_config(),
            "num_heads": self.num_heads,
            "qkv_bias": self.qkv_bias,
        })
