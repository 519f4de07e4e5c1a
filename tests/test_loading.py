"""keras_cait.loading: a .keras file holding the training's schedule or layers loads after `import keras_cait`."""

import json
import pathlib
import subprocess
import sys

import keras

from keras_cait.training import EpochCosine, MixupCutmix, RandAugment, RandomResizedCrop

REPOSITORY = str(pathlib.Path(__file__).resolve().parent.parent)

LOAD = """
import json, sys
import keras
import keras_cait

assert "keras_cait.training" not in sys.modules  # nothing of the training loaded by the import
model = keras.models.load_model(sys.argv[1])
mixing = keras.saving.deserialize_keras_object(json.loads(sys.argv[2]))
print(type(model.optimizer._learning_rate).__name__, *sorted(type(layer).__name__ for layer in model.layers[1:3]),
      type(mixing).__name__, mixing.num_classes)
print("keras_cait.training.schedule" in sys.modules)
"""


def test_a_model_with_the_training_s_schedule_and_layers_loads_after_import_keras_cait_alone(tiny_cait, tmp_path):
    """Keras said "Could not locate class 'EpochCosine'" (and RandomResizedCrop's, ...) unless the
    notebook had imported keras_cait.training first."""
    images = keras.Input((40, 40, 3))
    augmented = RandAugment(value_range=(0, 255))(RandomResizedCrop(32, 32)(images))
    model = keras.Model(images, tiny_cait(classes=3)(augmented))
    model.compile(optimizer=keras.optimizers.AdamW(EpochCosine(1e-3, 10, 5, warmup_epochs=1)),
                  loss="categorical_crossentropy")
    model.save(tmp_path / "augmented.keras")

    mixing = json.dumps(keras.saving.serialize_keras_object(MixupCutmix(num_classes=3)))
    done = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "augmented.keras"), mixing], cwd=tmp_path,
                          env={"PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["EpochCosine", "RandAugment", "RandomResizedCrop", "MixupCutmix", "3", "True"]
