"""keras_cait.cli.startup.onednn: oneDNN's CPU kernels in the `keras-cait` process, nowhere else.

What TensorFlow decided is read inside the real processes: a `sitecustomize` on PYTHONPATH
registers an exit hook that prints whether TensorFlow's oneDNN ops are on, so the console
script itself is observed, not a restatement of its rule."""

import os
import platform
import subprocess
import sys

import pytest

from keras_cait.cli.startup.onednn import VARIABLE, X86

OBSERVER = """
import atexit, sys

def _report():
    if "tensorflow" in sys.modules:
        from tensorflow.python.util import _pywrap_util_port
        sys.stderr.write(f"\\nONEDNN={_pywrap_util_port.IsMklEnabled()}\\n")

atexit.register(_report)
"""


def onednn_seen(command, tmp_path, **environment):
    """Whether TensorFlow ran with oneDNN's ops in the process of `command`."""
    (tmp_path / "sitecustomize.py").write_text(OBSERVER)
    env = {key: value for key, value in os.environ.items() if key != VARIABLE}
    env.update(environment, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("ONEDNN=")]
    return line == "ONEDNN=True"


def tensorflow_default(tmp_path):
    """What TensorFlow decides by itself on this CPU (on with AVX-512 VNNI or newer)."""
    return onednn_seen([sys.executable, "-c", "import tensorflow"], tmp_path)


@pytest.mark.large
@pytest.mark.skipif(platform.machine().lower() not in X86, reason="the command turns oneDNN on on x86 CPUs only")
def test_the_console_script_runs_onednn_and_a_script_importing_keras_cait_is_left_alone(tmp_path):
    console = os.path.join(os.path.dirname(sys.executable), "keras-cait")
    assert onednn_seen([console, "--help"], tmp_path)
    assert onednn_seen([sys.executable, "-m", "keras_cait.cli", "--help"], tmp_path)
    assert onednn_seen([sys.executable, "-c", "import keras_cait"], tmp_path) == tensorflow_default(tmp_path)
    # The user's own setting wins, also in the command.
    assert not onednn_seen([console, "--help"], tmp_path, **{VARIABLE: "0"})
