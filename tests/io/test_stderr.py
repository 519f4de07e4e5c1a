"""`import keras_cait` and `keras-cait --help` without TensorFlow's start-up INFO lines, and with
everything else that goes to standard error kept, in order."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from keras_cait.io.stderr import drop_startup_info

STDERR_PY = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "keras_cait", "io", "stderr.py")
NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def run(command, **env):
    """`command` run with TensorFlow's log level unset unless given, as a fresh terminal has it."""
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment.update({"KERAS_BACKEND": "tensorflow", **env})
    return subprocess.run(command, capture_output=True, env=environment, timeout=300)


def run_python(code, **env):
    """stdout, stderr of `python -c code`, which must succeed."""
    done = run([sys.executable, "-c", code], **env)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout, done.stderr


def sources(stderr):
    """The 'file.cc:line' of each Abseil record, e.g. ['port.cc:153', 'cudart_stub.cc:31']."""
    return [line.split(b"]")[0].rsplit(b" ", 1)[-1] for line in stderr.splitlines() if b".cc:" in line]


@pytest.fixture(scope="module")
def plain_keras_import():
    """What importing Keras (and TensorFlow) prints without keras_cait; these tests need it noisy."""
    _, stderr = run_python("import keras")
    if not any(line.startswith(b"I") for line in stderr.splitlines()):
        pytest.skip("this TensorFlow prints no INFO lines on import: nothing to keep out")
    return stderr


@pytest.mark.large
def test_import_keras_cait_prints_nothing_tensorflow_would_not_at_a_log_level_of_1(plain_keras_import):
    _, stderr = run_python("import keras_cait")
    assert NOTICE not in stderr and not any(line.startswith(b"I0") for line in stderr.splitlines())
    assert stderr == drop_startup_info(plain_keras_import)


@pytest.mark.large
def test_keras_cait_help_prints_the_help_and_nothing_else(plain_keras_import):
    stdout, stderr = run_python("from keras_cait.cli import main; main(['--help'])")
    assert stdout.startswith(b"usage: keras-cait") and stderr == b""
    script = shutil.which("keras-cait", path=os.path.dirname(sys.executable))
    if script:  # the console script the README's install puts beside this Python
        done = run([script, "--help"])
        assert done.stdout.startswith(b"usage: keras-cait") and done.stderr == b""


@pytest.mark.large
def test_a_missing_image_is_one_line_on_standard_error_with_no_tensorflow_lines(tmp_path):
    missing = str(tmp_path / "missing.jpg")
    done = run([sys.executable, "-m", "keras_cait.cli", "predict", missing, "--weights", "none"])
    assert done.returncode == 1
    assert done.stderr.decode() == f"keras-cait predict: image {missing!r}: no such file; check the path.\n"


@pytest.mark.large
def test_on_jax_the_modules_that_load_tensorflow_later_print_none_of_its_startup_lines(plain_keras_import):
    """On JAX Keras loads no TensorFlow; the modules that need it (a run's tf.data, the evaluation
    transform, the graph's image check) load it on first use, as quietly as `import keras_cait`."""
    code = ("import sys, keras_cait\n"
            "assert 'tensorflow' not in sys.modules\n"
            "from keras_cait.training import run\n"
            "import keras_cait.models.runtime_checks\n"
            "assert 'tensorflow' in sys.modules")
    _, stderr = run_python(code, KERAS_BACKEND="jax")
    assert NOTICE not in stderr and sources(stderr) == [], stderr.decode()


@pytest.mark.large
def test_tf_cpp_min_log_level_0_keeps_the_startup_lines(plain_keras_import):
    _, stderr = run_python("import keras_cait", TF_CPP_MIN_LOG_LEVEL="0")
    # What the import runs: Keras' import and TensorFlow's device scan, every line of them kept.
    _, unfiltered = run_python("import keras, tensorflow\ntensorflow.config.list_physical_devices()",
                               TF_CPP_MIN_LOG_LEVEL="0")
    assert sources(stderr) == sources(unfiltered) and NOTICE in stderr
    assert set(sources(plain_keras_import)) <= set(sources(stderr))


# keras_cait/io/stderr.py loaded on its own, so no TensorFlow is imported before it runs.
LOAD_STANDALONE = textwrap.dedent(
    f"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("stderr", {STDERR_PY!r})
    stderr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stderr)
    """
)

SCRIPT = textwrap.dedent(
    """
    import os, sys
    print("stderr before", file=sys.stderr)
    try:
        with stderr.quiet_tensorflow_startup():
            os.write(2, {notice!r} + b"\\n")
            os.write(2, b"I0000 00:00:1795435799.297748    1887 port.cc:153] oneDNN custom operations are on.\\n")
            os.write(2, b"I1123 12:06:39.341746    1887 cpu_feature_guard.cc:227] This TensorFlow binary\\n")
            os.write(2, b"To enable the following instructions: AVX2 FMA, rebuild TensorFlow.\\n")
            print("a Python warning", file=sys.stderr)
            os.write(2, b"W0000 00:00:1795435879.550464    2005 op_kernel.cc:1858] a real warning\\n")
            print("stdout inside")
            os.write(2, b"E0000 00:00:1795435879.531657    2005 cuda_platform.cc:52] an error\\n")
            {last}
    except RuntimeError as error:
        print("raised", error, file=sys.stderr)
    print("stderr after", file=sys.stderr)
    """
)


@pytest.mark.parametrize("body_raises", [False, True], ids=["returns", "raises"])
def test_only_abseil_info_is_left_out_and_the_rest_is_written_back_in_order(body_raises):
    last = "raise RuntimeError('import failed')" if body_raises else "pass"
    code = LOAD_STANDALONE + SCRIPT.format(notice=NOTICE, last=last)
    stdout, stderr = run_python(code)
    expected = [
        b"stderr before",
        b"a Python warning",
        b"W0000 00:00:1795435879.550464    2005 op_kernel.cc:1858] a real warning",
        b"E0000 00:00:1795435879.531657    2005 cuda_platform.cc:52] an error",
        *([b"raised import failed"] if body_raises else []),
        b"stderr after",
    ]
    assert stderr.splitlines() == expected
    assert stdout == b"stdout inside\n"


@pytest.mark.large
def test_nothing_is_caught_at_log_level_0_and_the_records_are_after_tensorflow_is_loaded():
    code = LOAD_STANDALONE + SCRIPT.format(notice=NOTICE, last="pass")
    _, stderr = run_python(code, TF_CPP_MIN_LOG_LEVEL="0")
    assert NOTICE in stderr and b"port.cc:153]" in stderr
    # TensorFlow loaded first (a user's `import keras` before keras_cait): what comes after is still tidied.
    _, stderr = run_python("import tensorflow, sys\nprint('loaded', file=sys.stderr, flush=True)\n" + code)
    after = stderr.split(b"loaded\n", 1)[1]
    assert b"port.cc:153]" not in after and NOTICE not in after and b"a real warning" in after


@pytest.mark.large
def test_import_keras_cait_after_keras_adds_no_tensorflow_record():
    """Keras first, as a user may: the INFO lines it printed stay (they came before keras_cait), and
    `import keras_cait`, the device scan included, adds no record of TensorFlow's after them."""
    _, stderr = run_python("import keras, sys\nprint('keras imported', file=sys.stderr, flush=True)\n"
                           "import keras_cait")
    after = stderr.split(b"keras imported\n", 1)[1]
    assert after == b"", after.decode()


@pytest.mark.parametrize("setup", ["os.close(2)", "tempfile.tempdir = '/nonexistent'"],
                         ids=["no standard error", "no temporary directory"])
def test_where_standard_error_cannot_be_caught_the_body_runs_all_the_same(setup):
    stdout, _ = run_python(
        f"import os, tempfile\n{setup}\n" + LOAD_STANDALONE
        + "with stderr.quiet_tensorflow_startup():\n    print('ran')"
    )
    assert stdout == b"ran\n"


def test_an_info_continuation_is_left_out_only_right_after_an_info_record():
    captured = (
        b"To enable the following instructions: not after an INFO record, kept\n"
        b"I0000 00:00:1.5 7 cpu_feature_guard.cc:227] optimized\n"
        b"To enable the following instructions: AVX2\n"
        b"W0000 00:00:1.5 7 a.cc:1] kept\n"
        b"To enable the following instructions: after a warning, kept\n"
        b"I0000 00:00:1.5 7 b.cc:2] no newline at the end"
    )
    assert drop_startup_info(captured) == (
        b"To enable the following instructions: not after an INFO record, kept\n"
        b"W0000 00:00:1.5 7 a.cc:1] kept\n"
        b"To enable the following instructions: after a warning, kept\n"
    )


def test_the_device_scans_no_gpu_record_is_left_out_and_other_errors_are_kept():
    captured = (
        b"E0000 00:00:1795756390.830498    1280 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
        b"Failed call to cuInit: UNKNOWN ERROR (303)\n"
        b"E0000 00:00:1795756390.830498    1280 cuda_platform.cc:52] another CUDA error, kept\n"
        b"E0000 00:00:1795756390.830498    1280 jpeg_mem.cc:331] failed call to cuInit in another file, kept\n"
    )
    assert drop_startup_info(captured) == captured.split(b"\n", 1)[1]


@pytest.mark.large
def test_a_program_that_imports_keras_cait_and_asks_for_gpus_prints_nothing():
    """Where NVIDIA's driver library is installed without a usable GPU (this machine, a cloud VM
    without one), TensorFlow's first device scan printed "failed call to cuInit" as an error."""
    _, stderr = run_python("import keras_cait\nimport tensorflow as tf\nprint(tf.config.list_physical_devices('GPU'))")
    assert stderr == b""
