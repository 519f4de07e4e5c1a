"""benchmarks/gpu_run.sh: the GPU measurements in few calls, each command run (SMOKE=1 here, on the
CPU), what it measured written to $OUT, and a failed command not stopping the next."""

import json
import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPOSITORY, "benchmarks", "gpu_run.sh")


def gpu_run(out, *stages, path=None):
    # `python3` is this environment's, as on the GPU machine it is the one with JAX and torch.
    environment = {**os.environ, "OUT": str(out), "SMOKE": "1", "JAX_PLATFORMS": "cpu",
                   "PATH": os.pathsep.join([path or os.path.dirname(sys.executable), os.environ["PATH"]])}
    return subprocess.run(["bash", SCRIPT, *stages], cwd=REPOSITORY, env=environment, capture_output=True,
                          text=True, timeout=1500)


@pytest.mark.parametrize("stages, line", [
    ((), "gpu_run.sh: name the stages to run, of: kernel roofline training"),
    (("kernel", "profile"), "gpu_run.sh: unknown stage 'profile'; choose from: kernel roofline training"),
])
def test_stages_it_does_not_know_are_refused_in_one_line_before_anything_runs(tmp_path, stages, line):
    done = gpu_run(tmp_path / "out", *stages)
    assert done.returncode == 2 and done.stderr.strip() == line and done.stdout == ""
    assert not (tmp_path / "out").exists()


@pytest.mark.large
def test_every_stage_runs_and_writes_what_it_measured(tmp_path):
    out = tmp_path / "out"
    done = gpu_run(out, "kernel", "roofline", "training")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("kernel_s24", "kernel_xxs24"):
        kernel = json.loads((out / f"{name}.json").read_text())
        assert set(kernel["ms_per_step"]) == {"fused", "keras_ops"}, kernel
    roofline = json.loads((out / "roofline_s24_keras-ops.json").read_text())
    assert roofline["attention"] == "keras-ops" and roofline["profile"]["steps"] == 2
    assert roofline["profile"]["instructions_ms"] > 0
    rows = json.loads((out / "training.json").read_text())["rows"]
    assert [row["path"] for row in rows] == ["keras", "keras-unfused", "timm-eager"]
    assert all(len(row["rounds"]) == 2 for row in rows)
    for name in ("kernel_s24", "kernel_xxs24", "roofline_s24_keras-ops", "training"):
        assert (out / f"{name}.log").stat().st_size > 0, name


@pytest.mark.large
def test_a_failed_command_does_not_stop_the_next_and_is_named(tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(  # the first kernel command fails; the rest run as they would
        f'#!/bin/sh\ncase "$*" in *"--output {tmp_path}/out/kernel_s24.json"*) echo broken >&2; exit 3;; esac\n'
        f'exec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    done = gpu_run(tmp_path / "out", "kernel", path=str(shim))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"gpu_run.sh: failed: kernel_s24 (their logs are in {tmp_path}/out)"
    assert "broken" in (tmp_path / "out" / "kernel_s24.log").read_text()
    assert json.loads((tmp_path / "out" / "kernel_xxs24.json").read_text())["ms_per_step"]
