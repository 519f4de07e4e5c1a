"""python -m benchmarks.input --smoke: both input pipelines at every stage, made photos, timed in turns."""

import json
import os
import subprocess
import sys

import pytest

from PIL import Image

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "benchmarks.input"
STAGES = ["decode", "crop", "randaugment", "erasing", "full"]


def test_smoke_run_times_both_pipelines_at_every_stage_on_real_jpegs(tmp_path):
    photos, output = tmp_path / "photos", tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "--smoke", "--photos", str(photos), "--output", str(output)],
        env={**os.environ, "PYTHONPATH": REPOSITORY}, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(photos.glob("*/*.jpg"))
    assert len(files) == 24 and sorted({path.parent.name for path in files}) == ["china", "flower"]
    assert {Image.open(path).size for path in files} <= {(500, 375), (375, 500)}
    rows = {row["path"]: row for row in json.loads(output.read_text())["rows"]}
    assert list(rows) == [f"{framework}-{stage}" for stage in STAGES for framework in ("keras", "timm")]
    for path, row in rows.items():
        assert row["images_per_second"] > 0 and len(row["rounds"]) == 1, row
        assert row["images_per_second_per_core"] == row["images_per_second"] / 2
        assert 100 < row["peak_memory_mb"] < 24 * 1024
        if path.startswith("timm-"):
            assert row["ratio_to_timm"] == 1.0
    assert "| full |" in done.stdout and "| decode |" in done.stdout
