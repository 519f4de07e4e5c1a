"""`keras-cait finetune` with DeiT's options: a teacher, --recipe deit-highres, EMA in its own file."""

import os

import keras
import numpy as np
import pytest

from keras_cait.cli import runs
from keras_cait.cli.errors import UserError
from keras_cait.training.recipe import Recipe


def weights(path):
    return [np.asarray(w) for w in keras.models.load_model(path).weights]


@pytest.mark.large
def test_deit_highres_finetune_distils_and_keeps_ema_apart(tiny_cait, digits, tmp_path):
    data = digits(tmp_path / "digits", per_class=6)
    student, teacher = str(tmp_path / "student.keras"), str(tmp_path / "teacher.keras")
    tiny_cait(classes=10).save(student)
    keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                      keras.layers.Dense(10, activation="softmax")]).save(teacher)
    output = str(tmp_path / "run")
    args = runs.parse_arguments("finetune", [
        "--model", student, "--data", data, "--output-dir", output, "--batch-size", "12",
        "--precision", "float32", "--no-jit", "--verbose", "0", "--recipe", "deit-highres",
        "--epochs", "2", "--warmup-epochs", "1", "--model-ema-decay", "0.5", "--repeated-aug", "1",
        "--teacher", teacher, "--distillation-type", "hard",
    ])
    recipe = runs.recipe_of(args)
    assert (recipe.lr, recipe.weight_decay, recipe.min_lr, recipe.head_epochs) == (5e-6, 1e-8, 5e-6, 0)
    assert recipe.epochs == 2 and recipe.model_ema and recipe.reprob == 0.25  # given flags win
    runs.finetune_run(args)
    # The recipe the run wrote beside its model is the one it ran.
    assert Recipe.load(os.path.join(output, "recipe.json")) == recipe

    files = sorted(os.listdir(output))
    assert {"best.keras", "final.keras", "ema.keras"} <= set(files), files
    final, ema = weights(os.path.join(output, "final.keras")), weights(os.path.join(output, "ema.keras"))
    # The student's own head was kept (same classes), nothing of the teacher was saved.
    assert [w.shape for w in final] == [w.shape for w in weights(student)]
    assert any(not np.array_equal(a, b) for a, b in zip(final, ema))
    assert any(not np.array_equal(a, b) for a, b in zip(final, weights(student)))


@pytest.mark.parametrize(
    "flags, message",
    [(["--teacher", "x.keras"], "--teacher x.keras: given, but --distillation-type none distils from no teacher"),
     (["--distillation-type", "soft"], "needed by --distillation-type soft; give a .keras model"),
     (["--distillation-type", "soft", "--teacher", "NoSuchNet"], "--teacher NoSuchNet: neither a .keras file")],
)
def test_distillation_flags_are_checked_before_the_data_are_read(flags, message, tmp_path, monkeypatch):
    from keras_cait.training import sources

    monkeypatch.setattr(sources, "source", None)  # reading the data would fail otherwise
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match=message):
        runs.train_run(runs.train_parser().parse_args(
            ["--data", str(tmp_path / "d"), "--output-dir", str(tmp_path / "run"), *flags]))
    assert not (tmp_path / "run").exists()
