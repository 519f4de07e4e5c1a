"""Old names that keep working for a release, with a DeprecationWarning: moved modules' import
paths (`MOVED`), names moved out of a module (`MOVED_NAMES`) and renamed keywords of public
functions (`renamed_keywords`).

`MOVED` is the one table, {old module: new module}; a row keeps an old path for a release.
`import keras_cait.model` (or `from keras_cait.model import build_cait`) gives the new module
itself, `keras_cait.models.architecture`, so the names, and a monkeypatch of them, are shared.
`keras_cait/__init__.py` installs the finder first thing; `keras_cait.model` read as an
attribute of the package goes through the same import (`module_attribute`).
"""

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "keras_cait.model": "keras_cait.models.architecture",
    "keras_cait.variants": "keras_cait.models.variants",
    "keras_cait.attention": "keras_cait.inspection.attention",
    "keras_cait.features": "keras_cait.inspection.features",
    "keras_cait.visualize": "keras_cait.inspection.visualize",
    "keras_cait.evaluation_transform": "keras_cait.images.evaluation_transform",
    "keras_cait.decoder_messages": "keras_cait.images.decoder_messages",
    "keras_cait.atomic": "keras_cait.io.atomic",
    "keras_cait.startup_log": "keras_cait.io.stderr",
    "keras_cait.startup_interrupt": "keras_cait.cli.startup.interrupt",
    "keras_cait.startup_onednn": "keras_cait.cli.startup.onednn",
    "keras_cait.runtime_checks": "keras_cait.models.runtime_checks",
}


# Names that moved out of a module that stays: {(old module, new module): names}. The old module's
# `__getattr__ = moved_names(__name__)` keeps each readable there, with a DeprecationWarning.
MOVED_NAMES = {
    ("keras_cait.training.sources", "keras_cait.training.image_checks"): (
        "BAD_IMAGES_SEARCHED", "BAD_IMAGES_SHOWN", "CHECK_DECODES_AT_LEAST", "CHECK_SECONDS", "PASSES", "ImageCheck",
        "Undecodable", "check_images", "find_undecodable", "is_decode_error", "undecodable_error",
        "undecodable_message", "undecodable_named"),
    ("keras_cait.models.architecture", "keras_cait.models.blocks"): (
        "LAYER_NORM_EPSILON", "SelfAttentionBlock", "ClassAttentionBlock", "float32_gelu"),
    ("keras_cait.models.architecture", "keras_cait.models.precision"): (
        "FLOAT32_UNDER_MIXED", "is_mixed", "float32_if_mixed", "layer_dtype", "has_dtype_policy"),
    ("keras_cait.models.architecture", "keras_cait.models.inputs"): (
        "channels_last_shape", "image_shape", "check_input_shape", "checked_image_size", "check_images"),
    ("keras_cait.models.architecture", "keras_cait.models.class_names"): (
        "class_count", "checked_class_names", "class_names_of"),
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        # stacklevel 2: the line that imports the old path (warnings skips the import machinery's frames).
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; import it from there (the old path "
                      "goes in the next release).", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import machinery sets the old path's spec on it
        return module

    def exec_module(self, module):
        """The new module ran when it was imported; its own spec is put back."""
        module.__spec__ = module.__spec__.loader_state


_FINDER = _Alias()


def install():
    """Puts the finder first on `sys.meta_path` (once): the old files are gone, so it answers
    before the path finder would find nothing."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def module_attribute(package, name):
    """The moved module `package.name` (imported through its old path, so it warns), or None."""
    old = f"{package}.{name}"
    return importlib.import_module(old) if old in MOVED else None


def moved_names(module):
    """The `__getattr__` of `module`, an old module of `MOVED_NAMES`: a moved name read from it warns
    and gives the new module's object (the same one, so a monkeypatch must go to the new module)."""
    moved = {name: new for (old, new), names in MOVED_NAMES.items() if old == module for name in names}

    def __getattr__(name):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {moved[name]}; import it from there (the old path goes in the next "
                      "release).", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__


def renamed_keywords(**renamed):
    """Decorates a public function whose keyword `old` is now `new` (`old="new"`, or `old=("new",
    "what differs")`): a call with `old=` warns with a DeprecationWarning and runs as with `new=`;
    a call with both raises TypeError. The signature shows the new names only."""

    def decorate(function):
        @functools.wraps(function)
        def with_old_keywords(*args, **kwargs):
            for old, (new, *differs) in ((old, _as_tuple(new)) for old, new in renamed.items()):
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{function.__name__}() got {old}={kwargs[old]!r} and {new}={kwargs[new]!r}: "
                                    f"{old} is the old name of {new}; give {new} alone.")
                warnings.warn(f"{function.__name__}({old}=...) is now {new}=...{''.join(f' ({d})' for d in differs)}; "
                              f"the old name goes in the next release.", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return with_old_keywords

    return decorate


def _as_tuple(new):
    return (new,) if isinstance(new, str) else tuple(new)
