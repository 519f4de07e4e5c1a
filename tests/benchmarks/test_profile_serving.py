"""python -m benchmarks.profile_serving: TensorFlow's profiler on the served signature, OpenVINO's counters."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def profile(*flags, workdir):
    environment = {**os.environ, "PYTHONPATH": REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile_serving", "--variant", "smoke",
                           "--calls", "2", "--seconds", "0.5", "--workdir", str(workdir), *flags],
                          capture_output=True, text=True, env=environment, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_profiles_name_the_ops_that_ran(tmp_path):
    float32 = profile("--batch", "2", "--top", "1000", workdir=tmp_path)
    # The SavedModel's projections ran as fused MatMul + BiasAdd (+ GELU) kernels, in float32:
    # Grappler's _FusedMatMul, or oneDNN's _MklNativeFusedMatMul where TensorFlow turns oneDNN on
    # (CPUs with AVX-512 VNNI or newer; its plain MatMul is _MklMatMul). The only unfused MatMuls
    # are the smoke model's one self-attention block's two head mixes (an H×H kernel times
    # (batch, H, N·N), no bias on its last axis to fuse): a projection left unfused makes more.
    # Every op type is listed (--top 1000): cut at the top 12, whether a 2 % op shows depends on
    # the machine's load.
    assert "smoke bs2, SavedModel serving_default, float32" in float32
    assert re.search(r"\| _(MklNative)?FusedMatMul \| \d+\.\d\d \| \d+ % \| \d+ \|", float32)
    unfused = re.findall(r"\| (?:_Mkl|_MklNative)?MatMul \| \d+\.\d\d \| \d+ % \| (\d+) \|", float32)
    assert unfused == ["2"], float32
    bfloat16 = profile("--compute-dtype", "bfloat16", workdir=tmp_path)
    assert "SavedModel serving_default, bfloat16" in bfloat16
    assert "| Cast |" in bfloat16 and "| Cast |" not in float32
    openvino = profile("--openvino", "f32", workdir=tmp_path)
    for model in ("ours", "timm"):
        assert f"smoke bs1, OpenVINO f32, {model}:" in openvino
    assert openvino.count("| FullyConnected") >= 2


def test_the_openvino_profile_by_shape_tells_the_head_mixes_apart(tmp_path):
    """--by-shape splits a layer type by its inputs: our talking-heads mixes, the (H, H) @ (H, batch·N·N)
    MatMuls, are a row of their own beside the attention's (batch·H, N, d) MatMuls."""
    openvino = profile("--openvino", "f32", "--by-shape", "--top", "1000", workdir=tmp_path)
    ours = openvino[openvino.index("OpenVINO f32, ours:"):openvino.index("OpenVINO f32, timm:")]
    assert re.search(r"ours: \d+\.\d ms per call \(counters\)", ours)
    assert re.search(r"\| MatMul \(\S+\) \[(\d+),\1\] × \[\1,\?\] \| \d+\.\d \|", ours), ours
    assert re.search(r"\| FullyConnected \(\S+\) \[\?,\d+\] × \[\d+,\d+\]", ours), ours
    assert re.search(r"timm: \d+\.\d ms per call \(counters\)", openvino)
