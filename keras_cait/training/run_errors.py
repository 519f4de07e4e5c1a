"""The error a run raises for what it is given (`RunError`), and `about`, which names the argument."""

import contextlib
import os
import warnings

from keras_cait.errors import ArgumentError, quietly_caused


class RunError(ArgumentError):
    """What a run is given cannot work (bad data, a batch larger than the data, a missing extra).

    A `keras_cait.errors.ArgumentError`: `argument` names the run's argument at fault as Python
    writes it (e.g. "data", "weights"), `value` its value, `problem` what is wrong and `allowed`
    what is allowed; `usage`: the arguments cannot work together or alone, whatever the files hold.
    One line: `data='photos': no such folder; give ...`.

    `RunError(message, argument=None, usage=False, value=None)`, the form before the fields, still
    makes one whose text is `message` as written (a DeprecationWarning).
    """

    def __init__(self, *args, **kwargs):
        if len(args) >= 3 or "problem" in kwargs:
            self._message = None
            super().__init__(*args, **kwargs)
            return
        warnings.warn("RunError(message, argument, usage, value) is deprecated: give RunError(argument, value, "
                      "problem, allowed, usage=...), the fields the command line renders.", DeprecationWarning,
                      stacklevel=2)
        message, argument, usage, value = (list(args) + [None, False, None])[:4] if args else (None, None, False, None)
        argument, usage, value = (kwargs.get("argument", argument), kwargs.get("usage", usage),
                                  kwargs.get("value", value))
        self._message = str(kwargs.get("message", message))
        super().__init__(argument, value, self._message, usage=usage)

    def render(self, name=None):
        if getattr(self, "_message", None) is not None:  # the former form: its text as written
            return " ".join(self._message.split())
        return super().render() if name is None else super().render(name)


@contextlib.contextmanager
def about(argument, value, *types):
    """The library's errors of type `types` while reading `argument` as a `RunError` naming it; an
    `ArgumentError`, which names its own argument, becomes the `RunError` of the same fields (never a
    doubled prefix)."""
    try:
        yield
    except RunError:
        raise
    except ArgumentError as error:
        # The reader's name for the run's own value (image_folder's `directory`) is the run's `argument`.
        same = isinstance(value, (str, os.PathLike)) and isinstance(error.value, (str, os.PathLike)) and \
            os.fspath(error.value) == os.fspath(value)
        raise quietly_caused(RunError(argument if same else error.argument, error.value, error.problem, error.allowed,
                                      usage=error.usage, shown=error.shown), error) from None
    except types as error:
        text = str(error).strip() or type(error).__name__
        raise quietly_caused(RunError(argument, value, text), error) from None
