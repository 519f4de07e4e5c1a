"""Pretrained weights: the checkpoint registry, conversion from timm/DeiT, download and cache."""

import collections
import os

import keras
import numpy as np

from keras_cait.errors import ArgumentError, Named, checked_bool, quietly_caused
from keras_cait.weights.convert import (
    checkpoint_grid, load_state_dict, nonfinite_error, read_checkpoint, timm_key_map, unreadable,
)
from keras_cait.weights.download import DownloadError, cache_dir, cached_checkpoint, size_bound, with_imagenet_checkpoint
from keras_cait.weights.registry import CHECKPOINTS, WEIGHT_FILES

__all__ = [
    "CHECKPOINTS",
    "WEIGHT_FILES",
    "DownloadError",
    "cache_dir",
    "cached_checkpoint",
    "checkpoint_grid",
    "head_classes",
    "load_imagenet_weights",
    "load_state_dict",
    "load_weights_file",
    "read_checkpoint",
    "timm_key_map",
]


def _check_keras_weights_fit(model, path, argument):
    """Keras matches .weights.h5 entries by layer order and skips extra ones silently;
    compare the tensor shapes first so that another variant's file is an error. `argument`: what
    the caller called the file (`path`, or a constructor's `weights`)."""
    import h5py

    file_shapes, file_head = [], []
    try:
        with h5py.File(path, "r") as file:
            file.visititems(
                lambda name, item: (file_head if name.startswith("layers/dense/") else file_shapes).append(
                    (name, item.shape)) if hasattr(item, "shape") and "position_embedding" not in name else None
            )
    except OSError as error:
        raise quietly_caused(_unreadable_keras_weights(path, error), error) from None
    if not file_shapes and not file_head:
        raise ArgumentError(argument, path, "holds no weights at all (an empty .weights.h5 file)",
                            "save them again: model.save_weights(path)")
    _check_head_fits(model, path, [shape for _, shape in sorted(file_head)], argument)
    position = model.get_layer("position_embedding").embeddings
    head = [w for layer in model.layers if layer.name == "predictions" for w in layer.weights]
    model_shapes = [
        tuple(w.shape) for w in model.weights
        if w is not position and not any(w is h for h in head)
    ]
    found = collections.Counter(shape for _, shape in file_shapes)
    wanted = collections.Counter(model_shapes)
    if found != wanted:
        parts = [f"the {has} has tensors of shapes {dict(shapes)} that the {lacks} lacks" for has, lacks, shapes in (
            ("file", "model", found - wanted), ("model", "file", wanted - found)) if shapes]  # {} was printed
        raise ValueError(f"{path} does not fit the model '{model.name}': {', and '.join(parts)}. Is it a checkpoint "
                         "of another CaiT variant?")


def _unreadable_keras_weights(path, error):
    return ValueError(f"{path} is not a readable Keras .weights.h5 file ({error}): it is truncated or of "
                      "another format. Save the weights again (model.save_weights) or pass the right file.")


def _check_head_fits(model, path, file_head, argument):
    """The head of a .weights.h5 file (`file_head`: its Dense's tensor shapes) against the model's:
    Keras' own error dumped the variable's values. A headless model takes any file's backbone."""
    heads = [layer for layer in model.layers if layer.name == "predictions"]
    if not heads:
        return
    wanted = heads[0].units
    if not file_head:
        raise ArgumentError(argument, path, "holds no head (saved from a model built with include_top=False)",
                            ["give ", Named("include_top", False), " for its features, or ", Named("classes", shown="N"),
                             " for a new head of N classes"])
    classes = file_head[0][-1]
    if classes != wanted:
        raise ArgumentError(argument, path, f"has a head of {classes} classes, the model one of {wanted}",
                            ["give ", Named("classes", classes), ", or ", Named("include_top", False),
                             " to load all but the head"])


def _nonfinite_keras_weights(model, path):
    """The model's weights that loading `path` would make NaN or inf; `model` is left as it was."""
    import h5py

    datasets = []
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: datasets.append(item[()]) if hasattr(item, "shape") else None)
    if all(np.isfinite(data).all() for data in datasets):
        return []
    # Keras names the file's tensors by layer class; load them to name them by the model's paths.
    kept = [keras.ops.convert_to_numpy(weight) for weight in model.weights]
    model.load_weights(path)
    names = [weight.path for weight in model.weights
             if not np.isfinite(keras.ops.convert_to_numpy(weight)).all()]
    for weight, value in zip(model.weights, kept):
        weight.assign(value)
    return names


def head_classes(path):
    """The classes of the head a weights file holds (`head.weight`, or a `.weights.h5` file's Dense),
    or None where it holds none (saved with include_top=False). A .pth file is read whole."""
    path = os.fspath(path)
    if path.endswith(".weights.h5"):
        import h5py

        shapes = []
        try:
            with h5py.File(path, "r") as file:
                file.visititems(lambda name, item: shapes.append(item.shape)
                                if name.startswith("layers/dense/") and hasattr(item, "shape") else None)
        except OSError as error:
            raise quietly_caused(_unreadable_keras_weights(path, error), error) from None
        return shapes[0][-1] if shapes else None
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        try:
            with safe_open(path, framework="numpy") as file:
                return file.get_slice("head.weight").get_shape()[0] if "head.weight" in file.keys() else None
        except FileNotFoundError:
            raise
        except Exception as error:  # safetensors' own error type is not public
            raise quietly_caused(unreadable(path, "safetensors", error), error) from None
    head = read_checkpoint(path).get("head.weight")
    return None if head is None else head.shape[0]


def load_weights_file(model, path, allow_nonfinite=False, source_grid=None):
    """Loads a .safetensors / .pth / .pt (timm or DeiT names) or .weights.h5 file into `model`.

    A file holding NaN or inf is refused, naming the tensors, unless `allow_nonfinite`.
    `source_grid`: the `(rows, cols)` patch grid of a timm/DeiT checkpoint's
    `pos_embed`, when the file does not state it (see `load_state_dict`);
    `.weights.h5` files record their own grid.
    """
    from keras_cait.models.surgery import check_model_object  # here: keras_cait.models imports this module

    check_model_object(model, "load_weights_file")
    load_file(model, path, "path", allow_nonfinite, source_grid)


# The files `load_file` reads, by how their names end.
WEIGHTS_FILES = (".weights.h5", ".safetensors", ".pth", ".pt")


def load_file(model, path, argument, allow_nonfinite=False, source_grid=None):
    """`load_weights_file`, its errors naming the file by `argument`, the caller's name for it
    (`path`, or the constructors' `weights`)."""
    allow_nonfinite = checked_bool("allow_nonfinite", allow_nonfinite,
                                   "True (load NaN or inf as they are) or False (refuse them)")
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(argument, path, f"must be the path of a weights file, not {type(path).__name__}",
                            "e.g. 'model.safetensors', 'model.pth' or 'model.weights.h5'", usage=True)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ArgumentError(argument, path, "is a folder, not a weights file",
                            "give a .safetensors, .pth, .pt or .weights.h5 file in it", usage=True)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{argument}={path!r}: no such file.")
    if not path.endswith(WEIGHTS_FILES):
        raise ArgumentError(argument, path, "is a file of a kind keras_cait reads no weights from",
                            "give a .safetensors or .pth checkpoint (timm/DeiT) or a Keras .weights.h5 file",
                            usage=True)
    if path.endswith(".weights.h5"):
        if source_grid is not None:
            raise ArgumentError("source_grid", source_grid,
                                f"is for timm/DeiT checkpoints; the Keras weights file {path} records its own grid",
                                "leave source_grid=None for a .weights.h5 file", usage=True)
        _check_keras_weights_fit(model, path, argument)
        nonfinite = [] if allow_nonfinite else _nonfinite_keras_weights(model, path)
        if nonfinite:
            raise nonfinite_error(nonfinite, f"weights file {path}")
        model.load_weights(path)
    else:
        load_state_dict(model, read_checkpoint(path), source=f"checkpoint {path}",
                        allow_nonfinite=allow_nonfinite, source_grid=source_grid or checkpoint_grid(path))


def load_imagenet_weights(model, arch, head=None):
    """Loads the ImageNet checkpoint `arch` (e.g. "cait_s24_224") into `model`, strictly, through
    timm's key map; its position embedding is resized bicubically where `model` takes another size.

    The checkpoint is timm's `model.safetensors`, fetched once and verified
    (`download.with_imagenet_checkpoint`: the Hugging Face cache, else
    keras_cait's). `head`: a Dense layer outside `model` that takes the
    checkpoint's 1000-class head (keras-hub's classifier); without it the head
    goes into `model`'s own, or is left out where `model` has none.
    """
    from keras_cait.models.surgery import check_model_object  # here: keras_cait.models imports this module

    check_model_object(model, "load_imagenet_weights")
    if not isinstance(arch, str) or arch not in CHECKPOINTS:
        raise ArgumentError("arch", arch, "no such CaiT checkpoint", f"the released ones are {', '.join(CHECKPOINTS)}",
                            usage=True)
    def load(path, source):
        load_state_dict(model, read_checkpoint(path), source=source, head=head)

    with_imagenet_checkpoint(arch, size_bound(model, arch), load)
