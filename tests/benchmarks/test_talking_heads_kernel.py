"""python -m benchmarks.talking_heads_kernel --smoke: both paths compiled, checked against each other and timed."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_smoke_run_times_the_kernel_and_keras_ops_on_the_cpu(tmp_path):
    output = tmp_path / "talking_heads.json"
    environment = {**os.environ, "PYTHONPATH": REPOSITORY, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.talking_heads_kernel", "--smoke", "--output", str(output)],
        env=environment, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    assert result["platform"] == "cpu" and result["interpreted"] is True
    assert set(result["ms_per_step"]) == {"fused", "keras_ops"}
    assert all(len(rounds) == 2 and min(rounds) > 0 for rounds in result["ms_per_round"].values())
    # Outputs and the gradients of the input and of the 7 weights that reach the loss.
    assert len(result["largest_difference"]) == 9
    assert max(result["largest_difference"].values()) <= 1e-4
    saved = result["saved_for_backward_bytes"]
    assert 0 < saved["fused"] < saved["keras_ops"]
    assert any("pallas_call" in residual for residual in result["largest_residuals"]["fused"])
    assert any("[2,2,7,7]" in residual for residual in result["largest_residuals"]["keras_ops"])
