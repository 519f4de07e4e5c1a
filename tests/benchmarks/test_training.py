"""python -m benchmarks.training --smoke: the GPU benchmark's code paths and the CPU benchmark's, run small."""

import fcntl
import json
import math
import os
import re
import statistics
import subprocess
import sys
import types

import pytest

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "benchmarks.training"


def load_script():
    from benchmarks import training

    return training


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


def test_smoke_run_of_keras_jax_without_tensorflow_and_of_timm_in_turns(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_TENSORFLOW_FOR_KERAS)
    output = tmp_path / "rows.json"
    # torch.compile is left out here (minutes of C++ compilation on a CPU); the GPU run has it.
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "--smoke", "--rounds", "2",
         "--workers", "keras,keras-unfused,timm-eager", "--output", str(output)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPOSITORY])},
        cwd=tmp_path,  # the workers find benchmarks.training from any folder
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counts = re.search(r"analytic (\d+), FlopCounterMode (\d+)", done.stdout)
    assert counts and counts.group(1) == counts.group(2)
    rows = json.loads(output.read_text())["rows"]
    assert [row["path"] for row in rows] == ["keras", "keras-unfused", "timm-eager"]
    keras_row, unfused_row, timm_row = rows
    for row in (keras_row, unfused_row):
        assert "mixed_bfloat16" in row["framework"] and row["compute_dtype"] == "bfloat16"
        assert row["tensorflow_loaded"] is False
    # The fused kernel runs on a GPU only; the unfused worker turns it off there.
    assert keras_row["fused_attention_variable"] is None and keras_row["fused_attention"] is False
    assert unfused_row["fused_attention_variable"] == "0" and unfused_row["fused_attention"] is False
    assert timm_row["logits_dtype"] == "bfloat16"  # under autocast
    for row in rows:
        assert len(row["rounds"]) == 2 and row["images_per_second"] == statistics.median(row["rounds"])
        # A fresh tiny CaiT's logits are near zero: the cross-entropy over 10 classes is near ln 10.
        assert abs(row["loss"] - math.log(10)) < 0.5, row
    assert timm_row["ratio_to_timm_eager"] == 1.0
    assert keras_row["ratio_to_timm_eager"] == pytest.approx(statistics.median(
        k / t for k, t in zip(keras_row["rounds"], timm_row["rounds"])))
    assert "| CaiT-smoke 32 | keras_cait, JAX (XLA), `mixed_bfloat16` | 4 |" in done.stdout


# torch.compile is left out (minutes of C++ compilation on a CPU); every other path runs.
CPU_PATHS = ["timm-bf16", "keras-tf", "keras-tf-xla", "keras-jax", "keras-tf-bf16", "keras-tf-xla-bf16",
             "keras-jax-bf16", "keras-tf-bf16-half-stream", "keras-jax-no-fusion", "keras-tf-cancelled-bias",
             "keras-tf-bf16-cancelled-bias", "keras-tf-onednn"]


@pytest.fixture(scope="module")
def cpu_smoke_run(tmp_path_factory):
    """(the finished `--cpu --smoke` process over every path: returncode, stdout and stderr; its output
    JSON path; its logs folder). Minutes of CPU, so run once per session: pytest-xdist's workers
    share it through a folder of the session's and a lock, as pytest-xdist's documentation does."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / "cpu_smoke"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("cpu_smoke")
    output, logs, result = folder / "rows.json", folder / "logs", folder / "process.json"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            logs.mkdir()
            done = subprocess.run(
                [sys.executable, "-m", MODULE, "--cpu", "--smoke", "--alive", "3", "--workers",
                 ",".join(["timm-eager", *CPU_PATHS]), "--output", str(output), "--logs", str(logs)],
                env={**os.environ, "PYTHONPATH": REPOSITORY}, capture_output=True, text=True, timeout=1200,
            )
            result.write_text(json.dumps(dict(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)))
    return types.SimpleNamespace(**json.loads(result.read_text())), output, logs


def test_cpu_smoke_run_times_every_training_step_in_turns(cpu_smoke_run):
    done, output, logs = cpu_smoke_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    rows = {row["path"]: row for row in result["rows"]}
    assert list(rows) == ["timm-eager", *CPU_PATHS]
    # --alive 3: timm eager plus two paths per group, so six groups timed one after another.
    assert len(rows["timm-eager"]["rounds"]) == 6 and rows["timm-eager"]["ratio_to_timm_eager"] == 1.0
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


def test_every_cpu_lever_took_effect_in_the_worker_that_runs_it(cpu_smoke_run):
    """Each worker reports what it observed once its step had run (`levers` of its row): the dtype its
    step computed in, and what XLA compiled. A lever whose flag did not apply (once: JAX's
    `--xla_disable_hlo_passes=fusion` placed after a word that ends XLA's flag parsing) would
    otherwise be timed as the path without it. What each path must show is read from its name."""
    done, output, _ = cpu_smoke_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    levers = {row["path"]: row["levers"] for row in json.loads(output.read_text())["rows"]}
    assert set(levers) == {"timm-eager", *CPU_PATHS}
    # TensorFlow turns oneDNN's ops on by itself on some CPUs (AVX-512 VNNI or newer) only.
    onednn_by_default = subprocess.run(
        [sys.executable, "-c", "from tensorflow.python.util import _pywrap_util_port as port; "
         "print(port.IsMklEnabled())"], env=os.environ, capture_output=True, text=True, check=True,
    ).stdout.split()[-1] == "True"
    for path in ["timm-eager", "timm-bf16"]:  # torch.autocast(bfloat16) on or off
        expected = "bfloat16" if path.endswith("-bf16") else "float32"
        assert levers[path]["logits_dtype"] == expected, (path, levers[path])
    for path in [path for path in CPU_PATHS if path.startswith("keras-")]:
        seen = levers[path]
        # mixed_bfloat16: the MLP computes in bfloat16; the residual stream is float32 but for the lever.
        assert seen["compute_dtype"] == ("bfloat16" if "-bf16" in path else "float32"), (path, seen)
        assert seen["residual_stream"] == ("bfloat16" if path.endswith("-half-stream") else "float32"), (path, seen)
        # The softmax cancels the pre-softmax bias: trained only where the lever puts it back.
        assert seen["pre_softmax_bias_trained"] == path.endswith("-cancelled-bias"), (path, seen)
        if path.startswith("keras-jax"):
            # XLA:CPU's fusion pass puts a chain of elementwise ops into one kernel; with the pass
            # off each op sits alone in its own (1 instruction).
            if path.endswith("-no-fusion"):
                assert seen["largest_xla_fusion"] == 1, (path, seen)
            else:
                assert seen["largest_xla_fusion"] > 1, (path, seen)
        else:
            # jit_compile=True: TensorFlow's runtime must compile the training step with XLA.
            assert (seen["xla_compiled_steps"] > 0) == ("-xla" in path), (path, seen)
            assert seen["onednn_ops"] == (path.endswith("-onednn") or onednn_by_default), (path, seen)


def test_the_fusion_profile_reports_step_time_and_the_compiled_steps_fusions():
    """benchmarks/profile_fusion.py (docs/benchmarks.md, "Why JAX is slower here") on a tiny CaiT."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_fusion", "--backend", "jax", "--depth", "2", "--batch", "2",
         "--image-size", "32", "--steps", "2"],
        env={**os.environ, "PYTHONPATH": REPOSITORY}, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["backend"] == "jax" and report["depth"] == 2 and report["step_seconds"] > 0
    assert report["cpu_seconds_per_step"] > 0
    assert 0 < report["largest_fusion"] <= report["fused_instructions"]
    assert report["their_instructions"] <= report["fused_instructions"]
