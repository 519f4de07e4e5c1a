"""The names of a classifier's classes: how many it scores, the names it carries and their check."""

from keras_cait.errors import ArgumentError, check_names_not_mapping, repeated
from keras_cait.preprocessing import imagenet_classes


def class_count(model):
    """The number of classes a classifier scores (its output is `(batch, classes)`); a ValueError
    for any other model."""
    shape = tuple(model.outputs[0].shape)
    if len(shape) != 2:
        raise ValueError(f"{model.name} outputs {shape}, not class scores (batch, classes); give a "
                         "classifier: a model with its head (include_top=True).")
    return shape[-1]


def checked_class_names(names, model):
    """`names` as a tuple of str, after checking there is one per class of `model`; None stays None."""
    if names is None:
        return None
    allowed = "give a list of str, one name per class"
    check_names_not_mapping("class_names", names)
    if isinstance(names, str) or not hasattr(names, "__iter__"):
        raise ArgumentError("class_names", names, f"must be a list of names, not one {type(names).__name__}",
                            allowed, usage=True)
    names = tuple(names)
    others = [name for name in names if not isinstance(name, str)]
    if others:
        raise ArgumentError("class_names", names, f"holds {others[0]!r} ({type(others[0]).__name__}), not only str",
                            allowed, usage=True, shown="[...]")
    if "" in names:  # an empty name was taken, and served as the top class's name
        raise ArgumentError("class_names", names, f"holds an empty name (index {names.index('')})",
                            "give each class a name of at least one character", usage=True, shown="[...]")
    classes = class_count(model)
    if len(names) != classes:
        raise ArgumentError("class_names", names, f"has {len(names)} names but {model.name} has {classes} classes",
                            "give one name per class, in the order of the outputs", usage=True, shown="[...]")
    twice = repeated(names)
    if twice:
        raise ArgumentError("class_names", names, f"repeats {twice}", "give each class its own name", usage=True,
                            shown="[...]")
    return names


def class_names_of(model, wordnet_ids=False):
    """The names of a classifier's classes in index order, or None where they are unknown.

    A model's own `class_names` (a `CaiTModel` fitted on a folder keeps them in
    its `.keras` file) come first; a model of 1000 classes without them is taken
    to be an ImageNet model and gets ImageNet's names ("tabby", or with
    `wordnet_ids` "tabby (n02123159)").
    """
    names = getattr(model, "class_names", None)
    if names is not None:
        return list(names)
    if class_count(model) == len(imagenet_classes()):
        return [f"{name} ({wnid})" if wordnet_ids else name for wnid, name in imagenet_classes()]
    return None
