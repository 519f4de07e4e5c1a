"""Training throughput of CaiT: Keras (JAX backend, mixed_bfloat16, model.fit) vs timm (AMP bf16).

For each model (CaiT-S24 and CaiT-XXS24 at 224 by default) it measures, on the
same machine and with the same batch, in a fresh process each:

    keras         keras_cait model under "mixed_bfloat16", model.fit, XLA (JAX backend)
    timm-eager    timm's model, torch.autocast(bfloat16), timm's AdamW param groups
    timm-compile  the same under torch.compile

and reports images/s, the time per step and the model FLOP utilisation (MFU):
3 × forward FLOPs per image (forward + backward) × images/s / the GPU's peak
dense bf16 rate. Forward FLOPs are counted analytically (matmuls and the patch
convolution, as torch's FlopCounterMode counts them). Data are random images
already on the device, so the input pipeline is not measured. Both use AdamW
with weight decay 0.05 off biases, norms, LayerScale, pos_embed and cls_token,
and a cross-entropy on logits.

On the GPU machine (PyTorch, JAX and timm, no TensorFlow):

    KERAS_BACKEND=jax python scripts/benchmark_training.py --output results.json

`--smoke` runs a tiny CaiT at 32×32 for a few steps on whatever device there is
(CPU here), to check every path and the FLOP count against FlopCounterMode.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

VARIANTS = {  # embed_dim, depth, heads, timm architecture
    "S24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5, timm="cait_s24_224"),
    "XXS24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5, timm="cait_xxs24_224"),
}
SMOKE = dict(embed_dim=32, depth=1, num_heads=2, init_values=0.1, patch_size=8)
SMOKE_CLASSES = 10
WORKERS = ("keras", "timm-eager", "timm-compile")
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


def run_keras(args):
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras
    import numpy as np

    from keras_cait.model import build_cait
    from keras_cait.training import adamw

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()}; set KERAS_BACKEND=jax.")
    config, classes, _ = _config(args)
    config.pop("timm", None)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = build_cait(
        **config, input_shape=(args.image_size, args.image_size, 3), classes=classes,
        classifier_activation=None,
    )
    model.compile(
        optimizer=adamw(model, 5e-4),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    images = jax.device_put(rng.integers(0, 256, (args.batch_size, args.image_size,
                                                  args.image_size, 3), dtype=np.uint8))
    labels = jax.device_put(np.eye(classes, dtype="float32")[rng.integers(0, classes, args.batch_size)])

    def batches():
        while True:
            yield images, labels

    model.fit(batches(), steps_per_epoch=args.warmup, epochs=1, verbose=0)  # compiles
    start = time.perf_counter()
    history = model.fit(batches(), steps_per_epoch=args.steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - start  # fit ends by reading the loss: the steps are done
    return dict(seconds=seconds, loss=float(history.history["loss"][-1]),
                device=jax.devices()[0].device_kind, framework=f"keras {keras.__version__} "
                f"(jax {jax.__version__}), mixed_bfloat16, model.fit, XLA",
                tensorflow_loaded="tensorflow" in sys.modules)


def run_timm(args, compiled):
    import timm
    import torch
    from timm.optim import create_optimizer_v2

    config, classes, architecture = _config(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        config.pop("init_values")
        model = timm.models.cait.Cait(img_size=args.image_size, num_classes=classes,
                                      init_values=SMOKE["init_values"], **config)
    else:
        model = timm.create_model(architecture, pretrained=False, num_classes=classes)
    model = model.to(device).train()
    optimizer = create_optimizer_v2(model, "adamw", lr=5e-4, weight_decay=0.05)
    step_model = torch.compile(model) if compiled else model
    criterion = torch.nn.CrossEntropyLoss()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, classes, (args.batch_size,), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = criterion(step_model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    def synchronize():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    synchronize()
    seconds = time.perf_counter() - start
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result = dict(seconds=seconds, loss=float(loss), device=name,
                  framework=f"timm {timm.__version__} (torch {torch.__version__}), AMP bfloat16"
                  + (", torch.compile" if compiled else ", eager"))
    if args.smoke and not compiled:
        from torch.utils.flop_counter import FlopCounterMode

        # Count the attention matmuls as explicit matmuls: torch's fused attention kernel
        # (scaled_dot_product_attention) is not counted by FlopCounterMode on every build and
        # device, and the analytic formula counts q·kᵀ and attn·v like any other matmul.
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
        counter = FlopCounterMode(display=False)
        with counter:
            model.eval()(images[:1])
        result["counted_forward_flops"] = counter.get_total_flops()
    return result


def worker(args):
    if args.worker == "keras":
        result = run_keras(args)
    else:
        result = run_timm(args, compiled=args.worker == "timm-compile")
    print(json.dumps(result), flush=True)


def measure(args):
    """Runs every (model, worker) in its own process; returns the rows of the report."""
    rows = []
    models = ["smoke"] if args.smoke else args.models.split(",")
    for model in models:
        config, classes, _ = _config(argparse.Namespace(**{**vars(args), "model": model}))
        flops = forward_flops(args.image_size, config.get("patch_size", 16), config["embed_dim"],
                              config["depth"], config["num_heads"], classes)
        for name in args.workers.split(","):
            command = [sys.executable, os.path.abspath(__file__), "--worker", name,
                       "--model", model, "--batch-size", str(args.batch_size),
                       "--image-size", str(args.image_size), "--steps", str(args.steps),
                       "--warmup", str(args.warmup)] + (["--smoke"] if args.smoke else [])
            env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join(
                [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                 os.environ.get("PYTHONPATH", "")])}
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                print(done.stdout + done.stderr, file=sys.stderr)
                raise SystemExit(f"{name} on {model} failed (exit {done.returncode}).")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            images_per_second = args.batch_size * args.steps / result["seconds"]
            peak = args.peak_tflops or peak_tflops(result["device"])
            achieved = 3 * flops * images_per_second / 1e12
            rows.append(dict(
                model=model, worker=name, batch_size=args.batch_size, image_size=args.image_size,
                images_per_second=images_per_second,
                step_ms=1000 * result["seconds"] / args.steps,
                train_tflops=achieved, peak_tflops=peak,
                mfu=achieved / peak if peak else None,
                forward_gflops_per_image=flops / 1e9, **result,
            ))
            print(f"{model:6s} {name:13s} {images_per_second:9.1f} images/s", flush=True)
    return rows


def markdown(rows):
    lines = [
        "| model | framework | batch | images/s | ms/step | train TFLOP/s | MFU | vs timm eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    eager = {r["model"]: r["images_per_second"] for r in rows if r["worker"] == "timm-eager"}
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        ratio = r["images_per_second"] / eager.get(r["model"], math.nan)
        lines.append(
            f"| CaiT-{r['model']} {r['image_size']} | {r['framework']} | {r['batch_size']} | "
            f"{r['images_per_second']:.0f} | {r['step_ms']:.1f} | {r['train_tflops']:.1f} | "
            f"{mfu} | {ratio:.2f}× |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default="S24,XXS24", help="comma-separated CaiT variants")
    parser.add_argument("--batch-size", type=int, default=256, help="images per step")
    parser.add_argument("--image-size", type=int, default=224, help="input side")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="steps before timing (compiles)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak dense bf16 TFLOP/s for MFU (default: from the device name)")
    parser.add_argument("--workers", default=",".join(WORKERS),
                        help="what to measure, of " + ", ".join(WORKERS))
    parser.add_argument("--output", help="write the rows as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny CaiT at 32×32, batch 4, 2 steps: checks every path on a CPU")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.workers.split(",")) - set(WORKERS)
    if unknown:
        parser.error(f"--workers: unknown {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(WORKERS)}")
    if args.smoke:
        args.image_size, args.steps, args.warmup = 32, 2, 1
        args.batch_size = min(args.batch_size, 4)
    if args.worker:
        worker(args)
        return
    rows = measure(args)
    print(markdown(rows))
    counted = [r["counted_forward_flops"] for r in rows if "counted_forward_flops" in r]
    if counted:  # the smoke run's check of the FLOP formula
        counted, analytic = counted[0], rows[0]["forward_gflops_per_image"] * 1e9
        print(f"forward FLOPs per image: analytic {analytic:.0f}, FlopCounterMode {counted:.0f}")
        if not math.isclose(analytic, counted, rel_tol=1e-9):
            raise SystemExit("The analytic FLOP count disagrees with FlopCounterMode.")
    if args.output:
        with open(args.output + ".partial", "w") as file:
            json.dump(rows, file, indent=1)
        os.replace(args.output + ".partial", args.output)


if __name__ == "__main__":
    main()
