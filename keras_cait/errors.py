"""The library's errors as data: the argument at fault, its value, what is wrong and what is allowed.

    ArgumentError    a ValueError: `argument`, `value`, `problem`, `allowed`, `usage`
    Named            an argument (and a value) inside an error's text: each caller spells it its own way
    Said             the same for an error of another kind (a download's ConnectionError) that names one
    say, speaking    a line the library prints as it works that names an argument, and the spelling
                     its `Named` parts take (Python's unless a caller such as the command line says)
    report, quiet    a line printed as it is; the block in which neither prints (verbose=0),
                     unless the caller keeps its lines (`lines_kept`: the command line)
    quietly_caused   an error that rewrites another, raised without the other's traceback
    ExtraMissing     an ImportError naming the optional extra that installs what is missing
    require_extra    imports a module of an optional extra, or raises `ExtraMissing`
    listed           a list shortened for a message: `a, b, c and 4 more`
    checked_bool     a True/False argument as a bool, or an ArgumentError (a str 'no' is not False)
    checked_count    a positive (or non-negative) integer as an int, or an ArgumentError (a float is no count)
    checked_number   a number in its range, or an ArgumentError (a str '0.5' from a config is no number)

`str(error)` speaks Python, one line:

    image_size=200: must be a multiple of the patch size 16; give image_size=208 or another multiple of 16

and the command line renders the same fields with its flags, `--image-size 200: ...; give --image-size
208 ...` (`keras_cait.cli.errors`, one table from argument to flag). An argument named inside the text
(`give image_size=208`) is a `Named` part of `problem` or `allowed`, never a spelling that a caller
would have to find again by pattern.
"""

import collections
import collections.abc
import contextlib
import contextvars
import importlib
import numbers
import os

import numpy

_NOTHING = object()


class Named:
    """`argument` inside an error's text: `weights='x.safetensors'` (with `value`), `weights=PATH`
    (with `shown`, a placeholder for any value), or `weights` alone (neither)."""

    __slots__ = ("argument", "value", "shown")

    def __init__(self, argument, value=_NOTHING, shown=None):
        self.argument, self.value, self.shown = argument, value, shown

    @property
    def has_value(self):
        return self.value is not _NOTHING

    def __eq__(self, other):
        return isinstance(other, Named) and (self.argument, self.value, self.shown) == (
            other.argument, other.value, other.shown)

    def __hash__(self):
        return hash((self.argument, self.shown))

    def __repr__(self):
        return f"Named({python_name(self)})"


def python_value(value):
    """A value as Python writes it in a call: `'photos'` (a path too), `None`, `(0.9, 0.999)`."""
    return repr(os.fspath(value) if isinstance(value, os.PathLike) else value)


def python_name(named):
    """`argument=value` as a Python call spells it: `weights='x'`, `epochs=3`, `weights=PATH`, `epochs`."""
    if named.shown is not None:
        return f"{named.argument}={named.shown}"
    if not named.has_value:
        return named.argument
    return f"{named.argument}={python_value(named.value)}"


def repeated(items):
    """The items given more than once, sorted as str: `repeated(['cat', 'dog', 'cat']) == ['cat']`."""
    counts = collections.Counter(items)
    return sorted(str(item) for item, count in counts.items() if count > 1)


def listed(items, shown=5):
    """`a, b, c, d, e and 4 more`: the first `shown` of `items` (as str), the others counted; the one
    way a message shortens a list (class names, files, keys)."""
    items = [str(item) for item in items]
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def counted(count, noun, plural=None):
    """`1 epoch`, `3 epochs`, `2 classes` (`plural`: the noun's plural, when not noun + "s"): a
    count and its noun, the one way a line counts."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def spoken(parts, name=python_name):
    """The text of `parts` (a string, a `Named`, or a list or tuple of those), each `Named` as
    `name(named)` writes it."""
    if parts is None:
        return ""
    if isinstance(parts, Named):
        return name(parts)
    if isinstance(parts, (list, tuple)):
        return "".join(spoken(part, name) for part in parts)
    return str(parts)


class ArgumentError(ValueError):
    """An argument that cannot work: `argument` (as Python names it), its `value`, the `problem` and
    what is `allowed` (or what to do). `usage`: the arguments cannot work whatever files and data
    they name (the command line's exit status 2). `shown`: how the value is written where its repr
    is no use (`<ImageSource>`). `problem` and `allowed` are strings, `Named`s or lists of both.

    `str()` is one line, `argument=value: problem; allowed`; `render(name)` writes it with another
    spelling of arguments, e.g. the command line's flags.
    """

    def __init__(self, argument, value, problem, allowed=None, *, usage=False, shown=None):
        self.argument, self.value, self.problem, self.allowed = argument, value, problem, allowed
        self.usage, self.shown = usage, shown
        super().__init__(self.render())

    def subject(self):
        """The argument at fault as a `Named` (None where no argument is)."""
        if self.argument is None:
            return None
        return Named(self.argument, self.value, self.shown)

    def render(self, name=python_name):
        """The one line, each argument written by `name(named)` (default: as Python writes it)."""
        text = spoken(self.problem, name)
        if self.allowed:
            text = f"{text}; {spoken(self.allowed, name)}"
        if self.argument is not None:
            text = f"{name(self.subject())}: {text}"
        return " ".join(text.split())

    def __str__(self):
        return self.render()

    def __reduce__(self):
        return _rebuilt, (type(self), self.__dict__)


def checked_bool(argument, value, allowed=None):
    """`value` as a bool where it is True or False (numpy's too, and the ints 0 and 1 that worked as
    them before); else an `ArgumentError` naming `argument`, with `allowed` (what each means, e.g.
    "True (unfreeze) or False (freeze)"). A str such as 'no' from a config is truthy, so taking it
    would do the opposite of what was meant."""
    if isinstance(value, (bool, numpy.bool_)) or (isinstance(value, (int, numpy.integer)) and value in (0, 1)):
        return bool(value)
    raise ArgumentError(argument, value, f"must be {allowed or 'True or False'}, not {type(value).__name__}",
                        usage=True)


def check_names_not_mapping(argument, value):
    """A dict given for a list of class names (Hugging Face's `id2label`, a name-to-index map) would be
    read by its keys, the names lost or put in another order: refused naming `argument`."""
    if isinstance(value, collections.abc.Mapping):
        keys = listed([repr(key) for key in value], 3)
        raise ArgumentError(argument, value, f"is a dict (its keys: {keys}), which is read by its keys",
                            "give a list of str, one name per class in index order, e.g. "
                            "[id2label[i] for i in range(len(id2label))]", usage=True,
                            shown=f"<dict of {len(value)}>")


def checked_count(argument, value, example, minimum=1, note=""):
    """`value` as an int where it is an integer (numpy's too; not a bool, a float or a str) of at least
    `minimum` (1 or 0); else an `ArgumentError` naming `argument`: `must be a positive integer<note>[, not
    str]; e.g. <argument>=<example>`. `note` says what the count is (", the images per forward pass")."""
    integer = not isinstance(value, (bool, numpy.bool_)) and isinstance(value, numbers.Integral)
    if integer and value >= minimum:
        return int(value)  # a numpy integer would reach a layer's config, which JSON cannot write
    words = "a positive integer" if minimum == 1 else "a non-negative integer" if minimum == 0 else \
        f"an integer of at least {minimum}"
    raise ArgumentError(argument, value, f"must be {words}{note}" + ("" if integer else f", not {type(value).__name__}"),
                        ["e.g. ", Named(argument, example)], usage=True)


def checked_number(argument, value, fits, bounds, example):
    """`value` where it is a number (not a bool) for which `fits(value)` holds; else an `ArgumentError`
    naming `argument`: `must be a number <bounds>[, not str]; e.g. <argument>=<example>`."""
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if number and fits(value):
        return value
    raise ArgumentError(argument, value, f"must be a number {bounds}" + ("" if number else f", not {type(value).__name__}"),
                        ["e.g. ", Named(argument, example)], usage=True)


class MissingPath(ArgumentError, FileNotFoundError):
    """An `ArgumentError` for a path where nothing is: a `FileNotFoundError` too, as Python's own
    error for it (code that catches that keeps working)."""


def _rebuilt(kind, state):
    error = (OSError if issubclass(kind, OSError) else Exception).__new__(kind)  # MissingPath: OSError's layout
    error.__dict__.update(state)
    Exception.__init__(error, error.render())
    return error


class Said:
    """An exception whose text names arguments inside it (`Named` parts, e.g. the advice
    `weights='/path/to/model.safetensors'`), for an error of another kind than `ArgumentError`
    (`class DownloadError(Said, ConnectionError)`): made from its `parts`, `str()` speaks Python
    and `render(name)` another spelling."""

    def __init__(self, *parts):
        self.parts = parts
        super().__init__(spoken(parts))

    def render(self, name=python_name):
        return " ".join(spoken(self.parts, name).split())

    def __str__(self):
        return self.render()


_SPELLING = contextvars.ContextVar("keras_cait_spelling", default=python_name)


_QUIET = contextvars.ContextVar("keras_cait_quiet", default=False)


def say(*parts):
    """Prints a line the library says as it works (a choice it made for the caller) whose `Named`
    parts are written as the caller spells arguments: `precision` from Python, `--precision` from
    the command line, which calls the library inside `speaking(flag_name)`. Nothing within `quiet()`."""
    if not _QUIET.get():
        print(in_callers_words(*parts), flush=True)


def in_callers_words(*parts):
    """`parts` as one line, each `Named` written as the caller spells arguments (`say`'s words)."""
    return " ".join(spoken(parts, _SPELLING.get()).split())


def report(text=""):
    """Prints `text` as it is (a run's stage, where it resumed, what it wrote): a line of the
    library's as it works, which `quiet()` keeps unsaid, as `say`'s."""
    if not _QUIET.get():
        print(text, flush=True)


_LINES_KEPT = contextvars.ContextVar("keras_cait_lines_kept", default=False)


@contextlib.contextmanager
def quiet(silent=True):
    """Within the block (with `silent`), `say` and `report` print nothing: a run given verbose=0
    from Python. Inside `lines_kept()` they print whatever `silent` says."""
    token = _QUIET.set((bool(silent) or _QUIET.get()) and not _LINES_KEPT.get())
    try:
        yield
    finally:
        _QUIET.reset(token)


@contextlib.contextmanager
def lines_kept():
    """Within the block `quiet` keeps nothing unsaid: the command line, whose lines are its log
    whatever Keras' progress (`--verbose`) shows."""
    token = _LINES_KEPT.set(True)
    try:
        yield
    finally:
        _LINES_KEPT.reset(token)


@contextlib.contextmanager
def speaking(name):
    """Within the block, `say` writes each `Named` part as `name(named)` does."""
    token = _SPELLING.set(name)
    try:
        yield
    finally:
        _SPELLING.reset(token)


class ExtraMissing(ModuleNotFoundError):
    """What `needed_by` imports is not installed: `module`, and the `extra` of keras-cait that
    installs it. One line: `export_onnx needs tf2onnx, which is not installed; pip install
    "keras-cait[onnx]"`."""

    def __init__(self, needed_by, module, extra):
        self.needed_by, self.module, self.extra = needed_by, module, extra
        super().__init__(f"{needed_by} needs {module}, which is not installed; "
                         f'pip install "keras-cait[{extra}]"', name=module)


def quietly_caused(error, cause):
    """`error`, to be raised `from None`, keeping `cause` (the error it rewrites, whose text it already
    says) as `error.cause`: a notebook shows one traceback, not the same message twice."""
    error.cause = cause
    return error


def require_extra(needed_by, extra, *modules):
    """The `modules` of the optional `extra` imported (the last returned), or `ExtraMissing` for
    the first that is not installed; a module that is installed and fails to import raises its
    own error."""
    imported = None
    for module in modules:
        try:
            imported = importlib.import_module(module)
        except ImportError as error:
            missing = getattr(error, "name", None)
            if missing is None or not (module == missing or module.startswith(missing + ".")):
                raise
            raise ExtraMissing(needed_by, module, extra) from error
    return imported
