"""Standard error at the descriptor level: TensorFlow's start-up INFO lines kept out of
`import keras_cait`, and writes that a closed standard error does not break.

When TensorFlow 2.21 loads it logs, at INFO level, that oneDNN is on, that no
CUDA driver was found and which CPU instructions it could use (and, where NVIDIA's
driver library is installed without a usable GPU, an error record "failed call to
cuInit" when it first scans its devices), each preceded by
Abseil's notice "All log messages before absl::InitializeLog() is called are
written to STDERR". Abseil prints these before its log level is set up, so
`TF_CPP_MIN_LOG_LEVEL` cannot hide them (abseil/abseil-cpp#1718, #1957), and
they would open every `keras-cait` command, `--help` included.

`import keras_cait` imports Keras (and with it TensorFlow) and scans TensorFlow's
devices inside `quiet_tensorflow_startup()`: standard error is caught in a temporary file
while the import runs and written back afterwards, in order, without those
INFO lines. Everything else (warnings, errors, Python's own messages) is kept.
`TF_CPP_MIN_LOG_LEVEL=0` keeps the INFO lines too.

On JAX or PyTorch, Keras loads no TensorFlow: the package's modules that need it (tf.data
reading a run's data, the evaluation transform) import it with `load_tensorflow()`, the same
way, on first use.

Where Keras or TensorFlow was imported before keras_cait, the lines TensorFlow prints as it
loads are on the terminal already: nothing can take them back, so the docs' snippets import
keras_cait first. The device scan, which `import keras_cait` runs in either order, still
leaves out its "failed call to cuInit" record.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading

# An Abseil INFO record: "I1123 12:06:39.297748    1887 port.cc:153] ...", whose seconds
# are since the epoch ("I0000 00:00:1795435799.297748") before Abseil is initialised.
_INFO_RECORD = re.compile(rb"I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:\]]+:\d+\] ")
_ABSL_NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# The second line of cpu_feature_guard.cc's record, which Abseil writes unprefixed.
_INFO_CONTINUATION = b"To enable the following instructions:"
# The device scan's error record on a machine with NVIDIA's driver library but no usable GPU
# ("failed call to cuInit: ... UNKNOWN ERROR (303)"): TensorFlow then runs on the CPU, as it
# does where the library is absent and it says so at INFO level.
_NO_GPU_RECORD = re.compile(rb"E\d{4} \d\d:\d\d:\d+\.\d+ +\d+ cuda_[a-z_]+\.cc:\d+\] failed call to cuInit")


def drop_startup_info(captured):
    """`captured` (bytes written to standard error) without Abseil's INFO records and notice, and
    without the device scan's record of a driver library with no GPU behind it."""
    kept = []
    after_info = False
    for line in captured.splitlines(keepends=True):
        info = _INFO_RECORD.match(line) is not None or _NO_GPU_RECORD.match(line) is not None
        if info or line.rstrip(b"\r\n") == _ABSL_NOTICE:
            after_info = info
            continue
        if after_info and line.startswith(_INFO_CONTINUATION):
            continue
        after_info = False
        kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def quiet_tensorflow_startup():
    """Runs its body with TensorFlow's start-up INFO lines removed from standard error."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    try:
        caught = tempfile.TemporaryFile()
    except OSError:  # no writable temporary directory: leave standard error as it is
        yield
        return
    with caught:
        try:
            original = os.dup(2)
        except OSError:  # no standard error to tidy (a daemon, a closed descriptor)
            yield
            return
        flush_stderr()
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            flush_stderr()
            os.dup2(original, 2)
            os.close(original)
            caught.seek(0)
            write_all(2, drop_startup_info(caught.read()))


def load_tensorflow():
    """TensorFlow, imported inside `quiet_tensorflow_startup()` where this is its first import (on
    JAX or PyTorch, the first of the package's tf.data modules that a user imports)."""
    if "tensorflow" not in sys.modules:
        with quiet_tensorflow_startup():
            import tensorflow  # noqa: F401

            tensorflow.config.list_physical_devices()  # the device scan, whose "no GPU" record is left out
    return sys.modules["tensorflow"]


def flush_stderr():
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


def write_all(fd, data):
    """Writes `data` to `fd`; where standard error is gone, drops it (a pipe must keep draining)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return


@contextlib.contextmanager
def stderr_through(forward, name):
    """Runs its body with standard error (file descriptor 2) flowing through a pipe, which a thread
    running `forward(read_end, original)` reads to its end, writing on to the real standard error
    (`original`) what it keeps, in order and as it comes. Where there is no standard error, or no
    pipe to be had, the body runs as it is."""
    try:
        original = os.dup(2)
    except OSError:  # no standard error (a daemon, a closed descriptor): nothing to tidy
        yield
        return
    try:
        read_end, write_end = os.pipe()
    except OSError:
        os.close(original)
        yield
        return
    flush_stderr()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(target=forward, args=(read_end, original), daemon=True, name=name)
    forwarder.start()
    try:
        yield
    finally:
        flush_stderr()
        os.dup2(original, 2)  # the pipe's last writer is gone: the forwarder reads to its end
        forwarder.join(timeout=10)
        if not forwarder.is_alive():  # else a child process still holds the pipe, and the thread the fd
            os.close(original)
