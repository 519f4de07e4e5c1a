"""scripts/benchmark_training.py --smoke: the GPU benchmark's code paths and the CPU benchmark's, run small."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPOSITORY, "scripts", "benchmark_training.py")


def load_script():
    spec = importlib.util.spec_from_file_location("benchmark_training", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "embed_dim, num_heads, size, paper_gflops",
    [(192, 4, 224, 2.5), (384, 8, 224, 9.4), (192, 4, 384, 9.5), (384, 8, 384, 32.2)],
    ids=["XXS24-224", "S24-224", "XXS24-384", "S24-384"],
)
def test_flop_count_matches_the_paper(embed_dim, num_heads, size, paper_gflops):
    """The CaiT paper (arXiv 2103.17239) lists its models with multiply-adds as FLOPs."""
    flops = load_script().forward_flops(size, 16, embed_dim, 24, num_heads, 1000)
    assert flops / 2 / 1e9 == pytest.approx(paper_gflops, rel=0.015)


def test_peak_rates_by_device_name():
    script = load_script()
    assert script.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert script.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert script.peak_tflops("cpu") is None


# Loaded by the Keras worker's interpreter: TensorFlow cannot be imported, as on the GPU machine.
NO_TENSORFLOW_FOR_KERAS = """
import importlib.abc, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("No module named 'tensorflow' (as on the GPU machine)")

if "keras" in sys.argv:
    sys.meta_path.insert(0, NoTensorFlow())
"""


def test_smoke_run_of_keras_jax_without_tensorflow_and_of_timm(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_TENSORFLOW_FOR_KERAS)
    output = tmp_path / "rows.json"
    # torch.compile is left out here (minutes of C++ compilation on a CPU); the GPU run has it.
    done = subprocess.run(
        [sys.executable, SCRIPT, "--smoke",
         "--workers", "keras,timm-eager", "--output", str(output)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPOSITORY])},
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counts = re.search(r"analytic (\d+), FlopCounterMode (\d+)", done.stdout)
    assert counts and counts.group(1) == counts.group(2)
    rows = json.loads(output.read_text())
    assert [row["worker"] for row in rows] == ["keras", "timm-eager"]
    assert "mixed_bfloat16, model.fit, XLA" in rows[0]["framework"]
    assert rows[0]["tensorflow_loaded"] is False
    assert all(row["images_per_second"] > 0 and row["loss"] > 0 for row in rows)
    assert "| CaiT-smoke 32 |" in done.stdout


# torch.compile is left out (minutes of C++ compilation on a CPU); every other path runs.
CPU_PATHS = ["timm-bf16", "keras-tf", "keras-tf-xla", "keras-jax", "keras-tf-bf16", "keras-tf-xla-bf16",
             "keras-jax-bf16", "keras-tf-bf16-half-stream", "keras-jax-no-fusion"]


def test_cpu_smoke_run_times_every_training_step_in_turns(tmp_path):
    output, logs = tmp_path / "rows.json", tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run(
        [sys.executable, SCRIPT, "--cpu", "--smoke", "--alive", "3", "--workers", ",".join(["timm-eager", *CPU_PATHS]),
         "--output", str(output), "--logs", str(logs)],
        env={**os.environ, "PYTHONPATH": REPOSITORY}, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    rows = {row["path"]: row for row in result["rows"]}
    assert list(rows) == ["timm-eager", *CPU_PATHS]
    # --alive 3: timm eager plus two paths per group, so five groups timed one after another.
    assert len(rows["timm-eager"]["rounds"]) == 5 and rows["timm-eager"]["ratio_to_timm_eager"] == 1.0
    for path, row in rows.items():
        assert len(row["rounds"]) == 1 or path == "timm-eager"
        assert row["images_per_second"] > 0 and row["ratio_to_timm_eager"] > 0, row
        assert 0 < row["fraction_of_ceiling"] and row["ceiling_gflops"] > 0
        assert 100 < row["peak_memory_mb"] < 24 * 1024, row
        # A fresh tiny CaiT's logits are near zero: the cross-entropy over 10 classes is near ln 10.
        assert abs(row["loss"] - math.log(10)) < 0.5, row
    assert result["machine"]["threads"] == 2 and len(result["machine"]["load_average_end"]) == 3
    assert "| CaiT-smoke 32, batch 4 | keras_cait, JAX, `mixed_bfloat16` |" in done.stdout
    assert sorted(path.name for path in logs.iterdir()) == sorted(
        f"smoke-{path}.log" for path in ["timm-eager", "matmul-ceiling", *CPU_PATHS])


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_the_fusion_profile_reports_step_time_and_the_compiled_steps_fusions():
    """scripts/profile_fusion.py (docs/benchmarks.md, "Why JAX is slower here") on a tiny CaiT."""
    script = os.path.join(REPOSITORY, "scripts", "profile_fusion.py")
    done = subprocess.run(
        [sys.executable, script, "--backend", "jax", "--depth", "2", "--batch", "2", "--image-size", "32",
         "--steps", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["backend"] == "jax" and report["depth"] == 2 and report["step_seconds"] > 0
    assert report["cpu_seconds_per_step"] > 0
    assert 0 < report["largest_fusion"] <= report["fused_instructions"]
    assert report["their_instructions"] <= report["fused_instructions"]
