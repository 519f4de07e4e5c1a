"""The fused talking-heads attention (keras_cait/kernels/talking_heads_pallas.py) against the equations.

The kernels run in Pallas' interpreter on the CPU: the same kernel code that Triton
compiles on a GPU. jax is imported directly (the suite's backend is TensorFlow).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from keras_cait.kernels.talking_heads_pallas import talking_heads_attention

# Interpreted kernels are large XLA:CPU programs: compiling them unoptimised halves the test's time.
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}  # of the largest magnitude of the float32 reference


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
    (2, 197, int(_HEADS[2]), 48, "bfloat16"),
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


def test_the_kernels_lower_to_triton_for_a_gpu():
    """Forward and both backward kernels pass Pallas' Triton lowering at CaiT-S24's shape (no GPU needed:
    this checks the block shapes and operations Triton accepts, not Triton's compilation to PTX)."""
    shape = jax.ShapeDtypeStruct((2, 197, 8, 48), jnp.bfloat16)
    mix, bias = jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32)

    def loss(query, key, value, pre_mix, post_mix, post_bias):
        outputs = talking_heads_attention(query, key, value, pre_mix, post_mix, post_bias, scale=48**-0.5,
                                          interpret=False)
        return jnp.sum(outputs.astype(jnp.float32))

    triton = "__gpu$xla.gpu.triton"
    exported = export.export(
        jax.jit(jax.value_and_grad(loss, argnums=range(6))), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)],
    )(shape, shape, shape, mix, mix, bias)
    calls = [line for line in exported.mlir_module().splitlines() if triton in line]
    names = sorted(line.split('name = "')[1].split('"')[0] for line in calls)
    assert names == [
        "talking_heads_attention_backward_keys",
        "talking_heads_attention_backward_queries",
        "talking_heads_attention_forward",
    ]


def test_query_key_and_value_must_share_a_dtype():
    (query, key, value), (pre, post), (_, bias), _ = random_problem(1, 3, 2, 4, "float32", seed=0)
    with pytest.raises(ValueError, match="query, key, value of dtypes float32, bfloat16, float32: give one dtype"):
        talking_heads_attention(query, key.astype(jnp.bfloat16), value, pre, post, bias, scale=0.5, interpret=True)
