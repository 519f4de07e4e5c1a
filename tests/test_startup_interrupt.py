"""keras_cait.startup_interrupt: which process is the `keras-cait` command, and the line a Ctrl-C
while it starts ends it with (tests/cli/test_error_contract.py interrupts the real command)."""

import signal

import pytest

import keras_cait  # noqa: F401  imported as any library user imports it
from keras_cait.startup_interrupt import INTERRUPTED, interrupted_line, is_the_command


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


def test_importing_keras_cait_elsewhere_leaves_ctrl_c_alone():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
