"""The fused talking-heads attention kernel against the keras.ops path, on the JAX backend.

    python -m benchmarks.talking_heads_kernel --output talking_heads_gpu.json   # on a GPU
    python -m benchmarks.talking_heads_kernel --residuals-only                  # memory only, any machine
    python -m benchmarks.talking_heads_kernel --smoke                           # tiny, on the CPU

One `TalkingHeadsAttention` layer at CaiT-S24's self-attention shape by default (batch 128,
196 tokens, 384 channels, 8 heads, `mixed_bfloat16`): its qkv projection, the attention and
its output projection, forward + backward (the gradients w.r.t. its input and every weight)
under `jax.jit`, on JAX's default device, once with `fused_attention=True` (the Pallas
kernels) and once with `fused_attention=False` (keras.ops), the same weights in both. Both
are compiled and warmed up first, then timed in alternating rounds of `--steps` steps; a
path's time is the median of its rounds. It prints one JSON object with:

- `ms_per_step` of each path and `fused_speedup` (keras.ops time / fused time);
- `largest_difference`: per output and gradient, max |fused − keras.ops| / max |keras.ops|;
  the run fails if one exceeds `--tolerance` (the kernel must be right where it is timed);
- `saved_for_backward_bytes`: what each path keeps between the passes beyond the layer's
  input and weights (JAX's saved residuals, before XLA; `jax.ad_checkpoint.print_saved_residuals`),
  with the largest residuals named; `--residuals-only` prints these alone, without compiling;
- `compiled_temp_bytes`: XLA's temporary buffers of each compiled step on this device.

Off a GPU the kernels run in Pallas' interpreter (`interpreted: true`): the times then say
nothing about the kernel, only that every code path runs (`--smoke`, tests/benchmarks/).
"""

import argparse
import contextlib
import io
import math
import os
import re
import statistics
import sys
import time

from benchmarks.harness import print_result

SMOKE = dict(batch=2, tokens=7, channels=16, heads=2, policy="float32", rounds=2, steps=1)
ITEM_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "u32": 4, "i8": 1, "u8": 1, "bool": 1}
RESIDUAL = re.compile(r"^(\w+)\[([\d,]*)\] (.*)$")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=196, help="196: the patches of a 224 image")
    parser.add_argument("--channels", type=int, default=384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--policy", default="mixed_bfloat16", choices=["float32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per path and round")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative difference allowed (default 1e-4 in float32, 5e-2 in half precision)")
    parser.add_argument("--residuals-only", action="store_true", help="only what each path keeps for backward")
    parser.add_argument("--smoke", action="store_true", help=f"a tiny layer, 2 rounds of 1 step: {SMOKE}")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if args.tolerance is None:
        args.tolerance = 1e-4 if args.policy == "float32" else 5e-2
    return args


def residual_bytes(report):
    """Bytes of the residuals in `print_saved_residuals`' report that are not the function's arguments."""
    total, largest = 0, []
    for line in report.splitlines():
        match = RESIDUAL.match(line.strip())
        if not match or match.group(3).startswith("from the argument"):
            continue
        dtype, shape, source = match.groups()
        size = ITEM_BYTES[dtype] * math.prod(int(d) for d in shape.split(",") if d)
        total += size
        largest.append((size, f"{dtype}[{shape}] {source.split(' from ')[0]}"))
    return total, [f"{size / 2**20:.1f} MiB {what}" for size, what in sorted(largest, reverse=True)[:6]]


def main(argv=None):
    args = parse_arguments(argv)
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np
    from jax.ad_checkpoint import print_saved_residuals

    from keras_cait.kernels.talking_heads_pallas import on_gpu
    from keras_cait.layers import TalkingHeadsAttention

    rng = np.random.default_rng(0)
    shape = (args.batch, args.tokens, args.channels)
    inputs = jnp.asarray(rng.normal(size=shape), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=shape), jnp.float32)
    layers = {}
    for path, fused in (("fused", True), ("keras_ops", False)):
        layers[path] = TalkingHeadsAttention(args.heads, fused_attention=fused, dtype=args.policy, name="attention")
        layers[path].build((None, args.tokens, args.channels))
    for weight in layers["fused"].weights:  # random weights, every bias non-zero
        weight.assign(rng.normal(scale=0.5 * (weight.shape[0] if len(weight.shape) == 2 else 1) ** -0.5,
                                 size=weight.shape).astype("float32"))
    layers["keras_ops"].set_weights(layers["fused"].get_weights())

    def loss_of(layer):
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x, cotangent):
            outputs, _ = layer.stateless_call(trainable, non_trainable, x)
            return jnp.sum(outputs.astype(jnp.float32) * cotangent), outputs

        return loss

    result = {
        "device": str(jax.devices()[0].device_kind), "platform": jax.default_backend(), "interpreted": not on_gpu(),
        "shape": dict(batch=args.batch, tokens=args.tokens, channels=args.channels, heads=args.heads),
        "policy": args.policy, "jax": jax.__version__, "keras": keras.__version__,
        "saved_for_backward_bytes": {}, "largest_residuals": {},
    }
    trainable = {path: [v.value for v in layer.trainable_variables] for path, layer in layers.items()}
    for path, layer in layers.items():
        report = io.StringIO()
        with contextlib.redirect_stdout(report):
            print_saved_residuals(lambda *a: loss_of(layer)(*a)[1], trainable[path], inputs, cotangent)
        total, largest = residual_bytes(report.getvalue())
        result["saved_for_backward_bytes"][path] = total
        result["largest_residuals"][path] = largest
    if args.residuals_only:
        return print_result(result, args.output)

    steps, result["compiled_temp_bytes"] = {}, {}
    for path, layer in layers.items():
        step = jax.jit(jax.value_and_grad(loss_of(layer), argnums=(0, 1), has_aux=True))
        compiled = step.lower(trainable[path], inputs, cotangent).compile()
        memory = compiled.memory_analysis()
        result["compiled_temp_bytes"][path] = None if memory is None else int(memory.temp_size_in_bytes)
        steps[path] = compiled
    answers = {path: jax.block_until_ready(step(trainable[path], inputs, cotangent)) for path, step in steps.items()}
    result["largest_difference"] = largest_difference(answers, layers["keras_ops"], np)

    times = {path: [] for path in steps}
    for round_ in range(args.rounds):
        for path in (list(steps) if round_ % 2 == 0 else list(steps)[::-1]):
            start = time.perf_counter()
            for _ in range(args.steps):
                answer = steps[path](trainable[path], inputs, cotangent)
            jax.block_until_ready(answer)
            times[path].append((time.perf_counter() - start) / args.steps * 1e3)
    result["ms_per_step"] = {path: statistics.median(ms) for path, ms in times.items()}
    result["ms_per_round"] = times
    result["fused_speedup"] = result["ms_per_step"]["keras_ops"] / result["ms_per_step"]["fused"]
    print_result(result, args.output)
    wrong = {name: error for name, error in result["largest_difference"].items() if not error <= args.tolerance}
    if wrong:
        sys.exit(f"the fused kernel differs from keras.ops by more than {args.tolerance}: {wrong}")
    return result


def largest_difference(answers, reference_layer, np):
    """max |fused − keras.ops| / max |keras.ops| of the outputs and of each gradient."""
    names = ["outputs", "d_inputs"] + [f"d_{v.path.split('/', 1)[1]}" for v in reference_layer.trainable_variables]

    def flat(answer):
        (_, outputs), (d_weights, d_inputs) = answer
        return [np.asarray(a, np.float32) for a in (outputs, d_inputs, *d_weights)]

    differences = {}
    for name, fused, exact in zip(names, flat(answers["fused"]), flat(answers["keras_ops"])):
        differences[name] = float(np.max(np.abs(fused - exact)) / np.max(np.abs(exact)))
    return differences


if __name__ == "__main__":
    main()
