"""XLA:GPU's compiled program for an H100, on a machine without a GPU.

    python -m benchmarks.gpu_compile                      # the fused kernels at CaiT-S24's shape
    python -m benchmarks.gpu_compile --heads 4 --tokens 577 --output kernels.json
    python -m benchmarks.roofline --gpu-target            # the roofline of XLA:GPU's step (benchmarks/roofline.py)

JAX's CUDA plugin compiles for a GPU it does not have ("deviceless" compilation): given a
description of the target (`H100_TARGET_CONFIG`, an H100 SXM's properties as XLA's
`GpuTargetConfig` text), `jax.experimental.topologies` gives compile-only devices, and a
program lowered onto one runs XLA:GPU's whole pipeline, Triton and ptxas included: what fails
to compile there (a kernel asking for more shared memory than the chip has) fails here too,
and the PTX it emits is the PTX a real H100 would run. What it cannot do is autotune, so XLA's
own matmuls go to cuBLAS (`--xla_gpu_enable_triton_gemm=false`, the flag this module sets)
rather than to the Triton tiles an autotuner on the chip might pick.

This module compiles the fused talking-heads attention (keras_cait/kernels/talking_heads_pallas.py)
forward and backward at one layer's shape, reads the PTX of each of its three kernels from
XLA's dump, and runs `ptxas -v` on it for sm_90a: registers per thread, spilled bytes and
stack frame. It prints one JSON object (`kernels`: name -> those figures; `compile_seconds`).

Needs, beside the project: `pip install "jax[cuda12]"` at the jax version installed (no GPU
needed; its cuInit check is skipped with JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1, which this module
sets) and `ptxas` on PATH or in the nvidia-cuda-nvcc wheel that comes with it.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import print_result

# An H100 SXM 80GB as XLA:GPU's GpuTargetConfig (text proto): the device properties a
# compilation reads (compute capability 9.0, 132 SMs, 227 KB of shared memory per block
# opt-in, 50 MB of L2, 3.35 TB/s), with the cuDNN and CUDA versions of jax[cuda12].
H100_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: 12 minor: 9 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
KERNELS = ("talking_heads_attention_forward", "talking_heads_attention_backward_queries",
           "talking_heads_attention_backward_keys")


def prepare_environment(dump=None):
    """Environment for a deviceless compilation; call before JAX is imported."""
    if "jax" in sys.modules:
        if os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK") == "1" and not dump:
            return  # prepared already, before JAX was imported
        raise RuntimeError("benchmarks.gpu_compile must set up the environment before JAX is imported")
    os.environ["JAX_PLATFORMS"] = "cpu"  # the CUDA plugin still loads; no GPU is looked for
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    os.environ.setdefault("KERAS_BACKEND", "jax")
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    if dump:
        flags += f" --xla_dump_to={dump}"
    os.environ["XLA_FLAGS"] = flags.strip()


def h100():
    """A compile-only H100 device (JAX's CUDA plugin, no GPU needed)."""
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=H100_TARGET_CONFIG, topology="1x1x1")
    except NotImplementedError as error:
        raise SystemExit(f"benchmarks.gpu_compile: JAX's CUDA plugin is not installed ({error}); "
                         'pip install "jax[cuda12]==<the installed jax version>"') from None
    return topology.devices[0]


def on_device(device, shape, dtype):
    import jax

    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def ptxas():
    """ptxas on PATH, else the one of the nvidia-cuda-nvcc wheel that jax[cuda12] installs beside jax."""
    import jax

    wheel = os.path.join(os.path.dirname(os.path.dirname(jax.__file__)), "nvidia", "cuda_nvcc", "bin", "ptxas")
    found = shutil.which("ptxas") or (wheel if os.path.exists(wheel) else None)
    if not found:
        raise SystemExit("benchmarks.gpu_compile: no ptxas (on PATH or in the nvidia-cuda-nvcc wheel)")
    return found


def ptxas_report(ptx_file, architecture="sm_90a"):
    """{registers, spill_store_bytes, spill_load_bytes, stack_frame_bytes} of the one kernel in `ptx_file`."""
    done = subprocess.run([ptxas(), f"-arch={architecture}", "-v", ptx_file, "-o", os.devnull],
                          capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return dict(registers=int(re.search(r"Used (\d+) registers", text).group(1)),
                stack_frame_bytes=int(spills.group(1)), spill_store_bytes=int(spills.group(2)),
                spill_load_bytes=int(spills.group(3)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=197, help="197: a 224 image's patches and the class token")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=48)
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as dump:
        prepare_environment(dump)
        import jax
        import jax.numpy as jnp

        from keras_cait.kernels.talking_heads_pallas import talking_heads_attention

        device = h100()
        tokens = on_device(device, (args.batch, args.tokens, args.heads, args.head_dim), jnp.bfloat16)
        mix, bias = on_device(device, (args.heads, args.heads), jnp.float32), on_device(device, (args.heads,), jnp.float32)

        def loss(*inputs):
            outputs = talking_heads_attention(*inputs, scale=args.head_dim ** -0.5, interpret=False)
            return outputs.astype(jnp.float32).sum()

        start = time.perf_counter()
        jax.jit(jax.grad(loss, argnums=tuple(range(6)))).lower(tokens, tokens, tokens, mix, mix, bias).compile()
        seconds = time.perf_counter() - start
        kernels = {}
        for ptx_file in glob.glob(os.path.join(dump, "*.ptx")):
            with open(ptx_file) as file:
                entry = re.search(r"\.entry (\w+)\(", file.read())
            if entry and entry.group(1) in KERNELS:
                kernels[entry.group(1)] = ptxas_report(ptx_file)
    missing = sorted(set(KERNELS) - set(kernels))
    if missing:
        raise SystemExit(f"benchmarks.gpu_compile: no PTX for {missing} in XLA's dump")
    result = dict(target="NVIDIA H100 80GB HBM3 (sm_90a), compile-only", shape=dict(
        batch=args.batch, tokens=args.tokens, heads=args.heads, head_dim=args.head_dim, dtype="bfloat16"),
        jax=jax.__version__, compile_seconds=round(seconds, 1), kernels={name: kernels[name] for name in KERNELS})
    return print_result(result, args.output)


if __name__ == "__main__":
    main()
