"""TalkingHeadsAttention through its fused kernel and through keras.ops, on the JAX backend.

    KERAS_BACKEND=jax python -m tests.kernels.keras_layer_on_jax RESULTS.json

Run by tests/kernels/test_talking_heads_pallas.py in its own process (the suite's
backend is TensorFlow). Each case builds a layer or a block with every weight random,
computes its outputs and the gradients w.r.t. its input and every weight with
`fused_attention=False`, then with the same weights and `fused_attention=True` (on the
CPU: Pallas' interpreter), and writes, per quantity, the largest difference and the
largest magnitude of the keras.ops result. The test reads the file and judges.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_cait.kernels import talking_heads_pallas
from keras_cait.layers import TalkingHeadsAttention
from keras_cait.models.blocks import SelfAttentionBlock
from tests.layers.reference import randomize

# (policy, batch, tokens, heads, head_dim); heads drawn at random once, then fixed.
_HEADS = np.random.default_rng(2026).permutation(np.arange(2, 9))
LAYER_CASES = [
    ("float32", 2, 197, int(_HEADS[0]), 8),
    ("float32", 3, 7, int(_HEADS[1]), 5),
    ("mixed_bfloat16", 2, 197, int(_HEADS[2]), 16),
]


def _runner(layer, inputs, training):
    """jit(inputs, cotangent) -> (outputs, d inputs, d trainable weights), through `stateless_call`."""
    non_trainable = [v.value for v in layer.non_trainable_variables]
    options = {"training": True} if training else {}  # the attention layer's call takes no `training`

    def forward(trainable, x):
        outputs, _ = layer.stateless_call(trainable, non_trainable, x, **options)
        return outputs.astype(jnp.float32)

    def run(trainable, x, cotangent):
        outputs, pullback = jax.vjp(forward, trainable, x)
        d_trainable, d_x = pullback(cotangent)
        return outputs, d_x, d_trainable

    trainable = [v.value for v in layer.trainable_variables]
    return jax.jit(run), trainable, "pallas_call" in str(jax.make_jaxpr(run)(trainable, inputs, forward(trainable, inputs)))


def _results(layer, inputs, cotangent, training=False):
    run, trainable, fused = _runner(layer, inputs, training)
    outputs, d_x, d_trainable = run(trainable, inputs, cotangent)
    names = ["outputs", "d_inputs"] + [f"d_{v.path.split('/', 1)[1]}" for v in layer.trainable_variables]
    return fused, dict(zip(names, [np.asarray(a, np.float32) for a in (outputs, d_x, *d_trainable)]))


def _compare(actual, expected):
    return {
        name: {"error": float(np.max(np.abs(actual[name] - expected[name]))),
               "scale": float(np.max(np.abs(expected[name]))),
               "fused_max": float(np.max(np.abs(actual[name])))}
        for name in expected
    }


def layer_case(policy, batch, tokens, heads, head_dim):
    channels = heads * head_dim
    rng = np.random.default_rng(tokens + heads)
    inputs = jnp.asarray(rng.normal(size=(batch, tokens, channels)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(batch, tokens, channels)), jnp.float32)
    layer = TalkingHeadsAttention(heads, fused_attention=False, dtype=policy)
    layer.build((None, tokens, channels))
    randomize(layer, seed=tokens, scale=0.3)
    keras_fused, keras_ops = _results(layer, inputs, cotangent)
    layer.fused_attention = True
    kernel_fused, kernel = _results(layer, inputs, cotangent)
    case = {"keras_ops_runs_pallas": keras_fused, "fused_runs_pallas": kernel_fused,
            "fused_vs_keras_ops": _compare(kernel, keras_ops)}
    if policy != "float32":  # both against the same weights in float32
        exact = TalkingHeadsAttention(heads, fused_attention=False)
        exact.build((None, tokens, channels))
        exact.set_weights(layer.get_weights())
        _, reference = _results(exact, inputs, cotangent)
        case["fused_vs_float32"] = _compare(kernel, reference)
        case["keras_ops_vs_float32"] = _compare(keras_ops, reference)
    return case


def drop_path_case(batch=6, tokens=7, heads=3, head_dim=8):
    """A SelfAttentionBlock in training, drop path 0.5: the same masks drop the same samples' branches."""
    channels = heads * head_dim
    rng = np.random.default_rng(7)
    inputs = jnp.asarray(rng.normal(size=(batch, tokens, channels)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(batch, tokens, channels)), jnp.float32)
    block = SelfAttentionBlock(heads, drop_path_rate=0.5, init_values=0.5)
    block.build((None, tokens, channels))
    randomize(block, seed=3, scale=0.3)
    block.stochastic_depth.seed_generator.state.assign(np.array([0, 11], "uint32"))
    results, dropped = {}, {}
    for fused in (False, True):
        block.attention.fused_attention = fused
        run, trainable, runs_pallas = _runner(block, inputs, training=True)
        outputs, d_x, d_trainable = run(trainable, inputs, cotangent)
        names = ["outputs", "d_inputs"] + [f"d_{v.path.split('/', 1)[1]}" for v in block.trainable_variables]
        results[fused] = dict(zip(names, [np.asarray(a, np.float32) for a in (outputs, d_x, *d_trainable)]))
        results[fused]["runs_pallas"] = runs_pallas
        # A sample's attention branch was dropped where its own cotangent leaves the qkv kernel no gradient.
        qkv = [i for i, v in enumerate(block.trainable_variables) if v.path.endswith("attention/qkv/kernel")][0]
        dropped[fused] = [
            bool(np.all(np.asarray(run(trainable, inputs, cotangent * (np.arange(batch) == b)[:, None, None])[2][qkv]) == 0))
            for b in range(batch)
        ]
    runs = {fused: results[fused].pop("runs_pallas") for fused in (False, True)}
    return {"keras_ops_runs_pallas": runs[False], "fused_runs_pallas": runs[True],
            "dropped_keras_ops": dropped[False], "dropped_fused": dropped[True],
            "fused_vs_keras_ops": _compare(results[True], results[False])}


def switch_case():
    """When the layer takes the kernel: the constructor argument, the environment variable, the device."""
    layer = TalkingHeadsAttention(2)
    layer.build((None, 5, 8))
    choices = {"auto_on_cpu": layer._runs_fused_kernel(False, 5)}
    gpu = talking_heads_pallas.on_gpu
    talking_heads_pallas.on_gpu = lambda: True
    try:
        choices["auto_on_gpu"] = layer._runs_fused_kernel(False, 5)
        choices["auto_on_gpu_asking_for_scores"] = layer._runs_fused_kernel(True, 5)
        # 2 heads: up to 1024 tokens fit (2 × 1024 = 8 × 256); 1025 round up to 2048.
        choices["auto_on_gpu_at_1024_tokens"] = layer._runs_fused_kernel(False, 1024)
        choices["auto_on_gpu_at_1025_tokens"] = layer._runs_fused_kernel(False, 1025)
        s24 = TalkingHeadsAttention(8)
        s24.build((None, 196, 384))
        choices["auto_on_gpu_s24_at_224_pixels"] = s24._runs_fused_kernel(False, 196)
        choices["auto_on_gpu_s24_at_384_pixels"] = s24._runs_fused_kernel(False, 576)
        os.environ["KERAS_CAIT_FUSED_ATTENTION"] = "0"
        choices["auto_on_gpu_turned_off_by_environment"] = layer._runs_fused_kernel(False, 5)
        del os.environ["KERAS_CAIT_FUSED_ATTENTION"]
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
        choices["auto_on_gpu_under_a_distribution"] = layer._runs_fused_kernel(False, 5)
        keras.distribution.set_distribution(None)
        layer.fused_attention = False
        choices["false_on_gpu"] = layer._runs_fused_kernel(False, 5)
    finally:
        talking_heads_pallas.on_gpu = gpu
    layer.fused_attention = True
    choices["true_on_cpu"] = layer._runs_fused_kernel(False, 5)
    choices["true_at_1025_tokens"] = layer._runs_fused_kernel(False, 1025)
    _, scores = layer(np.ones((1, 5, 8), "float32"), return_attention_scores=True)
    choices["true_still_returns_scores"] = tuple(scores.shape) == (1, 2, 5, 5)
    return choices


def main(path):
    assert keras.backend.backend() == "jax", keras.backend.backend()
    results = {"layer": {}, "drop_path": drop_path_case(), "switch": switch_case()}
    for case in LAYER_CASES:
        results["layer"]["-".join(map(str, case))] = layer_case(*case)
    with open(path, "w") as file:
        json.dump(results, file, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
