"""python -m benchmarks.inference --smoke: every inference path loads, agrees with timm and is timed in turns."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "benchmarks.inference"
# torch.compile is left out: minutes of C++ compilation on a 2-core CPU for no extra code path here.
PATHS = ["timm-eager", "timm-autocast-bf16", "ort-timm-onnx", "openvino-timm-onnx", "openvino-timm-onnx-bf16",
         "keras-predict", "keras-predict-on-batch", "keras-xla", "keras-saved-model", "keras-saved-model-xla",
         "keras-saved-model-bf16", "keras-onnx",
         "keras-openvino", "keras-openvino-bf16", "keras-int8", "keras-int4", "keras-float8",
         "keras-openvino-int8", "openvino-timm-onnx-int8"]
# bfloat16 arithmetic (autocast; OpenVINO where the CPU has bf16): measured up to 1e-2 from float32.
BFLOAT16 = {"timm-autocast-bf16", "openvino-timm-onnx-bf16", "keras-openvino-bf16", "keras-saved-model-bf16"}
# NNCF's int8 of our IR and of timm's ONNX: measured up to 8e-4 on the smoke model.
INT8_OPENVINO = 1e-2
# Keras' quantised models round every Dense input and kernel: near timm, not at float32's 1e-4.
QUANTIZED = {"keras-int8": 5e-2, "keras-int4": 2e-1, "keras-float8": 2e-1, "keras-openvino-int8": INT8_OPENVINO,
             "openvino-timm-onnx-int8": INT8_OPENVINO}


def _run(tmp_path, *arguments):
    """`python -m benchmarks.inference ARGUMENTS` from `tmp_path`, this checkout first on the path."""
    environment = {**os.environ, "PYTHONPATH": REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", MODULE, *arguments], capture_output=True, text=True,
                          env=environment, timeout=1200, cwd=tmp_path)


def test_smoke_run_times_every_path_on_the_same_model(tmp_path):
    output = tmp_path / "rows.json"
    done = _run(tmp_path, "--smoke", "--paths", *PATHS, "--output", str(output))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    rows = {(row["path"], row["batch"]): row for row in result["rows"]}
    assert set(rows) == {(path, batch) for path in PATHS for batch in (1, 2)}
    for row in rows.values():
        # Both sides load the same random timm weights: a path that computed another model fails here.
        tolerance = QUANTIZED.get(row["path"], 3e-2 if row["path"] in BFLOAT16 else 1e-4)
        assert row["max_relative_difference"] <= tolerance, row
        assert row["peak_memory_mb"] > 0
        assert len(row["rounds"]) == 1 and row["images_per_second"] > 0
        assert 0 < row["fraction_of_ceiling"] and row["ceiling_gflops"] > 0
    assert all(rows["timm-eager", batch]["ratio_to_timm_eager"] == 1.0 for batch in (1, 2))
    # Our exports against timm's export on the same runtime and precision.
    for path, peer in [("keras-onnx", "ort-timm-onnx"), ("keras-openvino", "openvino-timm-onnx"),
                       ("keras-openvino-bf16", "openvino-timm-onnx-bf16"),
                       ("keras-openvino-int8", "openvino-timm-onnx-int8")]:
        for batch in (1, 2):
            row = rows[path, batch]
            assert row["same_runtime_peer"] == peer
            assert row["ratio_to_same_runtime"] == row["rounds"][0] / rows[peer, batch]["rounds"][0]
    machine = result["machine"]
    assert len(machine["load_average_start"]) == 3 and len(machine["load_average_end"]) == 3
    assert machine["threads"] == 2
    assert "| smoke bs1 |" in done.stdout and "SavedModel `serving_default`" in done.stdout
    assert "our ONNX under ORT / ORT on timm's ONNX" in done.stdout
    assert "OpenVINO (bf16) / OpenVINO (bf16) on timm's ONNX" in done.stdout
    # Each SavedModel against the fastest float32 export, and the bf16 one against timm's autocast.
    assert "| best float32 export | SavedModel / it | SavedModel (XLA) / it |" in done.stdout
    assert "SavedModel, bfloat16 / timm, autocast bf16" in done.stdout


def test_max_isa_caps_every_worker_and_runs_openvino_in_float32_where_the_cap_has_no_bf16(tmp_path):
    output = tmp_path / "rows.json"
    paths = ["timm-eager", "keras-openvino", "keras-openvino-int8", "openvino-timm-onnx-int8"]
    done = _run(tmp_path, "--smoke", "--max-isa", "AVX512_CORE_VNNI", "--paths", *paths, "--output", str(output))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    assert result["machine"]["onednn_max_cpu_isa"] == "AVX512_CORE_VNNI"
    assert "oneDNN capped at AVX512_CORE_VNNI" in done.stdout
    for row in result["rows"]:
        assert row["levers"]["onednn_max_cpu_isa"] == "AVX512_CORE_VNNI", row
        if "openvino" in row["path"]:
            # OpenVINO's own default would be bf16 on a CPU that has it: the cap's CPU kind has none.
            assert row["levers"]["openvino_precision"] == "f32", row


@pytest.mark.parametrize("path", ["keras-openvino-bf16", "timm-autocast-bf16"])
def test_max_isa_refuses_a_bf16_path_in_one_line(tmp_path, path):
    done = _run(tmp_path, "--max-isa", "AVX512_CORE_VNNI", "--paths", "timm-eager", path)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"inference.py: error: --paths {path} compute in bf16, which --max-isa AVX512_CORE_VNNI has "
                    "no units for; leave them out")
    assert not list(tmp_path.iterdir())
