"""python -m benchmarks.gpu_compile and `roofline --gpu-target`: without JAX's CUDA plugin (not part of
the test environment: it is several GB) each ends with one line that says what to install.
docs/benchmarks.md has what they report where the plugin is installed."""

import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*arguments):
    return subprocess.run([sys.executable, "-m", *arguments], env={**os.environ, "PYTHONPATH": REPOSITORY},
                          capture_output=True, text=True, timeout=300)


def cuda_plugin_installed():
    return run("pip", "show", "jax-cuda12-plugin").returncode == 0


@pytest.mark.large
@pytest.mark.skipif(cuda_plugin_installed(), reason="this environment has JAX's CUDA plugin: the line is not needed")
@pytest.mark.parametrize("command", [["benchmarks.gpu_compile"], ["benchmarks.roofline", "--gpu-target", "--smoke"]])
def test_without_jax_s_cuda_plugin_the_command_says_what_to_install(command):
    done = run(*command)
    assert done.returncode == 1 and not done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("benchmarks.gpu_compile: JAX's CUDA plugin is not installed") and "jax[cuda12]" in last, \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_fused_attention_in_the_roofline_needs_a_gpu_or_the_gpu_target_which_runs_nothing():
    done = run("benchmarks.roofline", "--smoke", "--attention", "fused")
    assert done.returncode == 2 and "--attention fused runs the Pallas kernels on a GPU: give --gpu-target" \
        in done.stderr.splitlines()[-1], done.stderr[-2000:]
    done = run("benchmarks.roofline", "--smoke", "--gpu-target", "--profile", "3")
    assert done.returncode == 2 and "--profile 3: a number of steps" in done.stderr.splitlines()[-1], done.stderr
