"""`keras_cait.training.run_state`: train, finetune and evaluate leave the caller's process as it found
it (the global dtype policy, op determinism, the global random generators), and a run still computes
in the precision asked for, with its own seed."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from keras_cait.training import RECIPES, run
from tests.conftest import TINY_CAIT, TINY_SIZE

TRAIN = RECIPES["scratch"].replace(epochs=1, warmup_epochs=0, batch_size=10)
FINETUNE = RECIPES["transfer"].replace(head_epochs=1, epochs=1, batch_size=10)


def seeded():
    """The caller seeds every global generator (Keras' too: `keras.utils.set_random_seed`)."""
    keras.utils.set_random_seed(7)


def draws():
    """One draw of each global generator: Python's, NumPy's, TensorFlow's and Keras' (unseeded ops)."""
    return (random.random(), float(np.random.random()), float(tf.random.uniform(())),
            float(keras.random.uniform(())))


def block_policies(model):
    return {layer.dtype_policy.name for layer in model.layers if "block" in layer.name}


@pytest.fixture
def folder(digits, tmp_path):
    return digits(tmp_path / "digits", per_class=2, size=TINY_SIZE)


@pytest.mark.large
def test_train_finetune_and_evaluate_leave_the_caller_s_policy_determinism_and_generators(
        tiny_cait, folder, tmp_path, policy):
    pretrained = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(pretrained)
    calls = {
        "train": lambda: run.train(dict(TINY_CAIT), folder, tmp_path / "train", recipe=TRAIN, image_size=TINY_SIZE,
                                   precision="float32", deterministic=True, seed=3, verbose=0),
        "finetune": lambda: run.finetune(pretrained, folder, tmp_path / "finetune", recipe=FINETUNE,
                                         val_fraction=0, precision="mixed_bfloat16", deterministic=True, verbose=0),
        "evaluate": lambda: run.evaluate(pretrained, folder, precision="float32", verbose=0),
    }
    seeded()
    expected = draws()
    policy("mixed_float16")  # the caller's own, neither the default nor any run's
    assert not tf_config.is_op_determinism_enabled()
    results = {}
    for name, call in calls.items():
        seeded()
        results[name] = call()
        assert keras.config.dtype_policy().name == "mixed_float16", name
        assert not tf_config.is_op_determinism_enabled(), name
        assert draws() == expected, f"{name} reseeded or drew from the caller's generators"
    # Each computed in the precision asked for, not the caller's.
    assert block_policies(results["train"].model) == {"float32"}
    assert block_policies(results["finetune"].model) == {"mixed_bfloat16"}
    assert block_policies(results["evaluate"].model) == {"float32"}


@pytest.mark.large
def test_a_run_s_weights_come_from_its_own_seed_not_the_caller_s(folder, tmp_path, policy):
    """Two trainings of one seed agree whatever the caller's generators hold; another seed does not."""
    def trained(seed, name):
        random.seed(len(name))  # the caller's state differs from call to call
        np.random.seed(len(name))
        model = run.train(dict(TINY_CAIT), folder, tmp_path / name, recipe=TRAIN, image_size=TINY_SIZE,
                          precision="float32", deterministic=True, seed=seed, verbose=0).model
        return [np.array(weight) for weight in model.weights]

    first, again, other = trained(3, "a"), trained(3, "bb"), trained(4, "ccc")
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, c) for a, c in zip(first, other))


def test_the_state_is_put_back_after_a_keyboard_interrupt(policy):
    from keras_cait.training import run_state

    @run_state.process_state_kept
    def interrupted():
        run_state.seed(5, deterministic=True)
        raise KeyboardInterrupt

    seeded()
    expected = draws()
    seeded()
    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert not tf_config.is_op_determinism_enabled()
    assert draws() == expected


def test_keras_distribution_a_run_sets_is_put_back(policy):
    """strategy="dataparallel" sets Keras' global distribution (JAX); the caller's comes back."""
    from keras_cait.training import run_state

    caller, runs = object(), object()  # stand-ins: keras.distribution keeps whatever it is given

    @run_state.process_state_kept
    def a_run():
        keras.distribution.set_distribution(runs)
        assert keras.distribution.distribution() is runs

    keras.distribution.set_distribution(caller)
    try:
        a_run()
        assert keras.distribution.distribution() is caller
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.large
def test_a_run_interrupted_in_python_says_where_it_stopped_and_the_same_call_resumes_it(
        tiny_cait, folder, tmp_path, monkeypatch, capsys, policy):
    """Ctrl-C in a fit used to end in a bare KeyboardInterrupt: nothing said where it stopped or what to do."""
    from keras_cait.training import resume

    pretrained = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(pretrained)
    recipe = RECIPES["transfer"].replace(head_epochs=2, epochs=0, batch_size=5)  # 4 steps an epoch
    finetune = lambda: run.finetune(pretrained, folder, tmp_path / "run", recipe=recipe, val_fraction=0,  # noqa: E731
                                    precision="float32", backup_every=2, deterministic=True, verbose=0)
    step_ended = resume.ResumableBackup.on_train_batch_end

    def interrupted_at_step_7(backup, batch, logs=None):
        step_ended(backup, batch, logs)
        if backup.step == 7:
            raise KeyboardInterrupt

    monkeypatch.setattr(resume.ResumableBackup, "on_train_batch_end", interrupted_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        finetune()
    backup = tmp_path / "run" / "backup" / "head"
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said == (f"Interrupted in the head stage at step 7 of 8 (epoch 2 of 2); backed up at step 6 in {backup}, "
                    "where the same call again resumes it.")
    assert not tf_config.is_op_determinism_enabled()  # put back on this exit path too

    monkeypatch.setattr(resume.ResumableBackup, "on_train_batch_end", step_ended)
    assert finetune().summary["resumed"] == {"head": 6}


@pytest.mark.large
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "float32"])
def test_evaluate_of_a_keras_file_computes_in_the_precision_asked_for(tiny_cait, folder, tmp_path, precision):
    """It ran in the file's saved policy whatever `precision` said."""
    path = str(tmp_path / "model.keras")
    saved = "float32" if precision != "float32" else "mixed_bfloat16"
    tiny_cait(classes=10, dtype=saved).save(path)
    result = run.evaluate(path, folder, precision=precision, verbose=0)
    assert block_policies(result.model) == {precision}
    assert set(result.summary) == {"top1", "top5", "images"} and result.summary["images"] == 20
