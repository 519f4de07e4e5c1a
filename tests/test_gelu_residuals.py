"""Under a mixed policy on JAX, the MLP's float32 GELU is recomputed in the backward pass from its
half-precision input, so that the float32 copy of the MLP's widest tensor is not kept (it is 9 % of
XLA:GPU's memory traffic in CaiT-S24's training step: docs/benchmarks.md). The gradients stay those
of the same GELU kept whole. JAX is the backend here, so this runs in its own process."""

import json
import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import contextlib, io, json
import jax, jax.numpy as jnp, keras, numpy as np
from keras_cait.models import blocks as cait

keras.mixed_precision.set_global_policy("mixed_bfloat16")
rng = np.random.default_rng(0)
block = cait.SelfAttentionBlock(num_heads=2, init_values=0.5, name="block")
tokens = jnp.asarray(rng.normal(size=(2, 5, 32)), jnp.float32)
block.build(tokens.shape)
for weight in block.weights:
    weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
weights = [w.value for w in block.trainable_variables]

def loss(weights, tokens):
    outputs, _ = block.stateless_call(weights, [v.value for v in block.non_trainable_variables], tokens)
    return (outputs.astype(jnp.float32) ** 2).sum()

def report():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(loss, weights, tokens)
    hidden = [line.split()[0] for line in printed.getvalue().splitlines() if line.split()[0].endswith("[2,5,128]")]
    gradients = jax.grad(loss, argnums=(0, 1))(weights, tokens)
    return hidden, [np.asarray(g, np.float32).tolist() for g in jax.tree_util.tree_leaves(gradients)]

results = {"recomputed": report()}
cait._rematerialized_gelu = cait.float32_gelu  # the GELU kept whole, as before
results["kept"] = report()
print(json.dumps(results))
"""


@pytest.mark.large
def test_the_float32_gelu_is_recomputed_from_its_bfloat16_input_with_the_same_gradients():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": REPOSITORY, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    (recomputed, gradients), (kept, reference) = results["recomputed"], results["kept"]
    # (2, 5, 128): the MLP's hidden tensor, 4 × 32 channels: the GELU's input and output, kept in
    # bfloat16, and, without the recomputation, float32 pieces of the GELU beside them.
    assert recomputed and all(shape == "bf16[2,5,128]" for shape in recomputed), recomputed
    assert any(shape == "f32[2,5,128]" for shape in kept), kept
    assert len(gradients) == len(reference) > 10
    for ours, theirs in zip(gradients, reference):
        assert ours == theirs
