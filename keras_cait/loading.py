"""The classes of `keras_cait.training` that a `.keras` file can hold, known to Keras from `import keras_cait`.

A model compiled with an `EpochCosine` schedule, or holding `RandomResizedCrop`, `RandAugment` or
`MixupCutmix` layers, saved with `model.save`, did not load after `import keras_cait` alone: Keras
looks its classes up by their registered names, and said "Could not locate class 'EpochCosine'".
Importing `keras_cait.training` for them would load TensorFlow (tf.data) for a JAX or PyTorch user
who never trains, so `register` puts a stand-in under each name instead, which imports the class's
module when Keras first asks it for an object (`from_config`); the module's own registration then
takes the name over.
"""

import importlib

import keras

PACKAGE = "keras_cait"
# Each class by the module that defines (and registers) it.
CLASSES = {
    "EpochCosine": "keras_cait.training.schedule",
    "RandomResizedCrop": "keras_cait.training.random_resized_crop",
    "RandAugment": "keras_cait.training.rand_augment",
    "MixupCutmix": "keras_cait.training.mixup_cutmix",
}


def _stand_in(name, module):
    def from_config(cls, config, custom_objects=None):
        real = getattr(importlib.import_module(module), name)  # registers `real` under the name
        return real.from_config(config)

    doc = f"Stands for {module}.{name} until that module is imported (keras_cait.loading)."
    return type(name, (), {"from_config": classmethod(from_config), "__doc__": doc, "__module__": __name__})


def register():
    """Registers a stand-in for each of `CLASSES` not registered yet (its module not imported)."""
    registered = keras.saving.get_custom_objects()
    for name, module in CLASSES.items():
        registered.setdefault(f"{PACKAGE}>{name}", _stand_in(name, module))
