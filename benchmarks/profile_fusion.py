"""Why keras_cait's JAX training step is slow on a CPU: XLA:CPU's fusions, counted and timed.

    python -m benchmarks.profile_fusion --backend jax --depth 24 --batch 8
    python -m benchmarks.profile_fusion --backend tensorflow --depth 24 --batch 8
    XLA_FLAGS=--xla_disable_hlo_passes=fusion python -m benchmarks.profile_fusion --backend jax

One process per call. It builds an XXS-width CaiT (192 wide, 4 heads) of `--depth`
blocks as benchmarks/training.py does (DeiT's AdamW, drop path 0.1,
cross-entropy on logits, `jit_compile=True`), runs `train_on_batch` on a random
batch, and prints one JSON line: the median step time over `--steps` steps, the
CPU time they used, and the size of the compiled step as XLA dumped it after
optimisation (instructions in all fused computations; fusions of over 200
instructions, and the largest). docs/benchmarks.md ("Why JAX is slower here")
reads these numbers.
"""

import argparse
import collections
import glob
import json
import os
import resource
import tempfile
import time

BIG = 200  # instructions: a fusion above this recomputes long chains


def fused_sizes(dump):
    """Instructions of each computation (fusions and their callees) in the step's optimised HLO."""
    files = glob.glob(os.path.join(dump, "*train_step*cpu_after_optimizations.txt"))
    files = files or glob.glob(os.path.join(dump, "*cpu_after_optimizations.txt"))
    text = max((open(path).read() for path in files), key=len)  # the training step is the largest module
    sizes, current = collections.Counter(), None
    for line in text.split("\n"):
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            current = None if line.startswith(("ENTRY", "HloModule")) else line.split()[0]
        elif current and line.startswith("  "):
            sizes[current] += 1
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="jax", choices=["jax", "tensorflow"])
    parser.add_argument("--policy", default="float32", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dump = tempfile.mkdtemp()
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text"
    os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    from benchmarks.training import keras_training_model

    config = dict(embed_dim=192, depth=args.depth, num_heads=4, init_values=1e-5)
    model = keras_training_model(config, 1000, args.image_size, args.policy, jit_compile=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.batch, args.image_size, args.image_size, 3)).astype("float32")
    labels = np.eye(1000, dtype="float32")[rng.integers(0, 1000, args.batch)]
    for _ in range(2):  # compiles
        model.train_on_batch(images, labels)
    before, times = resource.getrusage(resource.RUSAGE_SELF), []
    for _ in range(args.steps):
        start = time.perf_counter()
        model.train_on_batch(images, labels)
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    sizes = fused_sizes(dump)
    big = [size for size in sizes.values() if size > BIG]
    print(json.dumps(dict(
        backend=args.backend, policy=args.policy, xla_flags=flags, depth=args.depth, batch=args.batch,
        step_seconds=sorted(times)[len(times) // 2],
        cpu_seconds_per_step=(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / args.steps,
        fused_instructions=sum(sizes.values()), fusions_over_200=len(big), their_instructions=sum(big),
        largest_fusion=max(sizes.values()),
    )))


if __name__ == "__main__":
    main()
