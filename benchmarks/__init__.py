"""Benchmarks of keras_cait against timm, run from the repository root as modules.

    python -m benchmarks.inference --output cpu.json       # CPU inference, every path
    python -m benchmarks.training --cpu --output training_cpu.json
    python -m benchmarks.training --output training_gpu.json   # on a GPU
    python -m benchmarks.input --photos /tmp/photos --output input_cpu.json
    python -m benchmarks.hf_cache --rounds 3                # time to the first prediction
    python -m benchmarks.graph_counts --variant XXS24       # op and node counts of the exports
    python -m benchmarks.profile_fusion --backend jax       # XLA:CPU's fusions in a training step
    python -m benchmarks.talking_heads_kernel               # the fused attention kernel vs keras.ops (JAX)
    python -m benchmarks.roofline                           # a training step's FLOPs and bytes by layer kind
    python -m benchmarks.gpu_compile                        # the fused kernels compiled for an H100, no GPU

Each has `--smoke` or small arguments that tests/benchmarks/ runs. `harness` is the
interleaved timing that inference, training and input share: one persistent worker
process per path (`python -m benchmarks.<module> --worker PATH`), timed in turns.
docs/benchmarks.md has the figures, the machines and the commands that made them.
"""
