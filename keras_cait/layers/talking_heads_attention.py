"""Multi-head self-attention with talking heads (Shazeer et al. 2020), as in CaiT."""

import os

import keras
from keras import ops

from keras_cait.layers.initializers import linear_kernel
from keras_cait.layers.quantization import sublayer_policy, with_quantized_sublayers
from keras_cait.layers.trainable import sublayers_follow

FUSED_ATTENTION_VARIABLE = "KERAS_CAIT_FUSED_ATTENTION"


@keras.saving.register_keras_serializable(package="keras_cait")
class TalkingHeadsAttention(keras.layers.Layer):
    """Self-attention whose heads exchange information before and after softmax.

    With H heads of size d, per head h:

        A_h = (x W_q,h d^-1/2)(x W_k,h)^T                    attention logits
        A'  = P_l A + b_l            (mixing over h)          pre-softmax head mix
        S   = softmax(A')            (over keys)
        S'  = P_w S + b_w            (mixing over h)          post-softmax head mix
        y   = concat_h(S'_h x W_v,h) W_o + b_o

    P_l, P_w are learned H×H matrices. The reference (timm `TalkingHeadAttn`) names
    them `proj_l` and `proj_w`; here they are `pre_softmax_head_mix` and
    `post_softmax_head_mix`. Softmax runs in float32 under mixed precision.

    On the JAX backend with a GPU, everything from the logits to `S' V` runs in
    fused Pallas kernels (`keras_cait.kernels.talking_heads_pallas`: one forward,
    two backward), which keep no (batch, heads, tokens, tokens) tensor in memory
    between the passes; everywhere else,
    and when the scores are returned or a mix is quantized, the layer runs the
    keras.ops below. Both give the same numbers within rounding. Neither adds
    the pre-softmax bias `b_l`: it is the same for every key of a row, which
    the softmax cancels, so it changes no output and its gradient is exactly
    zero. The weight stays (checkpoints hold it) as a non-trainable one, so no
    optimizer spends a step on it (AdamW excludes biases from weight decay, so
    it never moved in training either). The layer has no attention dropout;
    CaiT's stochastic depth acts on the block around it.

    Args:
        num_heads: number of heads H; `channels` must be divisible by it.
        qkv_bias: whether the query/key/value projection has a bias.
        fused_attention: None (the default): the fused kernel on the JAX
            backend with a GPU where its tiles fit the chip (heads times the
            tokens rounded up to a power of two at most 8 × 256: CaiT's
            224-pixel models, not its 384- and 448-pixel ones), unless the
            environment variable `KERAS_CAIT_FUSED_ATTENTION=0` turns it off
            (for whole models, whose blocks build this layer with the default)
            or a Keras distribution (`--strategy dataparallel`) spreads the
            batch over devices. False: never. True: on the JAX backend always,
            off a GPU in Pallas' interpreter (slow: for tests); other backends
            have no such kernel.
        **kwargs: standard layer arguments.

    Shapes:
        input `(batch, tokens, channels)`; output the same. With
        `return_attention_scores=True` also `S'` as `(batch, heads, tokens, tokens)`.

    Example:
        tokens = keras.random.normal((2, 196, 384))
        TalkingHeadsAttention(num_heads=8)(tokens).shape  # (2, 196, 384)
    """

    def __init__(self, num_heads, qkv_bias=True, fused_attention=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.qkv_bias = bool(qkv_bias)
        self.fused_attention = None if fused_attention is None else bool(fused_attention)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels % self.num_heads:
            raise ValueError(
                f"{self.name}: {channels} channels cannot be split into "
                f"{self.num_heads} heads; channels must be a multiple of num_heads."
            )
        heads = self.num_heads
        self.qkv = keras.layers.Dense(
            3 * channels,
            use_bias=self.qkv_bias,
            kernel_initializer=linear_kernel(),
            name="qkv",
            dtype=sublayer_policy(self, "qkv"),
        )
        self.pre_softmax_head_mix = keras.layers.Dense(
            heads,
            kernel_initializer=linear_kernel(),
            name="pre_softmax_head_mix",
            dtype=sublayer_policy(self, "pre_softmax_head_mix"),
        )
        self.post_softmax_head_mix = keras.layers.Dense(
            heads,
            kernel_initializer=linear_kernel(),
            name="post_softmax_head_mix",
            dtype=sublayer_policy(self, "post_softmax_head_mix"),
        )
        self.output_projection = keras.layers.Dense(
            channels,
            kernel_initializer=linear_kernel(),
            name="output_projection",
            dtype=sublayer_policy(self, "output_projection"),
        )
        self.qkv.build(input_shape)
        self.pre_softmax_head_mix.build((None, heads))
        self.post_softmax_head_mix.build((None, heads))
        self.output_projection.build(input_shape)
        self._freeze_cancelled_bias()
        sublayers_follow(self)

    def _freeze_cancelled_bias(self):
        """The pre-softmax mix's bias is never trained (the softmax cancels it), also after the
        layers around it are frozen and unfrozen: `layer.trainable = True` unfreezes every weight."""
        mix = getattr(self, "pre_softmax_head_mix", None)
        if mix is not None and mix.built:
            mix.bias.trainable = False

    @keras.layers.Layer.trainable.setter
    def trainable(self, value):
        keras.layers.Layer.trainable.fset(self, value)
        self._freeze_cancelled_bias()

    def _mix_heads(self, scores, dense, bias=True):
        if dense.quantization_mode is not None:
            # A quantized kernel (model.quantize) holds integers and its scale: only the
            # layer's own call computes with it, over the heads as the last axis.
            return ops.transpose(dense(ops.transpose(scores, (0, 2, 3, 1))), (0, 3, 1, 2))
        # scores (B, H, N, M) -> (B, H, N*M) so that mixing the heads is one matmul
        # of the transposed H×H kernel with no transposes of the large tensor.
        batch, heads, queries, keys = ops.shape(scores)
        flat = ops.reshape(scores, (batch, heads, queries * keys))
        kernel = ops.cast(ops.transpose(dense.kernel), scores.dtype)
        mixed = ops.matmul(kernel, flat)
        if bias:
            mixed = mixed + ops.cast(dense.bias, scores.dtype)[:, None]
        return ops.reshape(mixed, (batch, heads, queries, keys))

    def _runs_fused_kernel(self, return_attention_scores, tokens):
        """Whether a call over `tokens` tokens runs the Pallas kernel: see `fused_attention` in the
        class docstring."""
        if return_attention_scores or self.fused_attention is False or keras.backend.backend() != "jax":
            return False
        mixes = (self.pre_softmax_head_mix, self.post_softmax_head_mix)
        if any(mix.quantization_mode is not None for mix in mixes):
            return False
        if self.fused_attention:
            return True
        if os.environ.get(FUSED_ATTENTION_VARIABLE) == "0" or keras.distribution.distribution() is not None:
            # XLA cannot split a Pallas call across devices: it would gather the whole batch on each.
            return False
        from keras_cait.kernels.talking_heads_pallas import fits_on_chip, on_gpu

        return on_gpu() and fits_on_chip(tokens, self.num_heads)

    def call(self, inputs, return_attention_scores=False):
        batch, tokens, channels = ops.shape(inputs)
        head_dim = channels // self.num_heads
        # The projection's columns are [q | k | v], each head after head.
        projected = self.qkv(inputs)
        if self._runs_fused_kernel(return_attention_scores, tokens):
            from keras_cait.kernels.talking_heads_pallas import talking_heads_attention_qkv

            # The kernels read q, k, v where the projection put them (a reshape, no copy).
            outputs = talking_heads_attention_qkv(
                ops.reshape(projected, (batch, tokens, 3, self.num_heads, head_dim)),
                ops.cast(self.pre_softmax_head_mix.kernel, "float32"),
                ops.cast(self.post_softmax_head_mix.kernel, "float32"),
                ops.cast(self.post_softmax_head_mix.bias, "float32"),
                scale=head_dim**-0.5,
            )
            return self.output_projection(ops.reshape(outputs, (batch, tokens, channels)))
        # Split before the heads are moved forward: the gradient of a split is one concat, while
        # indexing a transposed (3, B, H, N, d) tensor gives each of q, k, v a zero-filled
        # gradient of the whole (15 % of a block's training step on TensorFlow).
        parts = [
            ops.reshape(part, (batch, tokens, self.num_heads, head_dim))
            for part in ops.split(projected, 3, axis=-1)
        ]
        query, key, value = (ops.transpose(part, (0, 2, 1, 3)) for part in parts)
        query = query * ops.cast(head_dim**-0.5, query.dtype)

        logits = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2)))
        logits = self._mix_heads(logits, self.pre_softmax_head_mix, bias=False)  # cancelled by softmax
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        weights = self._mix_heads(
            ops.cast(weights, self.compute_dtype), self.post_softmax_head_mix
        )

        outputs = ops.matmul(weights, value)
        outputs = ops.reshape(ops.transpose(outputs, (0, 2, 1, 3)), (batch, tokens, channels))
        outputs = self.output_projection(outputs)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return with_quantized_sublayers(self, {
            **super().get_config(),
            "num_heads": self.num_heads,
            "qkv_bias": self.qkv_bias,
            "fused_attention": self.fused_attention,
        })


TalkingHeads = TalkingHeadsAttention
