"""keras_cait.cli.startup.interrupt: which process is the `keras-cait` command, and the line a Ctrl-C
while it starts ends it with (tests/cli/test_error_contract.py interrupts the real command)."""

import pytest

from keras_cait.cli.startup.interrupt import INTERRUPTED, interrupted_line, is_the_command
from tests.test_imports import REPOSITORY


@pytest.mark.parametrize("argv, orig_argv, command", [
    (["/venv/bin/keras-cait", "predict", "x.jpg"], ["/venv/bin/python", "/venv/bin/keras-cait", "predict"], True),
    (["keras-cait.exe", "export"], [], True),
    (["keras-cait-script.py", "export"], [], True),
    (["-m", "train"], ["python", "-X", "utf8", "-m", "keras_cait.cli", "train"], True),
    (["-m", "train"], ["python", "-mkeras_cait.cli", "train"], True),
    (["-m", "tests"], ["python", "-m", "pytest", "tests"], False),
    (["train.py", "keras-cait"], ["python", "train.py", "keras-cait"], False),
    (["-c"], ["python", "-c", "import keras_cait"], False),
    ([], [], False),
])
def test_only_the_console_script_and_python_m_keras_cait_cli_are_the_command(argv, orig_argv, command):
    assert is_the_command(argv, orig_argv) is command


def test_the_line_names_the_command_given():
    assert interrupted_line(["--debug", "finetune", "--data", "photos"]) == f"keras-cait finetune: {INTERRUPTED}"
    assert interrupted_line(["--help"]) == f"keras-cait: {INTERRUPTED}"


IMPORTER = """
import signal
def own(signum, frame):
    pass
for handler in (signal.default_int_handler, own):
    signal.signal(signal.SIGINT, handler)
    import keras_cait, keras_cait.cli  # noqa: F401  (cached after the first pass)
    print(signal.getsignal(signal.SIGINT) is handler)
"""


@pytest.mark.large
def test_importing_keras_cait_elsewhere_leaves_ctrl_c_alone():
    """In a program that imports keras_cait (the handler set before the import, whatever the
    test runner inherited: a background job starts with Ctrl-C ignored), Ctrl-C stays its own."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IMPORTER], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]


SWALLOWED = """
import gc, os, signal, sys, time
sys.argv = ["/venv/bin/keras-cait", "finetune", "--data", "photos"]
from keras_cait.cli.startup.interrupt import end_on_interrupt_while_starting
end_on_interrupt_while_starting()

def collector_callback(phase, info):  # as JAX's, which Python runs with its exceptions ignored
    if phase == "start" and not getattr(collector_callback, "done", False):
        collector_callback.done = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the callback

class Other:
    def __del__(self):
        raise ValueError("someone else's, printed")

gc.callbacks.append(collector_callback)
gc.collect()
gc.callbacks.remove(collector_callback)
Other()  # an exception Python ignores that is not ours, after ours: still printed
print("still starting", flush=True)
from keras_cait.cli.errors import reported
with reported("finetune", sys.argv[1:]):
    print("the command ran", flush=True)
"""


@pytest.mark.large
def test_a_ctrl_c_swallowed_while_starting_ends_the_command_when_it_begins():
    """A Ctrl-C that lands in a garbage collector's callback while keras-cait starts (once, in the
    suite: the interrupted finetune trained on; in CI, Python printed it as "Exception ignored" with
    a traceback) ends the command with its line alone as it begins."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPOSITORY, "KERAS_CAIT_DEBUG": ""})
    assert "still starting" in done.stdout  # the callback swallowed it
    assert "the command ran" not in done.stdout and done.returncode == 1, (done.stdout, done.stderr[-2000:])
    assert "ValueError: someone else's, printed" in done.stderr, done.stderr[-2000:]
    assert "SystemExit" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == f"keras-cait finetune: {INTERRUPTED}", done.stderr[-2000:]


IGNORED_WHILE_RUNNING = """
import gc, os, signal, sys, time
sys.argv = ["/venv/bin/keras-cait", "finetune", "--data", "photos"] + sys.argv[1:]
from keras_cait.cli.startup.interrupt import end_on_interrupt_while_starting
end_on_interrupt_while_starting()
from keras_cait.cli.errors import reported

def collector_callback(phase, info):  # as JAX's, which Python runs with its exceptions ignored
    if phase == "start" and not getattr(collector_callback, "done", False):
        collector_callback.done = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the KeyboardInterrupt is raised here, inside the callback

class Other:
    def __del__(self):
        raise ValueError("someone else's, printed")

with reported("finetune", sys.argv[1:]):
    Other()  # an exception Python ignores that is not a Ctrl-C: still printed
    gc.callbacks.append(collector_callback)
    end = time.monotonic() + 5  # the run
    while time.monotonic() < end:
        gc.collect()
        time.sleep(0.01)
    print("trained every epoch", flush=True)
"""


@pytest.mark.large
@pytest.mark.parametrize("debug", [False, True])
def test_a_ctrl_c_python_ignores_while_the_command_runs_still_ends_it(debug):
    """A Ctrl-C that lands in a garbage collector's callback once the command runs (JAX's runs at
    every collection) is raised again in the main thread: the run ends with the contract's line
    instead of training on to its last epoch (in the suite, an interrupted finetune of 1000 epochs
    once trained until the test's timeout). With --debug Python's report of it is printed too."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IGNORED_WHILE_RUNNING, *(["--debug"] if debug else [])],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPOSITORY, "KERAS_CAIT_DEBUG": ""})
    assert "trained every epoch" not in done.stdout and done.returncode == 1, (done.stdout, done.stderr[-2000:])
    assert "ValueError: someone else's, printed" in done.stderr, done.stderr[-2000:]
    assert ("Exception ignored in: <function collector_callback" in done.stderr) is debug, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == f"keras-cait finetune: {INTERRUPTED}", done.stderr[-2000:]
