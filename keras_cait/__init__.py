"""keras_cait: CaiT ("Going deeper with Image Transformers") for Keras 3.

`import keras_cait` loads what inference needs: the layers, the model, the
variants and their weights, preprocessing, attention maps and block features. The training
recipe (`keras_cait.training`) and the exporters (`keras_cait.export_*`) are
TensorFlow modules (tf.data, SavedModel) and load on first use.
TensorFlow's start-up INFO lines are left out (see `keras_cait.io.stderr`). In the
`keras-cait` command a Ctrl-C while they load is its one line (`keras_cait.cli.startup.interrupt`),
and TensorFlow runs oneDNN's CPU kernels on every x86 CPU (`keras_cait.cli.startup.onednn`).
"""

import importlib

from keras_cait import deprecation

deprecation.install()  # old paths of moved modules (keras_cait.model, ...) import with a DeprecationWarning

from keras_cait.cli.startup.interrupt import end_on_interrupt_while_starting  # noqa: E402

end_on_interrupt_while_starting()  # the keras-cait command only: Ctrl-C while Keras loads is its one line

from keras_cait.cli.startup.onednn import use_onednn_in_the_command  # noqa: E402

use_onednn_in_the_command()  # the keras-cait command only, before TensorFlow loads: oneDNN's kernels

from keras_cait.io.stderr import quiet_tensorflow_startup  # noqa: E402

with quiet_tensorflow_startup():
    import keras  # noqa: F401  loads the backend (TensorFlow by default) without its start-up INFO lines

    if keras.backend.backend() == "tensorflow":
        import tensorflow

        tensorflow.config.list_physical_devices()  # the device scan, whose "no GPU" record is left out

from keras_cait import layers, loading, optimizers  # noqa: F401  optimizers: its AdamW loads from .keras files

loading.register()  # the training's schedule and layers load from .keras files, their modules imported then
from keras_cait.inspection import AttentionMaps, attention_maps, feature_extractor, forward_intermediates
from keras_cait.preprocessing import decode_predictions, preprocess_input
from keras_cait.models import CONSTRUCTORS, VARIANTS

# CaiT_XXS24 ... CaiT_M48: one constructor per row of VARIANTS, made in keras_cait.models.variants.
globals().update(CONSTRUCTORS)

__version__ = "0.1.0"

# What `import keras_cait` loads; `training`, `export` and the exporters load on first use (below).
__all__ = [
    "VARIANTS",
    *CONSTRUCTORS,
    "AttentionMaps",
    "attention_maps",
    "decode_predictions",
    "feature_extractor",
    "forward_intermediates",
    "layers",
    "preprocess_input",
]


def __getattr__(name):
    # Training and export import TensorFlow, which a JAX or PyTorch user need not load.
    if name.startswith("export_"):
        # An exporter is a row of the formats table (keras_cait/export/formats.py), read only now.
        export = importlib.import_module("keras_cait.export")
        if name in export.EXPORTERS:
            return getattr(export, name)
    if name in ("training", "export"):  # `keras_cait.export.export_onnx(...)` as the docs write it
        return importlib.import_module(f"keras_cait.{name}")
    moved = deprecation.module_attribute(__name__, name)
    if moved is not None:
        return moved
    raise AttributeError(f"module 'keras_cait' has no attribute {name!r}")
