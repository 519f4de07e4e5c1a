"""keras-cait finetune --lora-rank: LoRA on the attention projections, saved merged as a plain CaiT."""

import json
import os

import keras
import numpy as np
import pytest

from keras_cait.cli import runs
from keras_cait.cli.errors import UserError


def _args(model_path, data_dir, output_dir):
    return runs.finetune_parser().parse_args([
        "--model", model_path, "--data", data_dir, "--output-dir", output_dir, "--image-size", "32",
        "--batch-size", "8", "--precision", "float32", "--head-epochs", "1", "--epochs", "1",
        "--lr", "1e-2", "--lora-rank", "2", "--val-fraction", "0", "--verbose", "0",
    ])


@pytest.mark.large
def test_lora_finetune_changes_only_the_projections_and_the_head(tiny_cait, digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=4)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)
    runs.finetune_run(_args(model_path, data_dir, str(tmp_path / "run")))

    final = keras.models.load_model(str(tmp_path / "run" / "final.keras"))
    pretrained = {w.path: np.array(w) for w in keras.models.load_model(model_path).weights}
    weights = {w.path: np.array(w) for w in final.weights}
    assert not any("lora" in path for path in weights)  # merged: a plain CaiT
    changed = {path for path, value in weights.items()
               if path not in pretrained or not np.array_equal(value, pretrained[path])}
    projection = ("/qkv/kernel", "/query/kernel", "/key/kernel", "/value/kernel", "/output_projection/kernel")
    assert {path for path in changed if not path.startswith("predictions/")} == {
        path for path in weights if path.endswith(projection)
    }

    # As a LoRA stage killed mid-way leaves the folder: a backup, the stage not finished.
    os.makedirs(tmp_path / "run" / "backup" / "lora")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**record, "finished": ["head"]}))
    with pytest.raises(UserError, match="cannot be resumed.*remove .*backup/lora"):
        runs.finetune_run(_args(model_path, data_dir, str(tmp_path / "run")))
