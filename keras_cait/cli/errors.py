"""The error contract of every `keras-cait` command: one line, an exit status, no traceback.

A mistake the user can mend ends a command with one line on standard error,

    keras-cait <command>: <what is wrong>; <what to do>

and exit status 2 when the command line itself is wrong (a flag's value, flags
that do not go together), 1 for everything else (a missing or unreadable file,
a folder that cannot be written, a bad image, no network, an interrupted run).
A bug is not the user's mistake and keeps its traceback; `--debug` (or
KERAS_CAIT_DEBUG=1) shows the traceback of the user's mistakes too.

Commands raise `usage(...)` or `fail(...)` and check their arguments and
output folders before any model is built or data are read; `reported` turns
those errors, and the operating system's (files, network, Ctrl-C, memory), into the line.
Running out of memory is the line naming the flags that lower it (`LESS_MEMORY`) where
Python or TensorFlow raise an error (MemoryError, ResourceExhaustedError); where the
allocator aborts the process instead (`std::bad_alloc`, then SIGABRT or a segmentation
fault) nothing can be caught, and the shell's "Aborted" or "Segmentation fault" is all there is.
The library's errors speak Python (`weights='/path/to/model.safetensors'`) and carry the
arguments they name (`keras_cait.errors.ArgumentError`, `Named`); the line speaks the command's
flags (`--weights /path/to/model.safetensors`), written from those fields with one table
(`FLAGS`), never found again in the text.
"""

import argparse
import contextlib
import errno
import json
import os
import re
import shlex
import sys
import traceback

from keras_cait.cli.startup.interrupt import DEBUG_ENV, INTERRUPTED, command_begins, debug_requested
from keras_cait.io.atomic import unwritable

USAGE = 2
FAILURE = 1


class UserError(Exception):
    """A mistake of the user's: its message is the line's text, `status` the exit status."""

    def __init__(self, message, status=FAILURE):
        super().__init__(one_line(message))
        self.status = status


class CommandFailed(SystemExit):
    """How a command ends on a user's mistake: `code` is the exit status, `str()` the line printed."""

    def __init__(self, status, line):
        super().__init__(status)
        self.line = line

    def __str__(self):
        return self.line


def fail(message):
    """A user's mistake found while working (status 1): `raise fail("...; do this")`."""
    return UserError(message, FAILURE)


def usage(message):
    """A command line that cannot work (status 2): `raise usage("--top 0: ...; give ...")`."""
    return UserError(message, USAGE)


# === The library's arguments as the command line's flags ===

# The one table from an argument of the library (as Python names it) to the command line's word for
# it, where that is not `--` and the name with dashes (`val_fraction` -> `--val-fraction`); None: a
# positional argument, written by its value alone (`path` of the exporters: export's OUTPUT).
FLAGS = {
    "jit_compile": "--jit",
    "calibration": "--calibration-data",
    "path": None,
    "checkpoint": None,
}


# Arguments of the library that the command line has no flag for: what the command line does for
# `argument=True`.
NO_FLAG = {
    "fit_batch_to_data": "leave --batch-size out",  # the command lowers a batch not typed
}


def flag(argument):
    """The flag of the library's `argument`: `val_fraction` -> `--val-fraction` (`FLAGS`); a
    recipe's knob, `recipe.batch_size`, is its own flag, `--batch-size`."""
    argument = argument.removeprefix("recipe.")
    return FLAGS[argument] if argument in FLAGS else "--" + argument.replace("_", "-")


def flag_value(value):
    """A value as the command line takes it: `none` for None, `0.9 0.999` for a pair, `1e-05`,
    a path as the shell reads it back, a dict as JSON."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(flag_value(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return shlex.quote(json.dumps(value, separators=(",", ":")))
    if isinstance(value, (str, os.PathLike)):
        return shlex.quote(os.fspath(value))
    return str(value)


def flag_name(named, typed=None):
    """A `keras_cait.errors.Named` as the command line writes it: `--weights x.safetensors`,
    `--jit`/`--no-jit` for booleans, `--weights PATH` for a placeholder. `typed`: {argument:
    (value, text)}, the words typed for a value the command turned into another (a --class-names
    FILE into its list of names)."""
    if named.argument in NO_FLAG and named.has_value and named.value is True:
        return NO_FLAG[named.argument]
    word, argument = flag(named.argument), named.argument.removeprefix("recipe.")
    if named.shown is not None:
        text = named.shown
    elif not named.has_value:
        return word or named.argument.upper()
    elif typed and argument in typed and _same(typed[argument][0], named.value):
        text = typed[argument][1]
    elif isinstance(named.value, bool) and word:
        return word if named.value else "--no-" + word[2:]
    else:
        text = flag_value(named.value)
    return text if word is None else f"{word} {text}"


def _same(given, value):
    try:
        return bool(given == value)
    except Exception:  # arrays and others without a plain equality are not the value typed
        return False


def in_flags(error, typed=None):
    """The text of a library's error in the command line's words: an error that holds its
    arguments (`render`, e.g. `keras_cait.errors.ArgumentError`) written with the flags of `FLAGS`,
    any other as it is."""
    render = getattr(error, "render", None)
    if callable(render):
        return render(lambda named: flag_name(named, typed))
    return str(error)


def one_line(message):
    """A message as the line's text: TensorFlow's op names (`{{function_node ...}}`, `[Op:DecodeImage]
    name:`) left out, whitespace folded; an error of the library's in the command line's flags."""
    message = re.sub(r"\{\{function_node [^}]*\}\}", "", in_flags(message))
    message = re.sub(r"\s*\[Op:\w+\]( name: ?\S*)?", "", message)
    return " ".join(message.split())


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are the contract's one line (status 2), not a usage block."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        raise usage(f"{message}{self._where_it_goes()}; see {self.prog} --help")

    def _where_it_goes(self):
        """For a word given without its flag, as a positional argument (`keras-cait finetune XXS24
        --data photos`): the flag it goes with, where the word is a model or a folder."""
        for word in self._words_without_a_flag():
            if "--model" in self._option_string_actions and _names_a_model(word):
                return f" (give the model as --model {word})"
            if "--data" in self._option_string_actions and os.path.isdir(word):
                return f" (give the folder as --data {word})"
        return ""

    def _words_without_a_flag(self):
        given, index = getattr(self, "_given", []), 0
        while index < len(given):
            word, index = given[index], index + 1
            action = self._option_string_actions.get(word)
            if action is not None:
                index += 1 if action.nargs is None else action.nargs if isinstance(action.nargs, int) else 0
            elif not word.startswith("-"):
                yield word


def _names_a_model(word):
    """Whether `word` names a CaiT variant ('XXS24', 'cait_s24_224') or a .keras file."""
    from keras_cait.models.variants import parse_model_name

    if word.endswith(".keras"):
        return True
    try:
        parse_model_name(word)
    except ValueError:
        return False
    return True


def add_debug_flag(parser):
    parser.add_argument(
        "--debug", action="store_true",
        help=f"show the traceback of errors, not only their one line (also {DEBUG_ENV}=1)",
    )


_ADVICE = {
    errno.EACCES: "check its permissions, or choose another folder",
    errno.EPERM: "check its permissions, or choose another folder",
    errno.EROFS: "choose a folder on a writable disk",
    errno.ENOSPC: "free some space or choose a folder on another disk",
    errno.EDQUOT: "free some space or choose a folder on another disk",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "check the path: a part of it is a file, not a folder",
    errno.EISDIR: "give a file, not a folder",
}


def os_error_line(error, advice=None):
    """`PATH: Permission denied; <advice>` for an OSError, naming its file when it has one."""
    what = error.strerror or str(error) or type(error).__name__
    if error.filename is not None:
        what = f"{os.fsdecode(error.filename)}: {what}"
    advice = advice or _ADVICE.get(error.errno, "check the path and try again")
    return f"{what}; {advice}"


def _file_system_op_error(error):
    """TensorFlow's errors of reading files (tf.io): the path, as an OSError would give it."""
    if "tensorflow" not in sys.modules:
        return False
    import tensorflow as tf

    return isinstance(error, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError))


# What lowers the memory a command needs, for the line of an out-of-memory error.
LESS_MEMORY = {
    "train": "lower --batch-size (the learning rate follows it) or --image-size, or train a smaller --model",
    "finetune": "lower --batch-size or --image-size, or fine-tune a smaller --model (e.g. XXS24)",
    "evaluate": "lower --batch-size, or --image-size for a CaiT by name",
    "predict": "lower --batch-size, or use a smaller --model (e.g. cait_xxs24_224)",
    "attention": "use a smaller --model (e.g. cait_xxs24_224)",
    "export": "close other programs, or export a smaller --model (e.g. cait_xxs24_224): an export holds the "
              "model several times over",
    "demo": "run the small demo: --small",
}


def _out_of_memory(error):
    """`(what ran out)` for Python's MemoryError and TensorFlow's (or XLA's) out-of-memory errors, else None."""
    if isinstance(error, MemoryError):
        text = str(error).strip().splitlines()
        return f" ({text[0]})" if text else ""
    names = {kind.__name__ for kind in type(error).__mro__}
    if not names & {"ResourceExhaustedError", "XlaRuntimeError", "OutOfMemoryError"}:
        return None
    message = getattr(error, "message", None) or str(error)
    if not re.search(r"\bOOM\b|out of memory|Cannot allocate memory|failed to allocate", message, re.IGNORECASE):
        return None  # TensorFlow's RESOURCE_EXHAUSTED is also a full disk or a quota
    found = re.search(r"OOM when allocating tensor with shape\s*\[[^\]]*\]|(Out of memory|Cannot allocate "
                      r"memory|failed to allocate)[^\n.;]*", message, re.IGNORECASE)
    return f" ({found.group(0).strip()})" if found else ""


@contextlib.contextmanager
def reported(command, argv):
    """Runs the body of `keras-cait COMMAND`; its user errors end the command with the contract's line.

    `command` is None before a command is known (`keras-cait --bad-flag`). Ctrl-C before
    this (while Keras and TensorFlow load) ends `keras-cait` with the same line
    (`keras_cait.cli.startup.interrupt`); from here on it is a KeyboardInterrupt.
    """
    try:
        command_begins()
        yield
    except UserError as error:
        _exit(command, str(error), error.status, argv)
    except KeyboardInterrupt:
        _exit(command, INTERRUPTED, FAILURE, argv)
    except OSError as error:
        _exit(command, os_error_line(error), FAILURE, argv)
    except Exception as error:
        ran_out = _out_of_memory(error)
        if ran_out is not None:
            advice = LESS_MEMORY.get(command, "close other programs, or run it on a machine with more memory")
            _exit(command, f"out of memory{ran_out}; {advice}.", FAILURE, argv)
        if not _file_system_op_error(error):
            raise
        _exit(command, f"{error.message}; check the path and its permissions", FAILURE, argv)


def _exit(command, message, status, argv):
    if debug_requested(argv):
        traceback.print_exc()
    line = f"keras-cait {command}: {message}" if command else f"keras-cait: {message}"
    print(line, file=sys.stderr, flush=True)
    raise CommandFailed(status, line) from None


@contextlib.contextmanager
def writing(path):
    """An error while writing `path` names it, not the hidden name it is written under first
    (`.1.partial-<pid>-...`, see keras_cait/atomic.py)."""
    try:
        yield
    except OSError as error:
        advice = _ADVICE.get(error.errno, "check the folder and try again")
        raise fail(f"could not write {path}: {error.strerror or error}; {advice}.") from error
    except Exception as error:
        if not _file_system_op_error(error):
            raise
        reason = "permission denied" if "Permission" in type(error).__name__ else "a folder is missing"
        raise fail(f"could not write {path}: {reason}; check the folder and its permissions, or "
                   "choose another folder.") from error


def from_library(error, typed=None):
    """The line of a library's error, in the command line's flags (`in_flags`): status 2 where the
    error says its arguments cannot work whatever the files hold (`usage`), else 1."""
    return UserError(in_flags(error, typed), USAGE if getattr(error, "usage", False) else FAILURE)


def _names_its_argument(error):
    """Whether `error` names the argument at fault itself (`keras_cait.errors.ArgumentError`)."""
    return getattr(error, "argument", None) is not None and callable(getattr(error, "render", None))


@contextlib.contextmanager
def user_input(what, *types):
    """Turns the library's errors about the user's input (`types`, e.g. ValueError) into the line,
    prefixed with `what` (the flag and its value) unless the error names its argument itself."""
    try:
        yield
    except UserError:
        raise
    except types as error:
        if _names_its_argument(error):
            raise from_library(error) from error
        text = in_flags(error).strip() or type(error).__name__
        raise fail(f"{what}: {text}" if what else text) from error


@contextlib.contextmanager
def weights_errors(weights, flag="--weights"):
    """Turns the errors of getting or loading `--weights` (or another `flag` naming a checkpoint)
    into one line naming the flag."""
    from keras_cait.weights.download import cache_dir

    try:
        yield
    except ConnectionError as error:  # the library's error ends with what works without it, --weights none too
        raise fail(in_flags(error)) from error
    except OSError as error:
        where = _named(flag, weights, error)
        keras_home = os.path.dirname(os.path.dirname(cache_dir()))  # KERAS_HOME/models/keras_cait
        path = os.path.abspath(os.fsdecode(error.filename)) if error.filename is not None else ""
        if path == keras_home or path.startswith(keras_home + os.sep):
            raise fail(where + os_error_line(
                error, "set KERAS_HOME to a folder you can write (the weights are cached in "
                       "KERAS_HOME/models), or download the checkpoint elsewhere and pass it: "
                       "--weights /path/to/model.safetensors"
            )) from error
        if error.filename is not None or error.strerror:
            raise fail(where + os_error_line(error)) from error
        raise fail(f"{where}{in_flags(error)}") from error
    except (ValueError, ImportError) as error:
        if _names_its_argument(error):
            raise from_library(error) from error
        raise fail(f"{_named(flag, weights, error)}{in_flags(error)}") from error


def _named(flag, weights, error):
    """`FLAG PATH: ` before a message about a weights file, unless the error names its argument."""
    if weights in (None, "imagenet") or _names_its_argument(error):
        return ""
    return f"{flag} {weights}: "


# === Checks made before any model is built or data are read ===


def check_image_files(paths):
    """Each local image is a file; web addresses, which TensorFlow cannot read, are refused
    (gs:// and TensorFlow's other file systems pass)."""
    for path in paths:
        scheme = path.split("://", 1)[0].lower() if "://" in path else None
        if scheme in ("http", "https", "ftp"):
            raise fail(f"image {path!r}: web addresses are not read; download the image and "
                       "give its path.")
        if scheme is None and os.path.isdir(path):
            raise fail(f"image {path!r} is a folder; give image files (e.g. {path}/*.jpg).")
        if scheme is None and not os.path.isfile(path):
            raise fail(f"image {path!r}: no such file; check the path.")


def check_writable_folder(flag, path, folder=None):
    """`folder` (default: `path`, the value of `flag`) is, or can be made, a folder this process
    writes in; the nearest part of it that exists decides."""
    problem = unwritable(path if folder is None else folder, given=path)
    if problem:
        why, allowed = problem
        raise fail(f"{flag} {path}{' ' if why.startswith('is ') else ': '}{why}; {allowed}.")


def check_writable_file(flag, path):
    """`path` is not a folder, and the folder that will hold it is writable."""
    if os.path.isdir(path):
        raise fail(f"{flag} {path} is a folder; give a file name inside it.")
    check_writable_folder(flag, path, folder=os.path.dirname(os.path.abspath(path)))


def read_class_names(flag, path):
    """The names in the text file `path` given to `flag`, one a line (blank lines skipped), or the line."""
    if not os.path.isfile(path):
        raise fail(f"{flag} {path}: no such file; give a text file with one class name per line.")
    with open(path, encoding="utf-8") as file:
        names = [line.strip() for line in file if line.strip()]
    from keras_cait.errors import listed, repeated

    twice = repeated(names)
    if twice:
        raise fail(f"{flag} {path}: repeats {listed(twice)}; give each class its own name, one a line.")
    return names


def check_range(flag, value, low, high=None, example=None):
    """`low <= value <= high` (high None: no upper bound), else a usage error naming the flag."""
    if value is None or (value >= low and (high is None or value <= high)):
        return
    allowed = f"between {low} and {high}" if high is not None else f"at least {low}"
    example = f", e.g. {flag} {example}" if example is not None else ""
    raise usage(f"{flag} {value}: must be {allowed}{example}.")
