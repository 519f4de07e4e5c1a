"""CaiT's two kinds of block, each a pre-norm residual layer with LayerScale and stochastic depth.

    SelfAttentionBlock    the patches attend to the patches (talking heads), then an MLP
    ClassAttentionBlock   the class token attends to [class token, patches], then an MLP;
                          the patches pass through unchanged
"""

import keras
from keras import ops

from keras_cait.layers import ClassAttention, LayerScale, StochasticDepth, TalkingHeadsAttention
from keras_cait.layers.initializers import linear_kernel
from keras_cait.layers.quantization import sublayer_policy, with_quantized_sublayers
from keras_cait.layers.trainable import sublayers_follow
from keras_cait.models import precision

LAYER_NORM_EPSILON = 1e-6


def float32_gelu(hidden):
    """The exact (erf) GELU, computed in float32 and rounded once to the dtype of `hidden`, as
    PyTorch's half-precision GELU does. In bfloat16 TensorFlow's CPU kernels round each of its
    steps and took 5 % more of a block's training step."""
    return ops.cast(ops.gelu(ops.cast(hidden, "float32"), approximate=False), hidden.dtype)


_rematerialized_gelu = keras.remat(float32_gelu)


class _ResidualBlock(keras.layers.Layer):
    """What both CaiT blocks share: x + SD(λ_1 · attention) then x + SD(λ_2 · MLP).

    Under a mixed policy the residual stream x, the LayerScale multiply and the
    residual adds stay float32 while the attention and MLP matmuls run in half
    precision, as in timm under torch.autocast (its gamma is a float32 parameter,
    so gamma × branch and x + ... are float32). A half-precision stream would
    round away the 1e-5-scaled updates of the blocks at their initialisation.
    """

    attention_class = None

    def __init__(
        self,
        num_heads,
        mlp_ratio=4.0,
        init_values=1e-5,
        drop_path_rate=0.0,
        qkv_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_ratio = float(mlp_ratio)
        self.init_values = float(init_values)
        self.drop_path_rate = float(drop_path_rate)
        self.qkv_bias = bool(qkv_bias)

    @property
    def input_dtype(self):
        # The stream enters in the variables' dtype (float32 under a mixed policy)
        # rather than being cast to the half compute dtype.
        return self.dtype_policy.variable_dtype

    def build(self, input_shape):
        channels = input_shape[-1]
        policy = self.dtype_policy
        stream_policy = precision.float32_if_mixed(policy)

        def norm(name):
            return keras.layers.LayerNormalization(
                epsilon=LAYER_NORM_EPSILON, name=name, dtype=precision.float32_if_mixed(policy)
            )

        self.attention_norm = norm("attention_norm")
        self.attention = self.attention_class(
            self.num_heads, qkv_bias=self.qkv_bias, name="attention", dtype=policy
        )
        self.attention_layer_scale = LayerScale(
            self.init_values, name="attention_layer_scale", dtype=stream_policy
        )
        self.mlp_norm = norm("mlp_norm")
        # GELU is applied in _mlp_residual, in float32.
        self.mlp_dense_1 = keras.layers.Dense(
            int(channels * self.mlp_ratio),
            kernel_initializer=linear_kernel(),
            name="mlp_dense_1",
            dtype=sublayer_policy(self, "mlp_dense_1"),
        )
        self.mlp_dense_2 = keras.layers.Dense(
            channels, kernel_initializer=linear_kernel(), name="mlp_dense_2",
            dtype=sublayer_policy(self, "mlp_dense_2"),
        )
        self.mlp_layer_scale = LayerScale(
            self.init_values, name="mlp_layer_scale", dtype=stream_policy
        )
        self.stochastic_depth = StochasticDepth(
            self.drop_path_rate, name="stochastic_depth", dtype=stream_policy
        )

        token_shape = (None, None, channels)
        for layer in (self.attention_norm, self.attention, self.mlp_norm, self.mlp_dense_1):
            layer.build(token_shape)
        self.attention_layer_scale.build(token_shape)
        self.mlp_dense_2.build((None, None, int(channels * self.mlp_ratio)))
        self.mlp_layer_scale.build(token_shape)
        # Built here too: compute_output_spec skips call(), and model.quantize() refuses unbuilt layers.
        self.stochastic_depth.build(token_shape)
        sublayers_follow(self)

    def _mlp_residual(self, x, training):
        hidden = self.mlp_dense_1(self.mlp_norm(x))
        if hidden.dtype != "float32" and keras.backend.backend() == "jax":
            # Recomputed in the backward pass from its half-precision input: otherwise JAX keeps
            # the float32 copy of the MLP's widest tensor for it, and XLA:GPU writes and reads
            # it again (S24 at batch 128: 9 % of the training step's memory traffic,
            # docs/benchmarks.md). Not on TensorFlow, whose CPU step is not bound by it.
            hidden = _rematerialized_gelu(hidden)
        else:
            hidden = float32_gelu(hidden)
        branch = self.mlp_dense_2(hidden)
        return x + self.stochastic_depth(self.mlp_layer_scale(branch), training=training)

    def get_config(self):
        return with_quantized_sublayers(self, {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
            "init_values": self.init_values,
            "drop_path_rate": self.drop_path_rate,
            "qkv_bias": self.qkv_bias,
        })


@keras.saving.register_keras_serializable(package="keras_cait")
class SelfAttentionBlock(_ResidualBlock):
    """A CaiT self-attention block over the patch tokens (reference: `blocks.i`).

        x = x + SD(λ_1 · TalkingHeadsAttention(LN(x)))
        x = x + SD(λ_2 · MLP(LN(x)))
    """

    attention_class = TalkingHeadsAttention

    def call(self, patches, training=None, return_attention_scores=False):
        attended = self.attention(
            self.attention_norm(patches), return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            attended, scores = attended
        x = patches + self.stochastic_depth(
            self.attention_layer_scale(attended), training=training
        )
        x = self._mlp_residual(x, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, patches, training=None, return_attention_scores=False):
        output = keras.KerasTensor(patches.shape, dtype=self.input_dtype)
        if not return_attention_scores:
            return output
        batch, tokens = patches.shape[0], patches.shape[1]
        scores_shape = (batch, self.num_heads, tokens, tokens)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="keras_cait")
class ClassAttentionBlock(_ResidualBlock):
    """A CaiT class-attention block (reference: `blocks_token_only.i`).

        z      = [x_class, x_patches]
        x_class = x_class + SD(λ_1 · ClassAttention(LN(z)))
        x_class = x_class + SD(λ_2 · MLP(LN(x_class)))

    Called as `block([patches, class_token])`; returns the new class token only:
    the patches are left as they are.
    """

    attention_class = ClassAttention

    def build(self, input_shape):
        super().build(input_shape[0])

    def call(self, inputs, training=None, return_attention_scores=False):
        patches, class_token = inputs
        tokens = ops.concatenate([class_token, patches], axis=1)
        attended = self.attention(
            self.attention_norm(tokens), return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            attended, scores = attended
        x = class_token + self.stochastic_depth(
            self.attention_layer_scale(attended), training=training
        )
        x = self._mlp_residual(x, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape[1]

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        patches, class_token = inputs
        output = keras.KerasTensor(class_token.shape, dtype=self.input_dtype)
        if not return_attention_scores:
            return output
        tokens = None if patches.shape[1] is None else 1 + patches.shape[1]
        scores_shape = (patches.shape[0], self.num_heads, 1, tokens)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)
