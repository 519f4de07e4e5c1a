"""CaiT's forward pass for inference, with every constant folded: what the exports run.

A trained CaiT carries factors that are fixed once training ends. Folded into
the weights beside them, they cost nothing at inference (numbers per block of
an S24, float64 folding then float32):

- the ImageNet normalisation, `(x - μ) / σ` per input channel, goes into the
  patch-embedding convolution: `W' = W / σ_c`, `b' = b - Σ W μ_c / σ_c`
  (exact: the convolution is unpadded, every pixel sees every weight once);
- the convolution's bias goes into the position embedding, one add;
- each LayerScale `λ ⊙ (y W + b)` becomes `y (W diag λ) + λ ⊙ b`: the
  attention output projection and the MLP's second layer absorb λ_1 and λ_2;
- the attention scale d^-1/2 goes into the query columns of the qkv (or
  query) projection;
- dropout and drop path are identities at inference and are simply absent;
- the bias of the talking-heads mix before the softmax is dropped: it is constant along the
  softmax's axis, which cancels it.

The Keras model, its weights and its `.keras` files are left as they are: this
module reads the weights once and writes new TensorFlow variables.

The graph itself is written for the runtimes that run it (TensorFlow with
oneDNN, ONNX Runtime, OpenVINO): the tokens stay a 2-D `(batch·tokens,
channels)` matrix between blocks, so every projection is one MatMul + BiasAdd
(GELU) that oneDNN fuses, with no `tensordot` reshapes. GELU and LayerNorm are
written in the form that the runtime at the end pattern-matches into one op
(`runtime`): for TensorFlow and LiteRT, `tf.nn.gelu` (oneDNN's MatMul + BiasAdd +
GeluExact fusion) and `tf.nn.moments` over the last axis by its positive index +
`tf.nn.batch_normalization`; for ONNX and OpenVINO, `½x · (1 + erf(x/√2))`
and `(x - μ) / √(mean((x - μ)²) + ε) · γ + β`, the forms ONNX Runtime fuses into
Gelu and LayerNormalization and OpenVINO into Gelu and MVN. Outputs equal the model's (tests/export/test_inference_graph.py
compares every export with timm's logits).

This module is TensorFlow by nature; the model code stays backend-neutral.

Example:
    graph = InferenceGraph(keras_cait.CaiT_XXS24())
    scores = graph(tf.zeros([1, 224, 224, 3]))   # what model.predict returns
"""

import math

import keras
import numpy as np
import tensorflow as tf

from keras_cait.layers import ClassToken, PatchEmbedding, PositionEmbedding
from keras_cait.models.blocks import LAYER_NORM_EPSILON, ClassAttentionBlock, SelfAttentionBlock
from keras_cait.models.precision import has_dtype_policy


def folds(model, any_policy=False):
    """Whether `InferenceGraph` can fold `model`: a float32 CaiT classifier as `build_cait` makes it
    (with `any_policy`, under any dtype policy: what its float32 copy would be).

    Anything else (mixed precision, int8, pooled or headless models, LoRA left
    unmerged, other graphs) is exported as the Keras model itself.
    """
    try:
        _structure(model, any_policy)
    except ValueError:
        return False
    return True


def _structure(model, any_policy=False):
    """The layers of a foldable CaiT, by role; a ValueError naming what differs otherwise."""
    layers = {layer.name: layer for layer in model.layers}
    names = [layer.name for layer in model.layers]
    self_blocks = [layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)]
    class_blocks = [layer for layer in model.layers if isinstance(layer, ClassAttentionBlock)]
    expected = (
        ["images", "preprocessing", "patch_embedding", "position_embedding"]
        + [block.name for block in self_blocks]
        + ["class_token"]
        + [block.name for block in class_blocks]
        + ["final_norm", "token_pool", "predictions"]
    )
    if names != expected:
        raise ValueError(f"{model.name}: layers {names} are not those of a CaiT classifier {expected}")
    if not (
        isinstance(layers["preprocessing"], keras.layers.Normalization)
        and isinstance(layers["patch_embedding"], PatchEmbedding)
        and isinstance(layers["position_embedding"], PositionEmbedding)
        and isinstance(layers["class_token"], ClassToken)
    ):
        raise ValueError(f"{model.name}: its layers are not CaiT's")
    head = layers["predictions"]
    if head.activation not in (keras.activations.softmax, keras.activations.linear):
        raise ValueError(f"{model.name}: the head's activation is neither softmax nor linear")
    if not (any_policy or has_dtype_policy(model, "float32")):
        raise ValueError(f"{model.name}: dtype policies {sorted({layer.dtype_policy.name for layer in model.layers})}, "
                         "not float32")
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "quantization_mode", None) is not None:
            raise ValueError(f"{layer.name}: quantized ({layer.quantization_mode})")
    return layers, self_blocks, class_blocks


def _numpy(weight):
    return np.asarray(keras.ops.convert_to_numpy(weight), dtype="float64")


def _dense(layer, scale=None):
    """(kernel, bias) of a Dense, its output channels scaled by `scale`; LoRA merged by Keras' `kernel`."""
    kernel = _numpy(layer.kernel)
    bias = _numpy(layer.bias) if layer.use_bias else np.zeros(kernel.shape[1])
    if scale is not None:
        kernel, bias = kernel * scale, bias * scale
    return kernel, bias


class InferenceGraph(tf.Module):
    """A CaiT classifier's inference computation with the constants folded (see the module docstring).

    Args:
        model: a float32 CaiT classifier from `build_cait` (a variant
            constructor, with `include_top=True`, `include_preprocessing=True`);
            `folds(model)` says whether it is one.
        runtime: "tensorflow" for graphs that TensorFlow or LiteRT run,
            "onnx" for graphs converted to ONNX, "openvino" for OpenVINO: the
            forms of GELU and LayerNorm that each fuses (the module docstring);
            for OpenVINO the talking-heads mixes' kernels are also computed at
            run time (`_mix_heads`).
        compute_dtype: "float32", or "bfloat16" for CPUs with bfloat16 units
            and GPUs: the patch embedding, every linear layer (its bias and the
            GELU after it included) and the attention matmuls compute in
            bfloat16 and return bfloat16, as under timm's
            `torch.autocast(bfloat16)`, while the residual stream, LayerNorm,
            softmax and the talking-heads mixes stay float32. The inputs and
            outputs are float32 either way.

    Calling it on float32 `(batch, H, W, 3)` 0..255 RGB images returns what the
    model returns (probabilities, or logits with `classifier_activation=None`).
    """

    def __init__(self, model, runtime="tensorflow", compute_dtype="float32", name="cait_inference"):
        super().__init__(name=name)
        if runtime not in FORMS:
            raise ValueError(f"runtime={runtime!r}: must be one of {tuple(FORMS)}.")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype={compute_dtype!r}: must be one of {COMPUTE_DTYPES}.")
        self.compute_dtype = compute_dtype
        self.gelu, self.layer_norm = FORMS[runtime]
        self.kernel_at_run_time = runtime == "openvino"
        layers, self_blocks, class_blocks = _structure(model)
        self.image_shape = tuple(model.inputs[0].shape[1:])
        self.softmax = layers["predictions"].activation is keras.activations.softmax
        self.heads = self_blocks[0].num_heads if self_blocks else class_blocks[0].num_heads

        def variable(value, name, dtype="float32"):
            return tf.Variable(tf.cast(np.asarray(value, "float32"), dtype), trainable=False, name=name)

        # === Patch embedding with the normalisation folded in ===
        normalization = layers["preprocessing"]
        mean = _numpy(normalization.mean).reshape(-1)
        std = np.sqrt(_numpy(normalization.variance).reshape(-1))
        projection = layers["patch_embedding"].projection
        kernel = _numpy(projection.kernel)  # (P, P, 3, D)
        bias = _numpy(projection.bias) - np.einsum("ijcd,c->d", kernel, mean / std)
        self.patch_size = kernel.shape[0]
        self.patch_kernel = variable(kernel / std[:, None], "patch_kernel", compute_dtype)
        positions = _numpy(layers["position_embedding"].embeddings)[0]
        self.positions = variable(positions + bias, "positions_and_patch_bias")
        self.class_token = variable(_numpy(layers["class_token"].token).reshape(1, -1), "class_token")

        self.self_attention = [self._block(block, "qkv") for block in self_blocks]
        self.class_attention = [self._block(block, "query") for block in class_blocks]
        self.final_norm = self._norm(layers["final_norm"], "final_norm")
        self.head = [variable(w, f"predictions_{part}", compute_dtype) for w, part in zip(_dense(layers["predictions"]), "wb")]

    def _norm(self, layer, name):
        return [tf.Variable(np.asarray(_numpy(w), "float32"), trainable=False, name=f"{name}_{part}")
                for w, part in ((layer.gamma, "gamma"), (layer.beta, "beta"))]

    def _block(self, block, query_layer):
        """One block's folded weights, {name: variable}."""
        attention = block.attention
        channels = block.attention_norm.gamma.shape[0]
        head_dim = channels // block.num_heads
        scale = head_dim**-0.5
        weights = {}
        if query_layer == "qkv":  # self-attention: scale the query third of qkv
            weights["qkv"] = _dense(attention.qkv, np.repeat([scale, 1.0, 1.0], channels))
            for name in ("pre_softmax_head_mix", "post_softmax_head_mix"):
                # stored as the left factor of (H, H) @ (H, batch·N·M), and the post-softmax bias; the
                # softmax cancels the pre-softmax bias (constant along its axis), so that one is left out
                kernel, bias = _dense(getattr(attention, name))
                weights[name] = (kernel.T,) if name.startswith("pre") else (kernel.T, bias)
        else:  # class attention
            weights["query"] = _dense(attention.query, scale)
            # key and value in one matmul over the tokens
            key, value = _dense(attention.key), _dense(attention.value)
            weights["key_value"] = (np.concatenate([key[0], value[0]], 1), np.concatenate([key[1], value[1]]))
        weights["output_projection"] = _dense(attention.output_projection, _numpy(block.attention_layer_scale.gamma))
        weights["mlp_dense_1"] = _dense(block.mlp_dense_1)
        weights["mlp_dense_2"] = _dense(block.mlp_dense_2, _numpy(block.mlp_layer_scale.gamma))
        prefix = block.name
        # The linear layers in compute_dtype (kernel and bias); the talking-heads mixes float32.
        variables = {
            f"{name}_{part}": tf.Variable(
                tf.cast(np.asarray(value, "float32"), self.compute_dtype if "mix" not in name
                        else "float32"), trainable=False, name=f"{prefix}/{name}_{part}")
            for name, pair in weights.items()
            for part, value in zip(("kernel", "bias"), pair)
        }
        for norm in ("attention_norm", "mlp_norm"):
            variables[f"{norm}_gamma"], variables[f"{norm}_beta"] = self._norm(getattr(block, norm), f"{prefix}/{norm}")
        return variables

    # === The computation ===

    def __call__(self, images):
        height, width, _ = self.image_shape
        rows, cols = height // self.patch_size, width // self.patch_size
        tokens = rows * cols
        channels = self.class_token.shape[-1]
        patches = tf.cast(tf.nn.conv2d(self._low(images), self.patch_kernel, strides=self.patch_size,
                                       padding="VALID"), tf.float32)
        # (batch, tokens, channels) for the position embedding, then flat (batch·tokens, channels).
        x = tf.reshape(tf.reshape(patches, [-1, tokens, channels]) + self.positions, [-1, channels])
        for weights in self.self_attention:
            x = x + self._self_attention(self.layer_norm(x, *_norm_of(weights, "attention_norm")), weights, tokens)
            x = x + self._mlp(x, weights)
        class_token = tf.broadcast_to(self.class_token, [tf.shape(images)[0], channels])
        patches = tf.reshape(x, [-1, tokens, channels])
        for weights in self.class_attention:
            joined = tf.concat([class_token[:, None], patches], axis=1)
            class_token = class_token + self._class_attention(
                self.layer_norm(joined, *_norm_of(weights, "attention_norm")), weights, tokens + 1
            )
            class_token = class_token + self._mlp(class_token, weights)
        scores = self._float(_linear(self._low(self.layer_norm(class_token, *self.final_norm)), *self.head))
        return tf.nn.softmax(scores) if self.softmax else scores

    def _low(self, x):
        """x in the compute dtype: the input of a matmul (`tf.cast` to its own dtype adds no op)."""
        return tf.cast(x, self.compute_dtype)

    def _float(self, x):
        """x in float32: what the residual stream, LayerNorm and softmax take."""
        return tf.cast(x, tf.float32)

    def _mlp(self, x, weights):
        # The GELU follows its matmul in the compute dtype, so both are one fused op.
        hidden = self.gelu(_linear(self._low(self.layer_norm(x, *_norm_of(weights, "mlp_norm"))),
                                   weights["mlp_dense_1_kernel"], weights["mlp_dense_1_bias"]))
        return self._float(_linear(hidden, weights["mlp_dense_2_kernel"], weights["mlp_dense_2_bias"]))

    def _self_attention(self, x, weights, tokens):
        """x (batch·tokens, C) -> the attention branch (batch·tokens, C), λ_1 folded in.

        The heads lead, `(heads·batch, tokens, head_dim)`: one transpose of the qkv projection
        brings them there, the talking-heads mixes are then plain `(H, H) @ (H, batch·N·N)`
        matmuls, and one transpose takes the heads back for the output projection.
        """
        channels = x.shape[-1]
        heads, head_dim = self.heads, channels // self.heads
        qkv = _linear(self._low(x), weights["qkv_kernel"], weights["qkv_bias"])  # (batch·tokens, 3C)
        qkv = tf.transpose(tf.reshape(qkv, [-1, 3 * heads, head_dim]), [1, 0, 2])  # (3H, batch·tokens, d)
        query, key, value = tf.unstack(tf.reshape(qkv, [3, -1, tokens, head_dim]))  # (H·batch, tokens, d)
        logits = self._float(tf.matmul(query, key, transpose_b=True))  # (H·batch, tokens, tokens)
        # The pre-softmax mix's bias is constant along the softmax's axis, so the softmax cancels it.
        attention = tf.nn.softmax(_mix_heads(logits, weights["pre_softmax_head_mix_kernel"],
                                             kernel_at_run_time=self.kernel_at_run_time))
        attention = _mix_heads(attention, weights["post_softmax_head_mix_kernel"],
                               kernel_at_run_time=self.kernel_at_run_time)
        outputs = tf.matmul(self._low(attention), value)  # (H·batch, tokens, d)
        # The post-softmax mix's bias b_h, added to every attention weight, adds b_h · Σ_tokens v_h to
        # each output: added here to (H, batch, 1, d) rather than to the (H, batch, N, N) attention.
        value_sums = tf.reshape(tf.reduce_sum(self._float(value), axis=1), [heads, -1, 1, head_dim])
        bias = tf.reshape(weights["post_softmax_head_mix_bias"], [heads, 1, 1, 1])
        outputs = tf.reshape(outputs, [heads, -1, tokens, head_dim]) + tf.cast(bias * value_sums, outputs.dtype)
        outputs = tf.reshape(tf.transpose(tf.reshape(outputs, [heads, -1, head_dim]), [1, 0, 2]), [-1, channels])
        return self._float(_linear(outputs, weights["output_projection_kernel"], weights["output_projection_bias"]))

    def _class_attention(self, z, weights, tokens):
        """z (batch, 1 + patches, C) -> the class token's update (batch, C), λ_1 folded in."""
        channels = z.shape[-1]
        heads, head_dim = self.heads, channels // self.heads
        z = self._low(z)
        query = _linear(z[:, 0], weights["query_kernel"], weights["query_bias"])
        query = tf.reshape(query, [-1, heads, 1, head_dim])
        key_value = _linear(tf.reshape(z, [-1, channels]), weights["key_value_kernel"], weights["key_value_bias"])
        key_value = tf.transpose(tf.reshape(key_value, [-1, tokens, 2, heads, head_dim]), [2, 0, 3, 1, 4])
        key, value = tf.unstack(key_value)
        attention = tf.nn.softmax(self._float(tf.matmul(query, key, transpose_b=True)))  # (batch, heads, 1, tokens)
        outputs = tf.reshape(tf.matmul(self._low(attention), value), [-1, channels])
        return self._float(_linear(outputs, weights["output_projection_kernel"], weights["output_projection_bias"]))


def _linear(x, kernel, bias):
    """x @ kernel + bias in x's dtype: one MatMul + BiasAdd that oneDNN fuses (with the GELU after it)."""
    return tf.nn.bias_add(tf.matmul(x, kernel), bias)


COMPUTE_DTYPES = ("float32", "bfloat16")


def _onnx_gelu(x):
    return (x * 0.5) * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def _onnx_layer_norm(x, gamma, beta):
    centred = x - tf.reduce_mean(x, axis=[-1], keepdims=True)
    variance = tf.reduce_mean(tf.pow(centred, 2.0), axis=[-1], keepdims=True)
    return centred / tf.sqrt(variance + LAYER_NORM_EPSILON) * gamma + beta


def _tensorflow_layer_norm(x, gamma, beta):
    # The last axis by its positive index, as oneDNN's kernels reduce it. The one LayerNorm pattern
    # that grappler's oneDNN remapper fuses with variable γ and β (a training-mode FusedBatchNormV3
    # on a reshaped (1, rows, channels, 1) tensor, Keras 2's form) measured slower at batch 1 than
    # these unfused ops: its `_MklLayerNorm` took 170 µs for one (196, 192) tensor.
    mean, variance = tf.nn.moments(x, axes=[len(x.shape) - 1], keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, offset=beta, scale=gamma, variance_epsilon=LAYER_NORM_EPSILON)


# runtime -> (GELU, LayerNorm), both exact.
FORMS = {
    "tensorflow": (lambda x: tf.nn.gelu(x, approximate=False), _tensorflow_layer_norm),
    "onnx": (_onnx_gelu, _onnx_layer_norm),
    "openvino": (_onnx_gelu, _onnx_layer_norm),
}


def _norm_of(weights, name):
    return weights[f"{name}_gamma"], weights[f"{name}_beta"]


def _mix_heads(scores, kernel, kernel_at_run_time=False):
    """Talking heads over (H·batch, N, M): out_h' = Σ_h kernel[h', h] · scores_h (the biases are
    cancelled by the softmax, or added after attention·v: `_self_attention`).

    One (H, H) @ (H, batch·N·M) matmul, the heads leading: no transpose of the large tensor.

    `kernel_at_run_time` (OpenVINO): the kernel is multiplied by a 1 computed from the batch size,
    so that it is no constant in the IR. OpenVINO's CPU plugin runs a MatMul whose left operand is a
    constant in float32 whatever its inference precision, with a reorder from and back to bfloat16
    around each (a fifth of S24's time at batch 16 in bf16); a MatMul of two computed operands runs
    in the inference precision, on AMX tiles where the CPU has them (docs/benchmarks.md).
    """
    _, queries, keys = scores.shape
    heads = kernel.shape[0]
    if kernel_at_run_time:
        kernel = kernel * tf.cast(tf.minimum(tf.shape(scores)[0], 1), kernel.dtype)
    mixed = tf.matmul(kernel, tf.reshape(scores, [heads, -1]))
    return tf.reshape(mixed, [-1, queries, keys])
