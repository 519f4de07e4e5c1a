"""Training throughput of CaiT: keras_cait (JAX, mixed_bfloat16) vs timm (AMP bf16), timed in turns.

Every path is one persistent worker process, loaded (compiled, warmed up) before
any timing, then timed in turns by the harness that benchmarks.inference uses
(benchmarks/harness.py): `--rounds` rounds in which each path trains for
`--seconds` while the others wait, the order rotated each round. A path's
images/s is the median of its rounds; its ratio to timm eager the median of the
per-round ratios, so both sides of a ratio saw the same machine. Each step is one
training step on a fixed random batch already on the device (forward + backward +
AdamW with weight decay 0.05 off biases, norms, LayerScale, pos_embed and
cls_token; drop path 0.1; cross-entropy on logits); the input pipeline is not
measured. keras_cait's step is `train_on_batch`, the step `model.fit` runs.

On a GPU (the default), for CaiT-S24 and CaiT-XXS24 at 224, batch 128 (the
paper's per GPU), the four paths side by side on the one GPU:

    keras         keras_cait under "mixed_bfloat16", XLA (JAX backend)
    keras-unfused the same without the fused talking-heads attention (keras.ops)
    timm-eager    timm's model, torch.autocast(bfloat16), timm's AdamW param groups
    timm-compile  the same under torch.compile

and reports images/s, the time per step, the model FLOP utilisation (MFU: 3 ×
forward FLOPs per image × images/s / the GPU's dense bf16 peak from its
datasheet) and each worker's peak GPU memory. Forward FLOPs are counted
analytically (matmuls and the patch convolution, as torch's FlopCounterMode
counts them). On the GPU machine (PyTorch, JAX and timm, no TensorFlow):

    python -m benchmarks.training --output training_gpu.json

`--smoke` runs a tiny CaiT at 32×32 on whatever device there is (the CPU here)
through every path, and checks the FLOP count against FlopCounterMode.

On a CPU (`--cpu`), every path is one persistent worker timed in turns by the
harness that benchmarks.inference uses (benchmarks/harness.py): one training
step on a fixed batch (forward + backward + AdamW with DeiT's decay set, drop path
0.1, cross-entropy on logits), keras_cait through `train_on_batch` (the step `fit`
runs) on TensorFlow, TensorFlow + XLA and JAX, each in float32 and
`mixed_bfloat16`, against timm eager, torch.compile and timm under
`torch.autocast(bfloat16)`; and three levers, `mixed_bfloat16` with a bfloat16 residual
stream, JAX with XLA:CPU's instruction fusion off, and TensorFlow (float32 and
`mixed_bfloat16`) with the pre-softmax head mix's bias computed and trained, which the softmax
cancels. It reports images/s, the ratio to timm eager (median
of per-round ratios), GFLOP/s (3 × forward) against the fp32 matmul ceiling, and
each worker's peak memory, and what each worker observed of its levers (`levers`: the dtype
its step computed in, what XLA compiled). Training workers hold GBs of activations, so at most
`--alive` paths (timm eager among them, the reference of every group) are
loaded at once; each group is timed in its own rounds:

    python -m benchmarks.training --cpu --output training_cpu.json
    python -m benchmarks.training --cpu --smoke                   # every path, tiny model

(from the repository root; the workers find this checkout's keras_cait whatever the cwd).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import harness
from benchmarks.harness import CEILING, Worker, load_all, machine_state, median_ratios, timed_rounds

VARIANTS = {  # embed_dim, depth, heads, timm architecture
    "S24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5, timm="cait_s24_224"),
    "XXS24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5, timm="cait_xxs24_224"),
}
SMOKE = dict(embed_dim=32, depth=1, num_heads=2, init_values=0.1, patch_size=8)
SMOKE_CLASSES = 10
DROP_PATH_RATE = 0.1
LEARNING_RATE = 5e-4
WORKERS = ("keras", "keras-unfused", "timm-eager", "timm-compile")
# Dense bf16 tensor-core peaks from NVIDIA's datasheets, in TFLOP/s.
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0}


def forward_flops(image_size, patch_size, embed_dim, depth, num_heads, classes,
                  class_attention_depth=2, mlp_ratio=4):
    """Matmul and convolution FLOPs (2 per multiply-add) of one image's forward pass."""
    tokens = (image_size // patch_size) ** 2
    d, n, h = embed_dim, tokens, num_heads
    hidden = mlp_ratio * d
    patch = 2 * n * patch_size * patch_size * 3 * d
    self_attention = (
        2 * n * d * 3 * d  # qkv
        + 2 * n * n * d  # q k^T over all heads
        + 2 * 2 * n * n * h * h  # the two talking-heads mixes
        + 2 * n * n * d  # attention × v
        + 2 * n * d * d  # output projection
        + 2 * 2 * n * d * hidden  # MLP
    )
    t = n + 1  # the class token attends to [class, patches]
    class_attention = (
        2 * d * d + 2 * 2 * t * d * d  # q of the class token, k and v of all
        + 2 * 2 * t * d  # q k^T and attention × v
        + 2 * d * d  # output projection
        + 2 * 2 * d * hidden  # MLP of the class token
    )
    return patch + depth * self_attention + class_attention_depth * class_attention + 2 * d * classes


def peak_tflops(device_name):
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_TFLOPS[key]
    return None


def _config(args):
    if args.smoke:
        return dict(SMOKE), SMOKE_CLASSES, "cait_smoke"
    variant = dict(VARIANTS[args.model])
    return variant, 1000, variant.pop("timm")


# === One training step, as each framework takes it ===


def keras_training_model(config, classes, image_size, policy, jit_compile):
    """keras_cait's model compiled for training: DeiT's AdamW, drop path 0.1, cross-entropy on logits."""
    import keras

    from keras_cait.models.architecture import build_cait
    from keras_cait.training import adamw

    keras.mixed_precision.set_global_policy(policy)
    model = build_cait(
        **config, input_shape=(image_size, image_size, 3), classes=classes,
        classifier_activation=None, drop_path_rate=DROP_PATH_RATE,
    )
    model.compile(
        optimizer=adamw(model, LEARNING_RATE),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return model


def timm_training_step(config, classes, architecture, image_size, batch_size, device, compiled, bfloat16):
    """timm's model, its AdamW param groups (DeiT's decay set), drop path 0.1 and a step function.

    Returns (model, step): `step()` runs forward + backward + AdamW on a fixed
    random batch and returns the loss.
    """
    import timm
    import torch
    from timm.optim import create_optimizer_v2

    if "patch_size" in config:  # the smoke model has no timm architecture name
        config = {k: v for k, v in config.items() if k != "init_values"}
        model = timm.models.cait.Cait(img_size=image_size, num_classes=classes, init_values=SMOKE["init_values"],
                                      drop_path_rate=DROP_PATH_RATE, **config)
    else:
        model = timm.create_model(architecture, pretrained=False, num_classes=classes,
                                  drop_path_rate=DROP_PATH_RATE)
    model = model.to(device).train()
    optimizer = create_optimizer_v2(model, "adamw", lr=LEARNING_RATE, weight_decay=0.05, eps=1e-8)
    step_model = torch.compile(model) if compiled else model
    criterion = torch.nn.CrossEntropyLoss()
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, classes, (batch_size,), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bfloat16):
            logits = step_model(images)
            loss = criterion(logits, labels)
        step.logits_dtype = str(logits.dtype).removeprefix("torch.")  # what autocast made of the step
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return model, step


# === GPU: the three paths loaded side by side, timed in turns ===


GPU_LABELS = {
    "keras": "keras_cait, JAX (XLA), `mixed_bfloat16`",
    "keras-unfused": "keras_cait, JAX (XLA), `mixed_bfloat16`, keras.ops attention (KERAS_CAIT_FUSED_ATTENTION=0)",
    "timm-eager": "timm eager, `torch.autocast(bfloat16)`",
    "timm-compile": "timm + torch.compile, `torch.autocast(bfloat16)`",
}
# The training workers share one GPU: none takes the whole memory up front.
GPU_ENVIRONMENT = {"KERAS_BACKEND": "jax", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
# keras_cait's step without the fused talking-heads attention (docs/benchmarks.md), beside the one with it.
GPU_PATH_ENVIRONMENT = {"keras-unfused": {"KERAS_CAIT_FUSED_ATTENTION": "0"}}


def gpu_training_step(path, config, classes, architecture, image_size, batch_size, smoke):
    """(`run(_) -> loss` of one training step of `path` on a fixed random batch already on the
    device, `levers() -> dict` of what the worker ran on and with). Returning the loss as a
    number waits for the step, on either framework."""
    if path in ("keras", "keras-unfused"):
        import jax
        import keras
        import numpy as np

        if keras.backend.backend() != "jax":
            raise RuntimeError(f"Keras runs on {keras.backend.backend()}; set KERAS_BACKEND=jax.")
        model = keras_training_model(config, classes, image_size, "mixed_bfloat16", jit_compile=True)
        rng = np.random.default_rng(0)
        images = jax.device_put(rng.integers(0, 256, (batch_size, image_size, image_size, 3)).astype("float32"))
        labels = jax.device_put(np.eye(classes, dtype="float32")[rng.integers(0, classes, batch_size)])

        def levers():
            device = jax.devices()[0]
            block = model.get_layer("self_attention_block_0")
            return {"device": device.device_kind, "tensorflow_loaded": "tensorflow" in sys.modules,
                    "framework": f"keras {keras.__version__} (jax {jax.__version__}), mixed_bfloat16, "
                                 "train_on_batch (fit's step), XLA",
                    "compute_dtype": block.mlp_dense_1.dtype_policy.compute_dtype,
                    "fused_attention_variable": os.environ.get("KERAS_CAIT_FUSED_ATTENTION"),
                    "fused_attention": block.attention._runs_fused_kernel(False, (image_size // 16) ** 2),
                    "device_peak_memory_mb": (device.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**20}

        return lambda _: np.asarray(model.train_on_batch(images, labels), "float32"), levers
    import timm
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, step = timm_training_step(config, classes, architecture, image_size, batch_size, device,
                                     compiled=path == "timm-compile", bfloat16=True)

    def levers():
        seen = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "framework": f"timm {timm.__version__} (torch {torch.__version__}), AMP bfloat16, "
                             + ("torch.compile" if path == "timm-compile" else "eager"),
                "device_peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0,
                **timm_levers(step)}
        if smoke and path == "timm-eager":
            seen["counted_forward_flops"] = counted_forward_flops(model, image_size, device)
        return seen

    return lambda _: step().detach().float().cpu().numpy(), levers


def counted_forward_flops(model, image_size, device):
    """torch's FlopCounterMode on one image: the check of `forward_flops`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    # Count the attention matmuls as explicit matmuls: torch's fused attention kernel
    # (scaled_dot_product_attention) is not counted by FlopCounterMode on every build and
    # device, and the analytic formula counts q·kᵀ and attn·v like any other matmul.
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    counter = FlopCounterMode(display=False)
    with counter:
        model.eval()(torch.zeros(1, 3, image_size, image_size, device=device))
    model.train()
    return counter.get_total_flops()


def gpu_worker(args):
    channel = harness.protocol_channel()
    start = time.perf_counter()
    config, classes, architecture = _config(args)
    run, levers = gpu_training_step(args.worker, config, classes, architecture, args.image_size,
                                    args.batch_size, args.smoke)
    harness.serve(channel, run, {args.batch_size: None}, warmups=args.warmup, started=start, levers=levers)


def measure_gpu(args, logs):
    """Rows of the GPU run: per model, every path loaded side by side (compiled, warmed up), then
    timed in turns over `--rounds` rounds; each ratio is the median of per-round ratios."""
    rows = []
    paths = args.workers.split(",")
    for model in ["smoke"] if args.smoke else args.models.split(","):
        config, classes, _ = _config(argparse.Namespace(**{**vars(args), "model": model}))
        flops = forward_flops(args.image_size, config.get("patch_size", 16), config["embed_dim"],
                              config["depth"], config["num_heads"], classes)
        arguments = ["--model", model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
                     "--warmup", str(args.warmup)] + (["--smoke"] if args.smoke else [])
        workers = {path: Worker("benchmarks.training", path, arguments, os.path.join(logs, f"{model}-{path}.log"),
                                environment={**GPU_ENVIRONMENT, **GPU_PATH_ENVIRONMENT.get(path, {})})
                   for path in paths}
        load_all(workers, model)
        speeds, _, memory = timed_rounds(workers, paths, [args.batch_size], args.rounds, args.seconds, model)
        for worker in workers.values():
            worker.close()
        for path in paths:
            ready, rounds = workers[path].ready, speeds[args.batch_size, path]
            levers = ready["levers"]
            images_per_second = statistics.median(rounds)
            peak = args.peak_tflops or peak_tflops(levers["device"])
            achieved = 3 * flops * images_per_second / 1e12
            reference = speeds.get((args.batch_size, "timm-eager"))
            rows.append(dict(
                model=model, path=path, label=GPU_LABELS[path], batch_size=args.batch_size,
                image_size=args.image_size, images_per_second=images_per_second, rounds=rounds,
                step_ms=1000 * args.batch_size / images_per_second,
                ratio_to_timm_eager=median_ratios(rounds, reference) if reference else None,
                train_tflops=achieved, peak_tflops=peak, mfu=achieved / peak if peak else None,
                forward_gflops_per_image=flops / 1e9, loss=float(ready["outputs"][str(args.batch_size)]),
                load_seconds=ready["load_seconds"], peak_memory_mb=memory[path], **levers,
            ))
        if args.output:  # what is measured so far, should a later model not finish
            harness.write_json({"rows": rows}, args.output)
    return rows


def markdown(rows, machine):
    lines = [
        "| model | path | batch | images/s | ms/step | train TFLOP/s (3× forward) | MFU | × timm eager "
        "| GPU memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a"
        ratio = f"{r['ratio_to_timm_eager']:.2f}×" if r["ratio_to_timm_eager"] is not None else "n/a"
        lines.append(
            f"| CaiT-{r['model']} {r['image_size']} | {r['label']} | {r['batch_size']} | "
            f"{r['images_per_second']:.0f} | {r['step_ms']:.1f} | {r['train_tflops']:.1f} | {mfu} | {ratio} "
            f"| {r['device_peak_memory_mb'] / 1024:.1f} GB |"
        )
    lines.append("")
    lines.append(f"{rows[0]['device']}; {machine['rounds']} rounds × {machine['seconds_per_turn']:g} s per "
                 f"turn, {machine['wall_seconds'] / 60:.0f} min; "
                 + ", ".join(f"{name} {machine[name]}" for name in GPU_PACKAGES))
    return "\n".join(lines)


# === CPU: persistent workers timed in turns (benchmarks/harness.py) ===


# path -> (framework, Keras backend or None, jit_compile or torch.compile, bfloat16)
CPU_PATHS = {
    "timm-eager": ("timm", None, False, False),
    "timm-compile": ("timm", None, True, False),
    "timm-bf16": ("timm", None, False, True),
    "keras-tf": ("keras", "tensorflow", False, False),
    "keras-tf-xla": ("keras", "tensorflow", True, False),
    "keras-jax": ("keras", "jax", True, False),
    "keras-tf-bf16": ("keras", "tensorflow", False, True),
    "keras-tf-xla-bf16": ("keras", "tensorflow", True, True),
    "keras-jax-bf16": ("keras", "jax", True, True),
    "keras-tf-bf16-half-stream": ("keras", "tensorflow", False, True),
    "keras-jax-no-fusion": ("keras", "jax", True, False),
    "keras-tf-cancelled-bias": ("keras", "tensorflow", False, False),
    "keras-tf-bf16-cancelled-bias": ("keras", "tensorflow", False, True),
    "keras-tf-onednn": ("keras", "tensorflow", False, False),
}
CPU_REFERENCE = "timm-eager"
CPU_LABELS = {
    "timm-eager": "timm eager, float32",
    "timm-compile": "timm + torch.compile, float32",
    "timm-bf16": "timm under `torch.autocast(bfloat16)`",
    "keras-tf": "keras_cait, TensorFlow, float32",
    "keras-tf-xla": "keras_cait, TensorFlow + XLA, float32",
    "keras-jax": "keras_cait, JAX, float32",
    "keras-tf-bf16": "keras_cait, TensorFlow, `mixed_bfloat16`",
    "keras-tf-xla-bf16": "keras_cait, TensorFlow + XLA, `mixed_bfloat16`",
    "keras-jax-bf16": "keras_cait, JAX, `mixed_bfloat16`",
    "keras-tf-bf16-half-stream": "keras_cait, TensorFlow, `mixed_bfloat16`, bfloat16 residual stream",
    "keras-jax-no-fusion": "keras_cait, JAX, float32, XLA:CPU's instruction fusion off",
    "keras-tf-cancelled-bias": "keras_cait, TensorFlow, float32, the pre-softmax bias added and trained",
    "keras-tf-bf16-cancelled-bias": "keras_cait, TensorFlow, `mixed_bfloat16`, the pre-softmax bias added and trained",
    "keras-tf-onednn": "keras_cait, TensorFlow, float32, oneDNN's ops on (`TF_ENABLE_ONEDNN_OPTS=1`)",
}
CPU_PACKAGES = ("torch", "timm", "tensorflow", "keras", "jax", "jaxlib")
GPU_PACKAGES = ("torch", "timm", "keras", "jax", "jaxlib")


def _set_cpu_threads(path, threads):
    """The worker's frameworks on `threads` threads; the Keras backend chosen before Keras loads."""
    framework, backend = CPU_PATHS[path][:2] if path in CPU_PATHS else ("ceiling", None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if backend == "jax":
        # XLA reads no flag after a word without "--" (the thread count below): flags go before it.
        lever = " --xla_disable_hlo_passes=fusion" if path.endswith("-no-fusion") else ""  # docs/benchmarks.md
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + lever + " --xla_cpu_multi_thread_eigen=true "
                                   f"intra_op_parallelism_threads={threads}")
    if backend:
        os.environ["KERAS_BACKEND"] = backend
    if path.endswith("-onednn"):
        # TensorFlow turns oneDNN's ops on by itself only on CPUs with AVX-512 VNNI or newer.
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    if backend == "tensorflow" or path == CEILING:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if framework != "keras":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)


def _half_residual_stream():
    """A lever measured, not a recipe: the residual stream, LayerNorms and head in the half
    compute dtype too (keras_cait keeps them float32 under a mixed policy, as timm's AMP does)."""
    import keras

    from keras_cait.models import blocks, precision

    precision.float32_if_mixed = lambda policy: keras.dtype_policies.get(policy).name
    blocks._ResidualBlock.input_dtype = property(lambda block: block.dtype_policy.compute_dtype)


def _cancelled_bias_computed():
    """A lever measured, not a recipe: the pre-softmax head mix's bias added to the logits and
    trained, as before keras_cait left it out (the softmax cancels it: no output changes, its
    gradient is zero, and the step still computes it)."""
    from keras_cait.layers import talking_heads_attention as module

    mix_heads = module.TalkingHeadsAttention._mix_heads
    module.TalkingHeadsAttention._mix_heads = lambda layer, scores, dense, bias=True: mix_heads(
        layer, scores, dense, True)
    module.TalkingHeadsAttention._freeze_cancelled_bias = lambda layer: None


def cpu_training_step(path, config, classes, architecture, image_size, batch_size):
    """(`run(_) -> loss` of one training step of `path` on a fixed random batch, `levers() -> dict`
    of what the step observably ran with, read once it has run)."""
    framework, backend, compiled, bfloat16 = CPU_PATHS[path]
    if framework == "timm":
        _, step = timm_training_step(config, classes, architecture, image_size, batch_size, "cpu",
                                     compiled, bfloat16)
        return lambda _: step().detach().float().numpy(), lambda: timm_levers(step)
    import numpy as np

    if path.endswith("-half-stream"):
        _half_residual_stream()
    if path.endswith("-cancelled-bias"):
        _cancelled_bias_computed()
    policy = "mixed_bfloat16" if bfloat16 else "float32"
    model = keras_training_model(config, classes, image_size, policy, jit_compile=compiled)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch_size, image_size, image_size, 3)).astype("float32")
    labels = np.eye(classes, dtype="float32")[rng.integers(0, classes, batch_size)]
    return lambda _: np.asarray(model.train_on_batch(images, labels), "float32"), lambda: keras_levers(model)


# === What a worker observes of its levers: a flag that did not apply shows here, not as a slow path ===


def keras_levers(model):
    """The dtypes a block of `model` computes in (its MLP's hidden layer) and keeps its residual stream
    in, and what XLA did: on JAX the largest fusion XLA:CPU makes in this process, on TensorFlow the
    training-step functions marked for XLA compilation."""
    import keras

    block = model.get_layer("self_attention_block_0")
    tokens = keras.ops.zeros((1, 4, block.attention_norm.gamma.shape[0]))
    hidden = block.mlp_dense_1(block.mlp_norm(tokens))
    levers = {
        "compute_dtype": keras.backend.standardize_dtype(hidden.dtype),
        "residual_stream": keras.backend.standardize_dtype(block(tokens, training=False).dtype),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "pre_softmax_bias_trained": any("pre_softmax_head_mix/bias" in weight.path
                                        for weight in model.trainable_weights),
    }
    if keras.backend.backend() == "jax":
        levers["largest_xla_fusion"] = largest_xla_fusion()
    else:
        from tensorflow.python.util import _pywrap_util_port

        levers["xla_compiled_steps"] = len([name for name in xla_compiled_functions() if "one_step_on_data" in name])
        levers["onednn_ops"] = bool(_pywrap_util_port.IsMklEnabled())
    return levers


def largest_xla_fusion():
    """Instructions in the largest fused computation of an elementwise chain (tanh, ×, +) that JAX
    compiles in this process: several with XLA:CPU's fusion pass, 1 with `--xla_disable_hlo_passes=fusion`
    (each op then sits alone in its own kernel). XLA reads XLA_FLAGS once per process, so this is
    what the training step's compilation got too."""
    import jax
    import jax.numpy as jnp

    text = jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0).lower(jnp.ones((64,), "float32")).compile().as_text()
    sizes, current = {}, None
    for line in text.split("\n"):
        if line.startswith("%") and line.rstrip().endswith("{"):  # a computation a fusion calls
            current = line.split()[0]
            sizes[current] = 0
        elif not line.startswith("  "):
            current = None
        elif current and " parameter(" not in line:
            sizes[current] += 1
    return max(sizes.values(), default=0)


def xla_compiled_functions():
    """The functions TensorFlow holds in this process that its runtime must compile with XLA."""
    from tensorflow.python.eager import context

    runtime = context.context()
    return sorted(name for name in runtime.list_function_names()
                  if runtime.get_function_def(name).attr["_XlaMustCompile"].b)


def timm_levers(step):
    """The dtype of the logits in timm's step (bfloat16 under autocast) and the graphs torch.compile made."""
    import torch

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] if hasattr(torch, "_dynamo") else 0
    return {"logits_dtype": step.logits_dtype, "compiled_graphs": graphs}


def cpu_worker(args):
    channel = harness.protocol_channel()
    _set_cpu_threads(args.worker, args.threads)
    start = time.perf_counter()
    if args.worker == CEILING:
        return harness.serve(channel, harness.matmul_ceiling(), {}, ceiling=True, started=start)
    config, classes, architecture = _config(args)
    run, levers = cpu_training_step(args.worker, config, classes, architecture, args.image_size, args.batch_size)
    harness.serve(channel, run, {args.batch_size: None}, started=start, levers=levers)


def measure_cpu(args, logs):
    """Rows of `--cpu`: per model, the reference and ceiling workers stay loaded while the other
    paths come in groups of `--alive - 1`, each group timed in its own rounds."""
    rows = []
    paths = [path for path in args.workers.split(",") if path != CPU_REFERENCE]
    groups = [paths[i:i + args.alive - 1] for i in range(0, len(paths), args.alive - 1)] or [[]]
    for model in ["smoke"] if args.smoke else args.models.split(","):
        config, classes, _ = _config(argparse.Namespace(**{**vars(args), "model": model}))
        flops = forward_flops(args.image_size, config.get("patch_size", 16), config["embed_dim"],
                              config["depth"], config["num_heads"], classes)
        arguments = ["--model", model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
                     "--threads", str(args.threads), "--cpu"] + (["--smoke"] if args.smoke else [])

        def start(path):
            return Worker("benchmarks.training", path, arguments, os.path.join(logs, f"{model}-{path}.log"))

        steady = {path: start(path) for path in (CPU_REFERENCE, CEILING)}
        load_all(steady, model)
        samples, ceilings, memory = {}, [], {}
        losses = {CPU_REFERENCE: steady[CPU_REFERENCE].ready["outputs"][str(args.batch_size)]}
        levers = {CPU_REFERENCE: steady[CPU_REFERENCE].ready["levers"]}
        for group in groups:
            workers = {path: start(path) for path in group}
            load_all(workers, model)
            losses.update({path: worker.ready["outputs"][str(args.batch_size)] for path, worker in workers.items()})
            levers.update({path: worker.ready["levers"] for path, worker in workers.items()})
            speeds, group_ceilings, group_memory = timed_rounds(
                {**steady, **workers}, [CPU_REFERENCE, *group], [args.batch_size], args.rounds, args.seconds,
                model)
            for worker in workers.values():
                worker.close()
            ceilings += group_ceilings
            memory.update(group_memory)
            for path in [CPU_REFERENCE, *group]:
                samples.setdefault(path, []).append(speeds[args.batch_size, path])
        for worker in steady.values():
            worker.close()
        ceiling = statistics.median(ceilings)
        for path, per_group in samples.items():
            if path == CPU_REFERENCE:
                speeds_, ratio = [speed for group in per_group for speed in group], 1.0
            else:  # against the reference's rounds in the path's own group
                group_index = next(i for i, group in enumerate(groups) if path in group)
                speeds_ = per_group[0]
                ratio = median_ratios(speeds_, samples[CPU_REFERENCE][group_index])
            images_per_second = statistics.median(speeds_)
            gflops = 3 * flops * images_per_second / 1e9
            rows.append(dict(
                model=model, path=path, label=CPU_LABELS[path], batch_size=args.batch_size,
                image_size=args.image_size, images_per_second=images_per_second, rounds=speeds_,
                ratio_to_timm_eager=ratio, train_gflops=gflops, ceiling_gflops=ceiling,
                fraction_of_ceiling=gflops / ceiling, peak_memory_mb=memory[path], loss=losses[path],
                forward_gflops_per_image=flops / 1e9, levers=levers[path],
            ))
    return rows


def cpu_markdown(rows, machine):
    lines = [
        "| model | path | images/s | × timm eager | train GFLOP/s (3× forward) | % of fp32 matmul ceiling "
        "| peak memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| CaiT-{r['model']} {r['image_size']}, batch {r['batch_size']} | {r['label']} "
            f"| {r['images_per_second']:.2f} | {r['ratio_to_timm_eager']:.2f}× | {r['train_gflops']:.1f} "
            f"| {100 * r['fraction_of_ceiling']:.0f} % | {r['peak_memory_mb'] / 1024:.1f} GB |"
        )
    lines.append("")
    lines.append(
        f"{machine['cores']} cores, {machine['threads']} threads per worker, {machine['rounds']} rounds × "
        f"{machine['seconds_per_turn']:g} s per turn, {machine['wall_seconds'] / 60:.0f} min; load average "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_start'])} at the start, "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_end'])} at the end; "
        + ", ".join(f"{name} {machine[name]}" for name in CPU_PACKAGES)
    )
    return "\n".join(lines)


def worker(args):
    return cpu_worker(args) if args.cpu else gpu_worker(args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default="S24,XXS24", help="comma-separated CaiT variants")
    parser.add_argument("--batch-size", type=int,
                        help="images per step (default: 128, the paper's per GPU; with --cpu 16)")
    parser.add_argument("--image-size", type=int, default=224, help="input side")
    parser.add_argument("--warmup", type=int, default=5, help="GPU: steps before timing (compiles)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak dense bf16 TFLOP/s for MFU (default: from the device name)")
    parser.add_argument("--workers", help=f"what to measure, of {', '.join(WORKERS)} (default: all), with "
                        f"--cpu of {', '.join(CPU_PATHS)} (default: all)")
    parser.add_argument("--cpu", action="store_true",
                        help="time training steps on this CPU in turns, persistent workers (see above)")
    parser.add_argument("--alive", type=int, default=4,
                        help="--cpu: at most this many training workers loaded at once, timm eager included")
    parser.add_argument("--rounds", type=int, help="rounds of turns (default: 5, with --smoke 1)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each path's turn")
    parser.add_argument("--threads", type=int, default=2, help="--cpu: threads per worker")
    parser.add_argument("--output", help="write the rows as JSON here")
    parser.add_argument("--logs", help="folder for the workers' logs (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny CaiT at 32×32, batch 4, 2 steps: checks every path on a CPU")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    known = CPU_PATHS if args.cpu else WORKERS
    args.workers = args.workers or ",".join(known)
    unknown = set(args.workers.split(",")) - set(known)
    if unknown:
        parser.error(f"--workers: unknown {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    if args.alive < 2:
        parser.error(f"--alive {args.alive}: must be at least 2 (timm eager and one path)")
    args.batch_size = args.batch_size or (16 if args.cpu else 128)
    if args.smoke:
        args.image_size, args.warmup = 32, 1
        args.batch_size = min(args.batch_size, 4)
        args.seconds = 0.2
    args.rounds = args.rounds or (1 if args.smoke else 5)
    if args.worker:
        worker(args)
        return
    load_average, started = os.getloadavg(), time.time()
    with tempfile.TemporaryDirectory() as logs:
        rows = (measure_cpu if args.cpu else measure_gpu)(args, args.logs or logs)
    packages = CPU_PACKAGES if args.cpu else GPU_PACKAGES
    machine = machine_state(args.threads, args.rounds, args.seconds, load_average, started, packages)
    print(cpu_markdown(rows, machine) if args.cpu else markdown(rows, machine))
    counted = [r["counted_forward_flops"] for r in rows if "counted_forward_flops" in r]
    if counted:  # the smoke run's check of the FLOP formula
        analytic = rows[0]["forward_gflops_per_image"] * 1e9
        print(f"forward FLOPs per image: analytic {analytic:.0f}, FlopCounterMode {counted[0]:.0f}")
        if not math.isclose(analytic, counted[0], rel_tol=1e-9):
            raise SystemExit("The analytic FLOP count disagrees with FlopCounterMode.")
    if args.output:
        harness.write_json({"machine": machine, "rows": rows}, args.output)


if __name__ == "__main__":
    main()
