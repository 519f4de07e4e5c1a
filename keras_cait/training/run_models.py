"""The models of a run: the model to train or evaluate (a variant, a .keras file, a Keras model), its
side, and the teacher of a distilling recipe."""

import os

import keras

from keras_cait import variants
from keras_cait.errors import listed
from keras_cait.layers import PatchEmbedding
from keras_cait.model import build_cait, class_count, with_class_names
from keras_cait.training import transfer
from keras_cait.training.distillation import Distiller
from keras_cait.training.run_data import given
from keras_cait.training.run_errors import RunError, about
from keras_cait.variants import cait


def check_teacher(teacher, recipe):
    """A teacher given without a distilling recipe, or missing where one distils, refused before any
    data are read."""
    if recipe.distillation_type == "none" and teacher is not None:
        raise RunError(f"teacher={given(teacher)} is given but distillation_type='none'; give "
                       "distillation_type='hard' (the paper's) or 'soft'.", "teacher", usage=True)
    if recipe.distillation_type != "none" and teacher is None:
        raise RunError(f"distillation_type={recipe.distillation_type!r} needs a teacher: teacher=PATH.keras or "
                       "a keras.applications name, e.g. teacher=RegNetY160.", "teacher", usage=True)
    if is_file(teacher) and not os.path.isfile(teacher):
        raise RunError(f"teacher={os.fspath(teacher)}: no such file; give a .keras model or a keras.applications "
                       "name, e.g. RegNetY160.", "teacher")
    if isinstance(teacher, str) and not is_file(teacher) and not hasattr(keras.applications, teacher):
        raise RunError(f"teacher={teacher}: neither a .keras file nor a keras.applications model; e.g. "
                       "teacher=RegNetY160 or teacher=teacher.keras.", "teacher", usage=True)


def teacher_model(teacher, recipe, data):
    """The frozen teacher of a distilling recipe, or None; it must predict the classes of `data` (a `Data`)."""
    if recipe.distillation_type == "none":
        return None
    if isinstance(teacher, keras.Model):
        model = teacher
    elif str(teacher).endswith(".keras"):
        model = load_keras("teacher", teacher)
    else:
        model = getattr(keras.applications, teacher)(weights="imagenet")
    check_classes(model, "teacher", given(teacher), data.spec, data.train, blamed="teacher",
                  advice="give a teacher trained on the same classes, in the same order")
    return model


def check_classes(model, argument, value, data, source, blamed, advice):
    """Refuses `model` (given as `argument=value`) where it does not predict the classes of `data`
    (its `source`): another number of them, or other names where the model has its own
    (`class_names`); `blamed`: the argument the `RunError` names, `advice`: what to do."""
    with about(argument, value, ValueError):
        classes = class_count(model)
    if classes != source.num_classes:
        raise RunError(f"{argument}={value!r} predicts {classes} classes but data={data!r} has "
                       f"{source.num_classes}; {advice}.", blamed)
    names = getattr(model, "class_names", None)
    if names is not None and list(names) != [str(name) for name in source.class_names]:
        raise RunError(f"data={data!r} has the classes {listed(source.class_names)} but {argument}={value!r} "
                       f"was trained on {listed(names)}; {advice}.", blamed)


def fitted(model, recipe, teacher):
    """What `fit` trains: the model, or a `Distiller` of it from the teacher."""
    if teacher is None:
        return model
    # A softmax head gives probabilities; anything else is taken as logits.
    softmax = getattr(teacher.layers[-1], "activation", None) is keras.activations.softmax
    return Distiller(model, teacher, recipe.distillation_type, recipe.distillation_alpha,
                     recipe.distillation_tau, teacher_from_logits=not softmax)


def load_keras(argument, path):
    """The .keras model at `path`, given as `argument`; a `RunError` naming it where it cannot be read."""
    import zipfile

    import keras_cait  # noqa: F401  registers CaiT's layers with Keras

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RunError(f"{argument}={path!r}: no such file (a .keras model or a CaiT variant).", argument)
    if not zipfile.is_zipfile(path):
        raise RunError(f"{argument}={path!r} is not a .keras model (a .keras file is a zip archive); give a "
                       "model saved with model.save('name.keras'), or a CaiT variant.", argument)
    try:
        return keras.models.load_model(path)
    except (OSError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunError(f"{argument}={path!r} is not a readable .keras model: {first}", argument) from error


def is_file(model):
    """Whether `model` names a .keras file."""
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".keras")


def default_image_size(model):
    """The input side a run uses for `model` when `image_size` is not given: a .keras model's
    own, else the side of the checkpoint the model name loads."""
    if isinstance(model, keras.Model):
        return square_side(model)
    return variants.default_image_size(model)


def square_side(model, given=None):
    """The side of the square images `model` takes; `given`: the model argument it came from (a path)."""
    if not isinstance(model.input_shape, tuple) or len(model.input_shape) != 4:
        named = f"model={os.fspath(given)!r}" if isinstance(given, (str, os.PathLike)) else f"model {model.name!r}"
        raise RunError(f"{named} takes inputs of shape {model.input_shape}, not images (batch, height, width, 3); "
                       "give an image classifier: a CaiT saved as .keras, or a CaiT variant.", "model")
    height, width = model.input_shape[1:3]
    if height != width:
        raise RunError(f"model takes {height}x{width} images; give image_size for a square size to run "
                       "it at.", "image_size", usage=True)
    return height


def _weights(weights):
    return None if weights is None or str(weights).lower() == "none" else weights


def variant(model, weights, **options):
    """The CaiT variant `model` with `weights` ("imagenet", None or a file); `options`: `cait`'s."""
    with about("weights", weights, ConnectionError, OSError, ValueError, ImportError):
        return cait(model, weights=_weights(weights), **options)


def new_model(model, recipe, image_size, classes):
    """The model `train` trains: a variant name or a dict of `build_cait` arguments, from random weights."""
    shape = dict(input_shape=(image_size, image_size, 3), classes=classes, drop_path_rate=recipe.drop_path)
    if isinstance(model, dict):
        with about("model", model, ValueError, TypeError):
            return build_cait(**model, **shape)
    with about("model", model, ValueError):
        return cait(model, weights=None, **shape)


def _backbone(model, weights, recipe, image_size, precision, keep_head):
    """A CaiT at `image_size`: a variant with its weights, or a .keras model (rebuilt under
    `precision`); without its head unless `keep_head`."""
    if is_file(model):
        # The file keeps the dtype policy it was saved with; the run's precision decides.
        loaded = transfer.with_dtype_policy(load_keras("model", model), precision)
        image_size = image_size or square_side(loaded, model)
        if loaded.input_shape[1:3] != (image_size, image_size):
            if not any(isinstance(layer, PatchEmbedding) for layer in loaded.layers):
                raise RunError(f"image_size={image_size}: model={os.fspath(model)!r} takes {square_side(loaded)}-pixel "
                               "images and is not a CaiT, whose position embedding could be resized; leave out "
                               f"image_size={image_size}.", "image_size", usage=True)
            loaded = transfer.at_resolution(loaded, image_size)
        return loaded
    head = dict(include_top=True) if keep_head else dict(include_top=False, pooling="token")
    return variant(model, weights, **head, input_shape=(image_size, image_size, 3),
                   drop_path_rate=recipe.drop_path)


def classifier(model, weights, recipe, image_size, precision, class_names):
    """The model to fine-tune, named `class_names`: the loaded one with its own head when it
    predicts that many classes and the recipe keeps heads (deit-highres, as DeiT's --finetune),
    else a new head."""
    backbone = _backbone(model, weights, recipe, image_size, precision, recipe.keep_head)
    if recipe.keep_head and backbone.output_shape[-1] == len(class_names) and transfer.HEAD_NAME in [
        layer.name for layer in backbone.layers
    ]:
        return with_class_names(backbone, class_names)  # a .keras file may hold a plain keras.Model
    try:
        return transfer.with_new_head(backbone, len(class_names), name="cait_finetuned", class_names=class_names)
    except ValueError as error:  # no pooled features to put the head on: a .keras file of another model
        raise RunError(f"model={os.fspath(model)!r} holds {backbone.name!r}, not a CaiT, and has no pooled features (a "
                       "'token_pool' or 'avg_pool' layer) to put a new head on; give a CaiT saved as .keras (e.g. "
                       "best.keras of a finetune run) or a CaiT variant, e.g. model='XXS24'.", "model") from error
