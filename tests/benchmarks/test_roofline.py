"""python -m benchmarks.roofline: the classes of a training step's instructions, and the smoke run."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.roofline import op_class

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("op_name, expected", [
    ("jit(step)/jvp(self_attention_block_3)/attention/qkv/dot_general", "linear layers"),
    ("jit(step)/transpose(jvp(self_attention_block_3))/attention/output_projection/dot_general", "linear layers"),
    ("jit(step)/jvp(class_attention_block_0)/attention/key/add", "linear layers"),
    ("jit(step)/jvp(patch_embedding)/projection/conv_general_dilated", "linear layers"),
    ("jit(step)/transpose(jvp(self_attention_block_0))/attention/dot_general", "talking-heads attention"),
    ("jit(step)/jvp(self_attention_block_0)/attention/exp", "talking-heads attention"),
    ("jit(step)/jvp(class_attention_block_1)/attention/reduce_max", "class attention"),
    ("jit(step)/jvp(self_attention_block_0)/attention_norm/rsqrt", "norms, GELU, LayerScale, residual, drop path"),
    ("jit(step)/jvp(class_attention_block_0)/erfc", "norms, GELU, LayerScale, residual, drop path"),
    ("jit(step)/jvp(final_norm)/mul", "norms, GELU, LayerScale, residual, drop path"),
    ("jit(step)/optimizer/mul", "optimizer"),
    ("jit(step)/jvp(position_embedding)/add", "other"),
])
def test_each_instruction_is_classed_by_its_layer(op_name, expected):
    assert op_class(op_name) == expected


@pytest.mark.large
def test_smoke_run_adds_up_to_xla_s_own_cost_analysis(tmp_path):
    output = tmp_path / "roofline.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.roofline", "--smoke", "--output", str(output)],
        env={**os.environ, "PYTHONPATH": REPOSITORY, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    assert all(row["flops"] > 0 and row["bytes"] > 0 for row in result["classes"].values()), result["classes"]
    for key in ("flops", "bytes"):
        assert result["total"][key] == pytest.approx(result["xla_cost_analysis"][key], rel=0.02)
    for row in result["classes"].values():
        assert row["bound_ms"] == pytest.approx(max(row["flops"] / 989.4e9, row["bytes"] / 3.35e9))
    assert result["precision"] == "mixed_bfloat16" and result["peaks"]["measured"] is False
    assert "bf16" in result["array_dtypes"]


@pytest.mark.large
def test_a_cpu_roofline_in_float32_divides_by_the_peaks_it_measured(tmp_path):
    output = tmp_path / "roofline.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.roofline", "--smoke", "--cpu", "--precision", "float32",
         "--output", str(output)],
        env={**os.environ, "PYTHONPATH": REPOSITORY, "KERAS_BACKEND": "jax"},
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    peaks = result["peaks"]
    assert peaks["measured"] is True and 1 < peaks["tflops"] * 1e3 < 1e5 and 0.5 < peaks["gbps"] < 2000
    assert result["precision"] == "float32" and result["device"] == "cpu"
    for row in result["classes"].values():
        assert row["bound_ms"] == pytest.approx(
            max(row["flops"] / peaks["tflops"] / 1e9, row["bytes"] / peaks["gbps"] / 1e6))
    # float32 throughout: no bfloat16 array anywhere in the step's program, which the default has.
    assert "f32" in result["array_dtypes"] and "bf16" not in result["array_dtypes"]
