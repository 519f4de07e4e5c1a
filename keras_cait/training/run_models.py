"""The models of a run: the model to train or evaluate (a variant, a .keras file, a Keras model), its
side, and the teacher of a distilling recipe."""

import os

import keras

from keras_cait.errors import ArgumentError, Named, listed, quietly_caused
from keras_cait.models import loader
from keras_cait.models.architecture import (
    ARCHITECTURE_NUMBERS,
    BUILD_CAIT_ARGUMENTS,
    BUILD_CAIT_REQUIRED,
    build_cait,
    checked_architecture,
    with_class_names,
)
from keras_cait.models.class_names import class_count
from keras_cait.models.loader import image_side, is_keras_file, load_classifier, read_keras_file
from keras_cait.models.surgery import merge_lora
from keras_cait.training import transfer
from keras_cait.training.distillation import Distiller
from keras_cait.training.knobs import in_recipe
from keras_cait.training.run_data import given
from keras_cait.training.run_errors import RunError, about

# A teacher the messages suggest, from keras.applications (the paper's, a RegNetY-16GF, is not among
# Keras 3's applications): a strong ImageNet classifier Keras downloads the weights of.
TEACHER_EXAMPLE = "ConvNeXtTiny"


def check_teacher(teacher, recipe):
    """A teacher given without a distilling recipe, or missing where one distils, refused before any
    data are read."""
    if recipe.distillation_type == "none" and teacher is not None:
        raise RunError("teacher", given(teacher), ["given, but ", in_recipe("distillation_type", "none"),
                                                   " distils from no teacher"],
                       ["give ", in_recipe("distillation_type", "hard"), " (the paper's) or ",
                        in_recipe("distillation_type", "soft"), ", or leave ", Named("teacher"), " out"], usage=True)
    if recipe.distillation_type != "none" and teacher is None:
        raise RunError("teacher", None, ["needed by ", in_recipe("distillation_type", recipe.distillation_type)],
                       ["give a .keras model or a keras.applications name, e.g. ", Named("teacher", TEACHER_EXAMPLE)],
                       usage=True)
    if teacher is not None and not isinstance(teacher, (str, os.PathLike, keras.Model)):  # teacher=5 was looked
        raise RunError("teacher", teacher, f"not a model, a .keras file or a keras.applications name, but of type "
                       f"{type(teacher).__name__}", ["e.g. ", Named("teacher", TEACHER_EXAMPLE), " or ",
                       Named("teacher", "teacher.keras")], usage=True, shown=f"<{type(teacher).__name__}>")
    if is_keras_file(teacher) and not os.path.isfile(teacher):
        raise RunError("teacher", os.fspath(teacher), "no such file",
                       ["give a .keras model or a keras.applications name, e.g. ", Named("teacher", TEACHER_EXAMPLE)])
    if isinstance(teacher, str) and not is_keras_file(teacher) and not hasattr(keras.applications, teacher):
        raise RunError("teacher", teacher, "neither a .keras file nor a keras.applications model",
                       ["e.g. ", Named("teacher", TEACHER_EXAMPLE), " or ", Named("teacher", "teacher.keras")], usage=True)


def teacher_model(teacher, recipe, data, precision):
    """The frozen teacher of a distilling recipe, or None; it must predict the classes of `data` (a
    `Data`). A keras.applications name is built computing in `precision`; a model or a .keras file
    keeps its own policy."""
    if recipe.distillation_type == "none":
        return None
    if isinstance(teacher, keras.Model):
        model = teacher
    elif is_keras_file(teacher):
        with about("teacher", teacher):
            model = read_keras_file(teacher, "teacher")
    else:
        try:
            model = getattr(keras.applications, teacher)(weights="imagenet")
        except Exception as error:  # Keras' download of the weights: "URL fetch failure on ..."
            raise quietly_caused(RunError(
                "teacher", teacher, f"keras.applications.{teacher} could not load its ImageNet weights "
                f"({' '.join(str(error).split()) or type(error).__name__})",
                "Keras downloads them once into ~/.keras/models: build the model once where there is network, or "
                "give a .keras teacher"), error) from None
        model = transfer.with_dtype_policy(model, precision)
    check_classes(model, "teacher", given(teacher), data.spec, data.train, blamed="teacher",
                  advice="give a teacher trained on the same classes, in the same order")
    return model


def check_classes(model, argument, value, data, source, blamed, advice):
    """Refuses `model` (given as `argument=value`) where it does not predict the classes of `data`
    (its `source`): another number of them, or other names where the model has its own
    (`class_names`); `blamed`: the argument the `RunError` names, `advice`: what to do."""
    with about(argument, value, ValueError):
        classes = class_count(model)
    # Each said of the argument the RunError names (`blamed`), the other one named in the line.
    if classes != source.num_classes:
        raise RunError(blamed, value if blamed == argument else data, [
            f"predicts {classes} classes but ", Named("data", data), f" has {source.num_classes}"] if blamed == argument
            else [f"has {source.num_classes} classes but ", Named(argument, value), f" predicts {classes} classes"],
            advice)
    names = getattr(model, "class_names", None)
    if names is not None and list(names) != [str(name) for name in source.class_names]:
        raise RunError(blamed, value if blamed == argument else data, [
            f"was trained on {listed(names)} but ", Named("data", data), f" has the classes "
            f"{listed(source.class_names)}"] if blamed == argument else [
            f"has the classes {listed(source.class_names)} but ", Named(argument, value), " was trained on "
            f"{listed(names)}"], advice)


def fitted(model, recipe, teacher):
    """What `fit` trains: the model, or a `Distiller` of it from the teacher."""
    if teacher is None:
        return model
    # A softmax head gives probabilities; anything else is taken as logits.
    softmax = getattr(teacher.layers[-1], "activation", None) is keras.activations.softmax
    return Distiller(model, teacher, recipe.distillation_type, recipe.distillation_alpha,
                     recipe.distillation_tau, teacher_from_logits=not softmax)


# What a run gives build_cait itself, from its other arguments: not to be given in a dict `model`.
RUN_BUILD_ARGUMENTS = ("input_shape", "classes", "drop_path_rate", "dtype")
# A dict `model` of a run (the command line's `--model` as JSON), as the errors show one.
MODEL_EXAMPLE = {"embed_dim": 192, "depth": 12, "num_heads": 4, "init_values": 1e-5}


def check_architecture(model):
    """A dict `model` of `build_cait` arguments, checked before anything is read: its keys (those
    build_cait takes, those it needs, not those the run gives) and its numbers; a `RunError` naming `model`."""
    taken = [name for name in BUILD_CAIT_ARGUMENTS if name not in RUN_BUILD_ARGUMENTS]
    run_own = [name for name in model if name in RUN_BUILD_ARGUMENTS]
    if run_own:
        raise RunError("model", model, f"gives {listed(run_own)}, which the run sets itself (from image_size, "
                       "the data's classes, the recipe's drop_path and precision)",
                       f"leave {listed(run_own)} out of it", usage=True)
    unknown = [name for name in model if name not in taken]
    if unknown:
        raise RunError("model", model, f"gives {listed(unknown)}, not {'an argument' if len(unknown) == 1 else 'arguments'}"
                       " of build_cait", f"it takes {listed(taken, len(taken))}", usage=True)
    missing = [name for name in BUILD_CAIT_REQUIRED if name not in model]
    if missing:
        raise RunError("model", model, f"gives no {' or '.join(missing)}, which build_cait needs",
                       ["e.g. ", Named("model", MODEL_EXAMPLE),
                        " (init_values, LayerScale's first gamma: 1e-5 up to 24 blocks, 1e-6 deeper)"], usage=True)
    sizes = {name: value for name, value in model.items() if name in ARCHITECTURE_NUMBERS}
    try:
        checked_architecture(**sizes)
    except ArgumentError as error:  # an argument inside the dict: the run was given `model`, not that argument
        raise quietly_caused(RunError("model", model, f"build_cait's {error.render()}", usage=error.usage),
                             error) from None


def check_model(model):
    """`model` of a run, checked before anything is read or said (`keras_cait.models.loader.check_model`:
    a name no variant has, a .keras path that is no file, a run's folder); a `RunError` naming it."""
    with about("model", model):
        loader.check_model(model)


def load(model, **options):
    """`keras_cait.models.load_classifier(model, **options)`, the one answer to what `model` means, for
    a run: the side of the images it takes checked square, its mistakes `RunError`s naming the argument."""
    own = isinstance(model, keras.Model) or is_keras_file(model)
    value = os.fspath(model) if is_keras_file(model) else model
    argument = "model" if own else "weights"
    with about(argument, value if own else options.get("weights"), ConnectionError, OSError, ValueError,
               ImportError):
        loaded = load_classifier(model, **options)
        image_side(loaded, "model", value)
    return loaded


def new_model(model, recipe, image_size, classes, precision):
    """The model `train` trains: a variant name or a dict of `build_cait` arguments, from random
    weights, its layers under the dtype policy `precision`."""
    if isinstance(model, dict):
        with about("model", model, ValueError, TypeError):
            return build_cait(**model, input_shape=(image_size, image_size, 3), classes=classes,
                              drop_path_rate=recipe.drop_path, dtype=precision)
    return load(model, weights=None, image_size=image_size, classes=classes, dtype=precision,
                drop_path_rate=recipe.drop_path)


def _shares_layers(model, other):
    theirs = {id(layer) for layer in other._flatten_layers()}
    return any(id(layer) in theirs for layer in model._flatten_layers())


def classifier(model, weights, recipe, image_size, precision, class_names):
    """The model to fine-tune, named `class_names`, from `load`: the loaded one with its own head when
    it predicts that many classes and the recipe keeps heads (deit-highres, as DeiT's --finetune),
    else a new head on its pooled features (a name's class token)."""
    named = isinstance(model, str) and not is_keras_file(model)
    loaded = load(model, weights=weights, image_size=image_size, include_top=recipe.keep_head,
                  pooling="token" if named and not recipe.keep_head else None, dtype=precision,
                  drop_path_rate=recipe.drop_path)
    if isinstance(model, keras.Model) and _shares_layers(loaded, model):
        # The run trains a copy (merge_lora copies a model without LoRA as it is): the caller's model,
        # and so the run record's digest of it (`run_data.recorded_model`), stay as given, and the
        # same call again resumes the run.
        loaded = merge_lora(loaded)
    if recipe.keep_head and loaded.output_shape[-1] == len(class_names) and transfer.HEAD_NAME in [
        layer.name for layer in loaded.layers
    ]:
        return with_class_names(loaded, class_names)
    with about("model", model):
        return transfer.with_new_head(loaded, len(class_names), name="cait_finetuned", class_names=class_names)
