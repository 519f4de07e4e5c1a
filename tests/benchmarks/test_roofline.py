"""python -m benchmarks.roofline: the classes of a training step's instructions, and the smoke run."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.roofline import instruction_times, instructions, measured, op_class, roofline

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


# XLA:GPU's program (benchmarks/gpu_compile.py) calls cuBLAS and cuDNN: a custom-call returns
# (result, scratch workspace). The lines are XLA:GPU's own form, cut down to what is read.
GPU_PROGRAM = """HloModule gpu_step

ENTRY %main (p0: bf16[{m},{k}], p1: bf16[{k},{n}], p2: bf16[{n}], p3: bf16[2,32,32,3], p4: bf16[{c},16,16,3]) -> bf16[{m},{n}] {{
  %p0 = bf16[{m},{k}]{{1,0}} parameter(0)
  %p1 = bf16[{k},{n}]{{1,0}} parameter(1)
  %p2 = bf16[{n}]{{0}} parameter(2)
  %p3 = bf16[2,32,32,3]{{3,2,1,0}} parameter(3)
  %p4 = bf16[{c},16,16,3]{{3,2,1,0}} parameter(4)
  %cublas-lt-matmul.1 = (bf16[{m},{n}]{{1,0}}, s8[4194304]{{0}}) custom-call(%p0, %p1, %p2), custom_call_target="__cublas$lt$matmul", metadata={{op_name="jit(step)/jvp(self_attention_block_0)/mlp_dense_1/dot_general"}}, backend_config={{"gemm_backend_config":{{"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}},"epilogue":"BIAS"}}}}
  %gte.1 = bf16[{m},{n}]{{1,0}} get-tuple-element(%cublas-lt-matmul.1), index=0
  %cudnn-conv.1 = (bf16[2,2,2,{c}]{{3,2,1,0}}, u8[65536]{{0}}) custom-call(%p3, %p4), window={{size=16x16 stride=16x16}}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", metadata={{op_name="jit(step)/jvp(patch_embedding)/projection/conv_general_dilated"}}
  ROOT %gte.2 = bf16[{m},{n}]{{1,0}} get-tuple-element(%cublas-lt-matmul.1), index=0
}}
"""


def test_xla_gpu_s_cublas_and_cudnn_calls_count_their_flops_and_not_their_workspace():
    m, k, n, c = 96, 40, 24, 8
    table = roofline(instructions(GPU_PROGRAM.format(m=m, k=k, n=n, c=c)))
    linear = table["linear layers"]
    assert linear["flops"] == 2 * m * n * k + 2 * (2 * 2 * 2 * c) * (16 * 16 * 3)
    # Bytes: each call's operands and its result, not the scratch workspace beside it.
    gemm = 2 * (m * k + k * n + n + m * n)
    conv = 2 * (2 * 32 * 32 * 3 + c * 16 * 16 * 3 + 2 * 2 * 2 * c)
    assert linear["bytes"] == gemm + conv and linear["instructions"] == 2


@pytest.mark.large
def test_smoke_run_adds_up_to_xla_s_own_cost_analysis(tmp_path):
    output = tmp_path / "roofline.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.roofline", "--smoke", "--profile", "2", "--output", str(output)],
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
    # The profile: XLA:CPU's thunks, each found among the program's instructions and classed.
    profile = result["profile"]
    assert profile["steps"] == 2 and profile["instructions_ms"] > 0 and profile["unmatched_ms"] == 0, profile
    assert sum(profile["classes"].values()) == pytest.approx(profile["instructions_ms"])
    assert {"linear layers", "talking-heads attention", "optimizer"} <= {
        name for name, row in result["classes"].items() if row["measured_ms"] > 0}
    assert profile["slowest"][0]["measured_ms"] >= profile["slowest"][-1]["measured_ms"] > 0


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


def test_the_profile_times_each_instruction_of_the_step_per_step_on_the_gpu_when_there_is_one():
    step = {"hlo_module": "jit_step", "hlo_op": "fusion.1"}
    events = [("/host:CPU", 5e6, step),  # the host's launch of a kernel the GPU ran
              ("/device:GPU:0", 3e6, step), ("/device:GPU:0", 1e6, step),
              ("/device:GPU:0", 2e6, {"hlo_module": "jit_step", "hlo_op": "cublas-lt-matmul.2"}),
              ("/device:GPU:0", 7e6, {"hlo_module": "jit_other", "hlo_op": "fusion.1"}),
              ("/device:GPU:0", 9e6, {"name": "a memcpy"})]
    assert instruction_times(events, steps=2) == {"fusion.1": 2.0, "cublas-lt-matmul.2": 1.0}
    # Without a GPU: the host's thunks.
    assert instruction_times([e for e in events if e[0] == "/host:CPU"], steps=5) == {"fusion.1": 1.0}


def test_measured_times_go_to_their_instruction_s_class_and_the_rest_is_unmatched():
    table = {"fusion.1": ("optimizer", "optimizer/sub", 10, 400), "dot.2": ("linear layers", "qkv/dot", 99, 80)}
    result = measured(table, {"fusion.1": 1.5, "dot.2": 4.0, "fusion.9": 0.5}, step_ms=7.0)
    assert result["classes"] == {"optimizer": 1.5, "linear layers": 4.0} and result["unmatched_ms"] == 0.5
    assert result["instructions_ms"] == 6.0 and result["step_ms"] == 7.0
    assert [row["instruction"] for row in result["slowest"]] == ["dot.2", "fusion.1"]
    assert result["slowest"][0] == dict(instruction="dot.2", label="qkv/dot", measured_ms=4.0, bytes=80, flops=99)
