"""The fused talking-heads attention (keras_cait/kernels/talking_heads_pallas.py) against the equations.

The kernels run in Pallas' interpreter on the CPU: the same kernel code that Triton
compiles on a GPU. jax is imported directly (the suite's backend is TensorFlow); the
Keras layer on the JAX backend runs in its own process (tests/kernels/keras_layer_on_jax.py).
"""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from keras_cait.kernels.talking_heads_pallas import talking_heads_attention, talking_heads_attention_qkv

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Interpreted kernels are large XLA:CPU programs: compiling them unoptimised halves the test's time.
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}  # of the largest magnitude of the float32 reference


def reference(query, key, value, pre_mix, pre_bias, post_mix, post_bias, scale):
    """The layer's equations in float32 einsums, with the pre-softmax bias the kernel leaves out."""
    query, key, value = (x.astype(jnp.float32) for x in (query, key, value))
    logits = jnp.einsum("bnhd,bmhd->bhnm", query, key) * scale
    mixed = jnp.einsum("bhnm,hg->bgnm", logits, pre_mix) + pre_bias[:, None, None]
    weights = jnp.einsum("bhnm,hg->bgnm", jax.nn.softmax(mixed, axis=-1), post_mix) + post_bias[:, None, None]
    return jnp.einsum("bhnm,bmhd->bnhd", weights, value)


def random_problem(batch, tokens, heads, head_dim, dtype, seed):
    """q, k, v in `dtype`, every mix and bias random, and a random cotangent."""
    rng = np.random.default_rng(seed)
    qkv = [jnp.asarray(rng.normal(size=(batch, tokens, heads, head_dim)), dtype) for _ in range(3)]
    mixes = [jnp.asarray(rng.normal(scale=0.5, size=(heads, heads)), jnp.float32) for _ in range(2)]
    biases = [jnp.asarray(rng.normal(scale=0.3, size=(heads,)), jnp.float32) for _ in range(2)]
    cotangent = jnp.asarray(rng.normal(size=(batch, tokens, heads, head_dim)), jnp.float32)
    return qkv, mixes, biases, cotangent


def outputs_and_gradients(batch, tokens, heads, head_dim, dtype, seed=0):
    """{name: (kernel, reference)} for the outputs and the gradient of every input; and d b_l of the reference."""
    (query, key, value), (pre_mix, post_mix), (pre_bias, post_bias), cotangent = random_problem(
        batch, tokens, heads, head_dim, dtype, seed
    )
    scale = head_dim**-0.5

    def both(query, key, value, pre_mix, pre_bias, post_mix, post_bias, cotangent):
        fused, fused_pullback = jax.vjp(
            lambda q, k, v, pre, post, bias: talking_heads_attention(q, k, v, pre, post, bias, scale=scale,
                                                                     interpret=True),
            query, key, value, pre_mix, post_mix, post_bias,
        )
        exact, exact_pullback = jax.vjp(
            lambda q, k, v, pre, pre_b, post, bias: reference(q, k, v, pre, pre_b, post, bias, scale),
            query, key, value, pre_mix, pre_bias, post_mix, post_bias,
        )
        return (fused, *fused_pullback(cotangent.astype(fused.dtype))), (exact, *exact_pullback(cotangent))

    args = (query, key, value, pre_mix, pre_bias, post_mix, post_bias, cotangent)
    fused, exact = jax.jit(both).lower(*args).compile(compiler_options=QUICK_COMPILE)(*args)
    exact = list(exact)
    d_pre_bias = exact.pop(5)  # (outputs, dq, dk, dv, d pre_mix, d pre_bias, ...)
    names = ["outputs", "d_query", "d_key", "d_value", "d_pre_softmax_mix", "d_post_softmax_mix", "d_post_softmax_bias"]
    pairs = {name: (np.asarray(a, np.float32), np.asarray(b, np.float32)) for name, a, b in zip(names, fused, exact)}
    return pairs, np.asarray(d_pre_bias)


# (batch, tokens, heads, head_dim, dtype); the heads drawn at random once, then fixed.
_HEADS = np.random.default_rng(197).permutation(np.arange(2, 9))
CASES = [
    (2, 197, int(_HEADS[0]), 48, "float32"),
    (3, 7, int(_HEADS[1]), 5, "float32"),
    pytest.param(2, 197, int(_HEADS[2]), 48, "bfloat16", marks=pytest.mark.large),  # 3.4 s on 2 cores, 8 s busy
]


@pytest.mark.parametrize("batch, tokens, heads, head_dim, dtype", CASES, ids=lambda v: str(v))
def test_outputs_and_every_gradient_match_the_equations(batch, tokens, heads, head_dim, dtype):
    pairs, d_pre_bias = outputs_and_gradients(batch, tokens, heads, head_dim, dtype)
    failures = []
    for name, (fused, exact) in pairs.items():
        assert fused.shape == exact.shape, f"{name}: shape {fused.shape} != {exact.shape}"
        scale = float(np.max(np.abs(exact)))
        error = float(np.max(np.abs(fused - exact)))
        print(f"{name}: max |Δ| / max |reference| = {error / scale:.1e}")
        if not error <= TOLERANCE[dtype] * scale:
            failures.append(f"{name}: max |Δ| {error:.3g} > {TOLERANCE[dtype]} × {scale:.3g}")
    assert failures == [], failures
    # What the kernel leaves out is what the softmax cancels: the reference's gradient of b_l is zero too.
    assert np.max(np.abs(d_pre_bias)) <= 1e-5 * np.max(np.abs(pairs["d_post_softmax_bias"][1]))


@pytest.mark.large  # 3.9 s on 2 cores, 6 s busy
def test_the_kernels_lower_to_triton_for_a_gpu_and_read_qkv_where_it_lies():
    """Forward and both backward kernels pass Pallas' Triton lowering at CaiT-S24's shape (no GPU needed:
    this checks the block shapes and operations Triton accepts, not Triton's compilation to PTX). Between
    the layer's qkv projection and its output projection the program has nothing but the three kernels:
    no pad, transpose, slice or concatenate copies q, k, v, their gradients or the output."""
    qkv = jax.ShapeDtypeStruct((2, 197, 3, 8, 48), jnp.bfloat16)
    mix, bias = jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32)

    def loss(qkv, pre_mix, post_mix, post_bias):
        outputs = talking_heads_attention_qkv(qkv, pre_mix, post_mix, post_bias, scale=48**-0.5, interpret=False)
        return jnp.sum(outputs.astype(jnp.float32))

    triton = "__gpu$xla.gpu.triton"
    exported = export.export(
        jax.jit(jax.value_and_grad(loss, argnums=range(4))), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)],
    )(qkv, mix, mix, bias)
    module = exported.mlir_module()
    calls = [line for line in module.splitlines() if triton in line]
    names = sorted(line.split('name = "')[1].split('"')[0] for line in calls)
    assert names == [
        "talking_heads_attention_backward_keys",
        "talking_heads_attention_backward_queries",
        "talking_heads_attention_forward",
    ]
    copies = sorted({op for op in re.findall(r"stablehlo\.(\w+)", module)
                     if op in ("pad", "transpose", "slice", "dynamic_slice", "concatenate", "gather")})
    assert copies == [], f"layout copies around the kernels: {copies}"


def test_query_key_and_value_must_share_a_dtype():
    (query, key, value), (pre, post), (_, bias), _ = random_problem(1, 3, 2, 4, "float32", seed=0)
    with pytest.raises(ValueError, match="query, key, value of dtypes float32, bfloat16, float32: give one dtype"):
        talking_heads_attention(query, key.astype(jnp.bfloat16), value, pre, post, bias, scale=0.5, interpret=True)


@pytest.fixture(scope="module")
def through_keras_on_jax(tmp_path_factory):
    """tests/kernels/keras_layer_on_jax.py's results: the layer and a block, fused and through keras.ops."""
    path = tmp_path_factory.mktemp("keras_on_jax") / "results.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPOSITORY,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_CAIT_FUSED_ATTENTION", None)
    done = subprocess.run([sys.executable, "-m", "tests.kernels.keras_layer_on_jax", str(path)],
                          env=env, cwd=REPOSITORY, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())


def assert_close(comparison, tolerance, what, half_precision_peer=None):
    """Each quantity within `tolerance` × its largest magnitude; with `half_precision_peer` (keras.ops'
    own comparison to float32) also within 1.25 × keras.ops' error where that is larger."""
    failures = []
    for name, numbers in comparison.items():
        if name.endswith("pre_softmax_head_mix/bias"):
            # The kernel leaves b_l out: its gradient is exactly zero, keras.ops' is rounding noise.
            if numbers["fused_max"] != 0.0:
                failures.append(f"{name}: the fused gradient is {numbers['fused_max']:.3g}, not 0")
            continue
        allowed = tolerance * numbers["scale"]
        if half_precision_peer is not None:
            allowed = max(allowed, 1.25 * half_precision_peer[name]["error"])
        if not numbers["error"] <= allowed:
            failures.append(f"{name}: max |Δ| {numbers['error']:.3g} > {allowed:.3g} (largest |·| {numbers['scale']:.3g})")
    assert failures == [], f"{what}: {failures}"


@pytest.mark.large
def test_the_keras_layer_on_jax_gives_the_keras_ops_numbers(through_keras_on_jax):
    """Outputs and gradients w.r.t. the input and every weight, float32 and mixed_bfloat16, 197 and 7 tokens."""
    cases = through_keras_on_jax["layer"]
    assert len(cases) == 3
    for name, case in cases.items():
        assert case["fused_runs_pallas"] and not case["keras_ops_runs_pallas"], name
        if name.startswith("float32"):
            assert_close(case["fused_vs_keras_ops"], 1e-4, name)
        else:  # as close to the float32 layer (same weights) as keras.ops in bfloat16 is
            assert_close(case["fused_vs_float32"], 1e-2, name, half_precision_peer=case["keras_ops_vs_float32"])


@pytest.mark.large
def test_a_block_in_training_under_drop_path_gives_the_keras_ops_numbers(through_keras_on_jax):
    case = through_keras_on_jax["drop_path"]
    assert case["fused_runs_pallas"] and not case["keras_ops_runs_pallas"]
    # The same samples lost their attention branch, and some did, some did not.
    assert case["dropped_fused"] == case["dropped_keras_ops"]
    assert any(case["dropped_fused"]) and not all(case["dropped_fused"])
    assert_close(case["fused_vs_keras_ops"], 1e-4, "SelfAttentionBlock, drop path 0.5")


@pytest.mark.large
def test_when_the_layer_takes_the_kernel(through_keras_on_jax):
    assert through_keras_on_jax["switch"] == {
        "auto_on_cpu": False,
        "auto_on_gpu": True,
        "auto_on_gpu_asking_for_scores": False,
        "auto_on_gpu_at_1024_tokens": True,
        "auto_on_gpu_at_1025_tokens": False,
        "auto_on_gpu_s24_at_224_pixels": True,
        "auto_on_gpu_s24_at_384_pixels": False,
        "auto_on_gpu_turned_off_by_environment": False,
        "auto_on_gpu_under_a_distribution": False,
        "false_on_gpu": False,
        "true_at_1025_tokens": True,
        "true_on_cpu": True,
        "true_still_returns_scores": True,
    }
