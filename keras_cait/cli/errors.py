"""What the commands answer when a user's input is wrong: one line that names the flag.

The library's errors speak Python (`weights='/path/to/model.safetensors'`); a
command's error speaks its flags (`--weights /path/to/model.safetensors`) and
never shows a traceback for a missing or unreadable file, an offline download
or weights that do not fit.
"""

import contextlib
import os
import re


def flag_syntax(message):
    """`weights='PATH'` / `weights=None` in a library message -> `--weights PATH` / `--weights none`
    (and the same for `quantization`)."""
    message = re.sub(r"\b(weights|quantization)='([^']*)'", r"--\1 \2", message)
    return re.sub(r"\b(weights|quantization)=None\b", r"--\1 none", message)


def fail(command, message):
    """Exits the command with `keras-cait COMMAND: MESSAGE` on one line (status 1)."""
    return SystemExit(f"keras-cait {command}: " + " ".join(flag_syntax(str(message)).split()))


@contextlib.contextmanager
def weights_errors(command, weights):
    """Turns the errors of getting or loading `--weights` into one line naming the flag."""
    try:
        yield
    except ConnectionError as error:
        raise fail(command, f"{error} Or --weights none for random weights.") from error
    except (OSError, ValueError, ImportError) as error:
        where = "" if weights in (None, "imagenet") else f"--weights {weights}: "
        raise fail(command, f"{where}{error}") from error


def check_image_files(command, paths):
    """Fails before any model is built if a local image file is missing (URLs such as gs:// pass)."""
    for path in paths:
        if "://" not in path and not os.path.isfile(path):
            raise fail(command, f"image {path!r}: no such file.")


def load_keras_model(command, path):
    """A saved `.keras` model (keras_cait imported, so CaiT's layers resolve), or a clean exit."""
    import keras

    import keras_cait  # noqa: F401  registers CaiT's layers with Keras

    if not os.path.isfile(path):
        raise fail(command, f"--model {path!r}: no such file (a .keras model or a CaiT variant).")
    try:
        return keras.models.load_model(path)
    except (OSError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise fail(command, f"--model {path!r} is not a readable .keras model: {first}") from error
