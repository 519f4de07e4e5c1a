"""`keras_cait.training.run`: a whole run as one Python call, resumable after a kill, no CLI involved."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_cait import cpu
from keras_cait.training import RECIPES, precision, run, run_data, run_models
from tests.training.test_resume import kill_mid_epoch

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS_PER_EPOCH = 90 // 8  # 100 digits, 10 % held out, batches of 8

# The child: the library's finetune, as a Python user calls it (sys.argv: model, data, output folder).
CHILD = """
import sys
from keras_cait.training import RECIPES, run
from tests.training.test_resume import kill_mid_epoch

recipe = RECIPES["transfer"].replace(batch_size=8, head_epochs=1, epochs=2, lr=3e-4, mixup=0.8, cutmix=1.0,
                                     model_ema=True, model_ema_decay=0.9)
result = run.finetune(sys.argv[1], sys.argv[2], sys.argv[3], recipe=recipe, image_size=32, precision="float32",
                      backup_every=2, deterministic=True, seed=3, verbose=0)
print("RESUMED", result.summary["resumed"])
"""


def python_finetune(model_path, data_dir, output_dir):
    env = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, "-c", CHILD, model_path, data_dir, output_dir], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.large
def test_a_python_finetune_killed_mid_epoch_resumes_to_the_weights_of_an_uninterrupted_one(
        tiny_cait, digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=10)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10, drop_path_rate=0.2).save(model_path)
    uninterrupted, interrupted = str(tmp_path / "uninterrupted"), str(tmp_path / "interrupted")

    reference = python_finetune(model_path, data_dir, uninterrupted)
    killed_at = kill_mid_epoch(python_finetune(model_path, data_dir, interrupted), interrupted, STEPS_PER_EPOCH)

    resumed = python_finetune(model_path, data_dir, interrupted)
    outputs = {}
    for name, process in (("reference", reference), ("resumed", resumed)):
        outputs[name], _ = process.communicate(timeout=600)
        assert process.returncode == 0, outputs[name]
    # The rerun says where it resumed, and skipped the finished head stage.
    assert f"Resuming full from the backup at step {killed_at} of {2 * STEPS_PER_EPOCH}" in outputs["resumed"]
    assert f"RESUMED {{'full': {killed_at}}}" in outputs["resumed"]
    assert "RESUMED {}" in outputs["reference"]
    assert "the head is loaded from" in outputs["resumed"]
    assert not os.path.exists(os.path.join(interrupted, "backup", "full"))  # removed when done
    got = keras.models.load_model(os.path.join(interrupted, "final.keras"))
    want = keras.models.load_model(os.path.join(uninterrupted, "final.keras"))
    assert len(got.weights) == len(want.weights)
    for a, b in zip(got.weights, want.weights):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert not np.array_equal(np.array(got.weights[0]), np.array(keras.models.load_model(model_path).weights[0]))


@pytest.fixture
def tiny_run(tiny_cait, digits, tmp_path):
    """(model file, data folder) of a 10-class tiny CaiT and 3 images a class."""
    data_dir = digits(tmp_path / "digits", per_class=3)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)
    return model_path, data_dir


@pytest.mark.large
def test_a_python_finetune_returns_the_model_with_its_classes_and_a_summary(
        tiny_run, tmp_path, policy, monkeypatch, capsys):
    """Without the tensorboard package (the `train` extra) the run trains, says so and writes no logs."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "tensorboard" else find_spec(name, *args))
    model_path, data_dir = tiny_run
    recipe = RECIPES["transfer"].replace(batch_size=10, head_epochs=1, epochs=1)
    result = run.finetune(model_path, data_dir, tmp_path / "run", recipe=recipe, precision="float32",
                          val_fraction=0, verbose=2)
    said = capsys.readouterr().out
    assert "No TensorBoard logs: the tensorboard package is not installed" in said
    # The run's plan in the caller's words (the command line's: `--strategy none`, tests/cli/test_train_defaults.py).
    assert "1 replica (strategy='none'), global batch 10 (10 per replica), " in said, said
    # Each stage's own rate: the head's was never said (the whole network's stood for both).
    assert (f"3 steps per epoch, peak learning rate {recipe.peak_lr(10, head=True):.3g} for the head (stage 1), "
            f"{recipe.peak_lr(10):.3g} in stage 2\n") in said, said
    assert not (tmp_path / "run" / "logs").exists()
    assert list(result.model.class_names) == sorted(os.listdir(data_dir))
    assert result.summary["output_dir"] == str(tmp_path / "run")
    assert {"best.keras", "final.keras", "head.weights.h5", "run.json", "recipe.json"} == set(result.summary["files"])
    assert result.summary["best"]["monitor"] == "loss" and result.summary["best"]["stage"] in ("head", "full")
    assert not result.summary["finished_earlier"] and result.summary["resumed"] == {}
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["command"] == "finetune" and saved["finished"] == ["head", "full"]
    assert saved["settings"]["data"] == os.path.abspath(data_dir)

    again = run.finetune(model_path, data_dir, tmp_path / "run", recipe=recipe, precision="float32",
                         val_fraction=0, verbose=0)
    assert again.summary["finished_earlier"]
    assert again.model.class_names == result.model.class_names
    with pytest.raises(run.resume.BackupError, match=r"settings \(epochs 1 then, 2 now\)"):
        run.finetune(model_path, data_dir, tmp_path / "run", recipe=recipe.replace(epochs=2),
                     precision="float32", val_fraction=0, verbose=0)


@pytest.mark.large
def test_runs_repeated_in_one_process_say_no_retracing_warning(tiny_run, tmp_path, policy):
    """A notebook's second finetune, and evaluations after it, logged TensorFlow's "5 out of the
    last 13 calls to <function ...> triggered tf.function retracing" (also at verbose=0): each stage
    compiles a new model, and the warning's advice is for one's own loops."""
    import logging

    model_path, data_dir = tiny_run
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        recipe = RECIPES["transfer"].replace(batch_size=10, head_epochs=1, epochs=1)
        for index in range(2):
            run.finetune(model_path, data_dir, tmp_path / f"run{index}", recipe=recipe, precision="float32",
                         val_fraction=0, verbose=0, jit_compile=False)
        for _ in range(3):
            run.evaluate(str(tmp_path / "run0" / "final.keras"), data_dir, verbose=0)
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage() for record in records if "retracing" in record.getMessage()] == []
    assert logger.filters == []  # the filter was the runs' own


@pytest.mark.large
def test_best_keras_is_the_best_epoch_of_the_whole_run_not_of_its_last_stage(tiny_run, tmp_path, policy, monkeypatch):
    """Each stage's checkpoint started from nothing, so the whole network's first epoch replaced the head
    stage's better model. Here the head stage's record is made unbeatable (a loss of -1) once it ends:
    the second stage must leave best.keras and best.json as the head stage left them."""
    from keras_cait.training import run_folder

    fit = run_folder.Run.fit

    def fit_then_record_an_unbeatable_head(self, model, stage, *args, **kwargs):
        history = fit(self, model, stage, *args, **kwargs)
        if stage == "head":
            record = json.loads((tmp_path / "run" / "best.json").read_text())
            (tmp_path / "run" / "best.json").write_text(json.dumps({**record, "value": -1.0}))
            os.utime(tmp_path / "run" / "best.keras", (1, 1))
        return history

    monkeypatch.setattr(run_folder.Run, "fit", fit_then_record_an_unbeatable_head)
    model_path, data_dir = tiny_run
    recipe = RECIPES["transfer"].replace(batch_size=10, head_epochs=1, epochs=2)
    result = run.finetune(model_path, data_dir, tmp_path / "run", recipe=recipe, precision="float32",
                          val_fraction=0, verbose=0)
    assert result.summary["best"] == {"monitor": "loss", "value": -1.0, "epoch": 1, "stage": "head"}
    assert os.stat(tmp_path / "run" / "best.keras").st_mtime == 1  # not written again


@pytest.mark.large
def test_a_head_only_run_returns_and_saves_a_model_whose_backbone_trains(tiny_run, tmp_path, policy, capsys):
    """The head stage's frozen backbone stayed frozen in the returned model, final.keras and best.keras:
    a later fit of either trained the head alone, silently."""
    model_path, data_dir = tiny_run
    recipe = RECIPES["transfer"].replace(batch_size=10, head_epochs=1, epochs=0)
    result = run.finetune(model_path, data_dir, tmp_path / "run", recipe=recipe, precision="float32",
                          val_fraction=0, verbose=2)
    assert f"peak learning rate {recipe.peak_lr(10, head=True):.3g} (the head)\n" in capsys.readouterr().out
    every = len(keras.models.load_model(model_path).trainable_weights)
    assert len(result.model.trainable_weights) == every
    for name in ("final.keras", "best.keras"):
        assert len(keras.models.load_model(tmp_path / "run" / name).trainable_weights) == every, name


def test_a_model_given_as_an_object_is_trained_as_a_copy_and_told_from_another_by_its_weights(
        tiny_cait, digits, tmp_path, policy):
    """A run.json recorded a Keras model as "<model NAME>": another model of that name was handed the
    first one's result as "finished earlier with the same settings" (or resumed from its backup). The
    run trained the caller's model in place, too, so its record could not be kept by its weights."""
    data_dir = digits(tmp_path / "digits", per_class=3, classes=range(3))
    given, other = tiny_cait(classes=3), tiny_cait(classes=3)
    other.set_weights([weight + 1 for weight in other.get_weights()])
    weights = [np.array(weight) for weight in given.get_weights()]
    # The model's own drop_path_rate and policy: a run that rebuilt nothing trained the caller's model in place.
    recipe = RECIPES["transfer"].replace(batch_size=9, head_epochs=1, epochs=1, drop_path=0.0)
    options = dict(recipe=recipe, precision="float32", val_fraction=0, verbose=0, jit_compile=False)

    first = run.finetune(given, data_dir, tmp_path / "run", **options)
    for before, after in zip(weights, given.get_weights()):
        np.testing.assert_array_equal(after, before)  # the caller's model as given
    assert not any(layer is mine for layer in first.model._flatten_layers() for mine in given._flatten_layers())
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["settings"]["model"]
    assert recorded.startswith(f"<model {given.name}, weights ")

    assert run.finetune(given, data_dir, tmp_path / "run", **options).summary["finished_earlier"]
    with pytest.raises(run.resume.BackupError, match=r"holds a run with other settings \(model .*weights"):
        run.finetune(other, data_dir, tmp_path / "run", **options)

    # A run.json of an earlier keras_cait, which recorded the model by its name alone, still resumes,
    # with a model of that name only.
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    record["settings"]["model"] = f"<model {given.name}>"
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    for name in (f"{given.name}_2", "other"):
        renamed = tiny_cait(classes=3, name=name)
        with pytest.raises(run.resume.BackupError, match=r"holds a run with other settings \(model "):
            run.finetune(renamed, data_dir, tmp_path / "run", **options)
    assert run.finetune(given, data_dir, tmp_path / "run", **options).summary["finished_earlier"]

    # Every weight is in the digest, those that do not train too (the pre-softmax mix's bias).
    from keras_cait.training import run_data

    twin = tiny_cait(classes=3)
    twin.set_weights(given.get_weights())
    assert run_data.recorded_model(twin) == run_data.recorded_model(given)
    frozen = twin.non_trainable_weights[0]
    frozen.assign(frozen + 1.0)
    assert run_data.recorded_model(twin) != run_data.recorded_model(given)


@pytest.mark.parametrize("changes, argument, words", [
    (dict(batch_size=64), "recipe.batch_size", "recipe.batch_size=64: the global batch of 64 is larger than the 30 "
                                               "training images"),
    (dict(epochs=3, warmup_epochs=5.0), "recipe.warmup_epochs",
     "recipe.warmup_epochs=5.0: the warmup must be shorter than the run of recipe.epochs=3; give recipe.epochs=6 or "
     "more, or recipe.warmup_epochs from 0 to below 3 (fractions too)"),
    (dict(epochs=0, head_epochs=0), "recipe.epochs", "recipe.epochs=0: nothing to train, with recipe.head_epochs=0; "
                                                     "give recipe.epochs or recipe.head_epochs of at least 1"),
])
def test_a_run_that_cannot_work_raises_run_error_naming_the_argument_and_writes_nothing(
        tiny_run, tmp_path, changes, argument, words, policy):
    model_path, data_dir = tiny_run
    with pytest.raises(run.RunError, match=words.replace("(", r"\(").replace(")", r"\)")) as raised:
        run.finetune(model_path, data_dir, tmp_path / "run", recipe=RECIPES["transfer"].replace(**changes),
                     val_fraction=0, precision="float32", verbose=0)
    assert raised.value.argument == argument
    assert not (tmp_path / "run").exists()


def test_python_evaluate_leaves_the_caller_s_model_compiled_as_it_was(tiny_run, policy):
    model_path, data_dir = tiny_run
    model = keras.models.load_model(model_path)
    optimizer = keras.optimizers.Adam(1e-4)
    model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
    result = run.evaluate(model, data_dir, verbose=0)
    assert result.model is model and result.summary["images"] == 30
    assert model.optimizer is optimizer and model.loss == "categorical_crossentropy"
    labels = keras.utils.to_categorical(np.arange(2) % model.output_shape[-1], model.output_shape[-1])
    model.fit(np.zeros((2, *model.input_shape[1:]), "float32"), labels, verbose=0)  # one-hot labels still fit


def test_python_evaluate_reports_the_accuracy_of_a_model_file(tiny_run, policy):
    model_path, data_dir = tiny_run
    result = run.evaluate(model_path, data_dir, verbose=0)
    report = result.summary
    assert set(report) == {"top1", "top5", "images"} and report["images"] == 30
    assert result.model.name == keras.models.load_model(model_path).name
    with pytest.warns(DeprecationWarning, match=r"read result.summary\["):
        assert result["top1"] == report["top1"] and "top5" in result  # the dict it returned before
    assert 0 <= report["top1"] <= report["top5"] <= 1


def test_evaluate_on_other_classes_says_each_argument_once(tiny_cait, digits, tmp_path, policy):
    """`data='…': data='…' has the classes …`: the argument the error names was said again in its line."""
    data_dir = digits(tmp_path / "digits", per_class=1, size=8, classes=range(3))
    named, four = tiny_cait(classes=3), tiny_cait(classes=4)
    named.class_names = ["ant", "bee", "cow"]
    for model, name, problem in [(named, "m.keras", "has the classes 0, 1, 2 but model={!r} was trained on ant, "
                                                    "bee, cow; "),
                                 (four, "four.keras", "has 3 classes but model={!r} predicts 4 classes; ")]:
        model.save(tmp_path / name)
        with pytest.raises(run.RunError) as raised:
            run.evaluate(str(tmp_path / name), data_dir, verbose=0)
        assert str(raised.value).startswith(
            f"data={os.path.abspath(data_dir)!r}: " + problem.format(str(tmp_path / name)))


@pytest.mark.parametrize("gpus, flags, expected", [
    (1, {"avx2"}, "mixed_float16"),
    (0, {"avx2", "avx512f", "avx512_bf16"}, "mixed_bfloat16"),
    (0, {"avx2", "amx_tile", "amx_bf16"}, "mixed_bfloat16"),
    (0, {"avx2", "avx512f"}, "float32"),
])
def test_the_default_precision_is_the_fast_one_where_the_run_is(gpus, flags, expected):
    precision, why = run.default_precision(gpus=gpus, cpu_flags=flags)
    assert precision == expected and why


def test_this_machine_s_default_precision_reads_its_cpu_flags_and_devices():
    flags = open("/proc/cpuinfo").read()
    bf16 = "avx512_bf16" in flags.split() or "amx_bf16" in flags.split()
    expected = "mixed_bfloat16" if bf16 else "float32"
    assert run.default_precision() == run.default_precision(gpus=0, cpu_flags=cpu.cpu_flags())
    assert run.default_precision()[0] == expected  # no GPU where the suite runs on a CPU


def test_the_precision_chosen_is_said_in_the_callers_words(capsys):
    """From Python the line names `precision`; the command line, which calls the library speaking
    flags, `--precision` (the first-hour test runs it)."""
    from keras_cait.cli.errors import flag_name
    from keras_cait.errors import speaking

    assert precision.check_precision("auto", auto=True) == "auto" and not capsys.readouterr().out  # checked only
    chosen = precision.resolved_precision("auto")
    said = capsys.readouterr().out
    assert said.startswith(f"Precision {chosen} (") and "; precision chooses another)." in said
    assert "--" not in said
    with speaking(flag_name):
        precision.resolved_precision("auto")
    assert "; --precision chooses another)." in capsys.readouterr().out
    assert precision.resolved_precision("float32") == "float32" and not capsys.readouterr().out


def test_a_start_refused_once_the_data_are_read_writes_nothing_and_the_corrected_rerun_runs(
        tiny_run, tmp_path, policy):
    """Weights that cannot be read are found after the data are listed: run.json and recipe.json
    are not written yet, so the corrected call is not refused as "a run with other settings"."""
    _, data_dir = tiny_run
    missing = str(tmp_path / "missing.safetensors")
    with pytest.raises(run.RunError, match="missing.safetensors") as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", weights=missing, image_size=32, val_fraction=0,
                     recipe=RECIPES["transfer"].replace(batch_size=8),
                     precision="float32", verbose=0)
    assert raised.value.argument == "weights"
    assert not (tmp_path / "run").exists()


# === The data checked before anything is built or written ===


def _refuse(monkeypatch, module, name):
    def refused(*args, **kwargs):
        raise AssertionError(f"{name} was reached before the mistake was refused")

    monkeypatch.setattr(module, name, refused)


@pytest.mark.parametrize("command", ["train", "finetune"])
@pytest.mark.parametrize("arguments, line", [
    # Before: 'no' is truthy, so fit_batch_to_data='no' lowered the batch and deterministic='no' turned
    # TensorFlow's deterministic ops on; cache='no' and crop_pct='1' were ArgumentErrors (no RunError),
    # cache's after run.json was written; output_dir='' wrote the run into the working folder.
    (dict(fit_batch_to_data="no"), "fit_batch_to_data='no': must be True (a batch larger than the data lowered to "
                                   "it), False or None (True without a recipe), not str"),
    (dict(deterministic="no"), "deterministic='no': must be True (TensorFlow's deterministic ops) or False, not str"),
    (dict(jit_compile="False"), "jit_compile='False': must be True (XLA) or False, not str"),
    (dict(cache="no"), "cache='no': must be True (the encoded images kept in memory after the first epoch) or "
                       "False, not str"),
    (dict(crop_pct="1"), "crop_pct='1': must be a number in (0, 1], not str; e.g. crop_pct=1.0 (CaiT) or "
                         "crop_pct=0.875 (DeiT)"),
    (dict(output_dir=""), "output_dir='': is empty, no folder's path; e.g. output_dir='runs/flowers', or '.' for "
                          "the working folder"),
])
def test_a_switch_or_folder_a_run_cannot_take_is_a_run_error_before_anything_is_read(
        tiny_run, tmp_path, monkeypatch, command, arguments, line):
    model_path, data_dir = tiny_run
    _refuse(monkeypatch, run_data, "open_data")
    monkeypatch.chdir(tmp_path)
    arguments = {"output_dir": tmp_path / "run", **arguments}
    with pytest.raises(run.RunError) as raised:
        if command == "train":
            run.train("XXS24", data_dir, image_size=32, verbose=0, **arguments)
        else:
            run.finetune(model_path, data_dir, verbose=0, **arguments)
    assert str(raised.value) == line
    assert sorted(os.listdir(tmp_path)) == ["digits", "pretrained.keras"]


def test_a_teacher_of_no_kind_a_run_takes_is_named_by_its_type(tiny_run, tmp_path, monkeypatch):
    """`teacher=5` was looked up in keras.applications and said to need the network."""
    model_path, data_dir = tiny_run
    _refuse(monkeypatch, run_data, "open_data")
    with pytest.raises(run.RunError) as raised:
        run.finetune(model_path, data_dir, tmp_path / "run", recipe=RECIPES["transfer"].replace(
            distillation_type="hard"), teacher=5, verbose=0)
    assert str(raised.value) == ("teacher=<int>: not a model, a .keras file or a keras.applications name, but of type "
                                 "int; e.g. teacher='ConvNeXtTiny' or teacher='teacher.keras'")
    assert not (tmp_path / "run").exists()


def test_train_given_a_saved_model_says_to_finetune_it(tiny_run, tmp_path, monkeypatch):
    """It said `weights=None: applies to a variant name; … leave weights out` (train has no weights), and of a
    model object `Object of type CaiTModel is not JSON serializable`."""
    model_path, data_dir = tiny_run
    _refuse(monkeypatch, run_data, "open_data")
    for model, shown in [(model_path, repr(model_path)), (keras.models.load_model(model_path), "<CaiTModel>")]:
        with pytest.raises(run.RunError) as raised:
            run.train(model, data_dir, tmp_path / "run", verbose=0)
        assert str(raised.value) == (
            f"model={shown}: train builds a CaiT from random weights: give a variant name or a dict of build_cait "
            "arguments; to train a saved model further, finetune it: run.finetune(model, data, output_dir)")
    assert not (tmp_path / "run").exists()


def test_val_data_with_val_fraction_is_refused_naming_both(tiny_run, tmp_path, monkeypatch):
    """A given val_fraction was ignored silently when val_data was given too."""
    model_path, data_dir = tiny_run
    _refuse(monkeypatch, run_data, "open_data")
    with pytest.raises(run.RunError) as raised:
        run.finetune(model_path, data_dir, tmp_path / "run", val_data=data_dir, val_fraction=0.2, verbose=0)
    assert str(raised.value) == (
        f"val_fraction=0.2: not with val_data={data_dir!r}, whose images validate: no part of data is held out; "
        "give one of them")
    assert (raised.value.argument, raised.value.usage) == ("val_fraction", True)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("classes", [range(3), [0, 2, 1, 3]], ids=["other_classes", "other_count"])
def test_val_data_of_other_classes_than_data_is_refused_before_anything_is_built(digits, tmp_path, monkeypatch,
                                                                                 classes):
    """Validation folders of other classes were scored against the training classes' indices (best.keras
    picked on that), silently; of another count the run failed in Keras after an epoch, files left."""
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(4))
    val_dir = digits(tmp_path / "held_out", per_class=1, size=8, classes=classes)
    if len(list(classes)) == 4:  # the same count, other names: 0, 1, 2, 3 -> a, b, c, d
        for index, name in enumerate("abcd"):
            os.rename(os.path.join(val_dir, str(index)), os.path.join(val_dir, name))
    _refuse(monkeypatch, run_models, "classifier")
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", weights=None, val_data=val_dir, verbose=0)
    validation = "a, b, c, d" if len(list(classes)) == 4 else "0, 1, 2"
    assert str(raised.value) == (f"val_data={val_dir!r}: has the classes {validation} but data="
                                 f"{os.path.abspath(data_dir)!r} has 0, 1, 2, 3; give validation images in class "
                                 "folders named as the training data's")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argument", ["data", "val_data"])
def test_a_file_given_for_a_data_folder_is_named_by_the_run_s_argument(tiny_run, tmp_path, monkeypatch, argument):
    """It was named `directory=`, image_folder's argument, which the caller never gave."""
    model_path, data_dir = tiny_run
    image = os.path.join(data_dir, "0", sorted(os.listdir(os.path.join(data_dir, "0")))[0])
    _refuse(monkeypatch, run_models, "classifier")
    folders = {"data": data_dir, "val_data": None, argument: image}
    with pytest.raises(run.RunError) as raised:
        run.finetune(model_path, folders["data"], tmp_path / "run", val_data=folders["val_data"], verbose=0)
    assert str(raised.value) == (f"{argument}={image!r}: is a file, not a folder; give the folder that holds one "
                                 "subfolder per class")


def test_a_class_of_one_image_is_refused_by_its_folder_when_a_fraction_is_held_out(digits, tmp_path, monkeypatch):
    """It used to end only in training or only in validation, silently."""
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    for name in os.listdir(os.path.join(data_dir, "2"))[1:]:
        os.remove(os.path.join(data_dir, "2", name))
    _refuse(monkeypatch, run_models, "classifier")
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", weights=None, precision="float32", verbose=0,
                     fit_batch_to_data=True)
    lonely = os.path.join(data_dir, "2")
    assert str(raised.value) == (
        f"data={data_dir!r}: the class folder {lonely!r} holds 1 image, but val_fraction=0.1 holds a part of each "
        "class out for validation, and 1 image cannot be both trained on and validated: each class needs at least "
        "2 images; add images, or give val_fraction=0 (no validation) or val_data=FOLDER (validation images of "
        "their own)")
    assert raised.value.argument == "data" and not (tmp_path / "run").exists()


def _bad_images(data_dir):
    """A text file named .jpg and a JPEG cut in half, in two classes of `data_dir`."""
    from PIL import Image

    with open(os.path.join(data_dir, "0", "notes.jpg"), "w") as file:
        file.write("not an image")
    cut = os.path.join(data_dir, "1", "cut.jpg")
    Image.new("RGB", (64, 48), (200, 30, 60)).save(cut, format="JPEG", quality=90)
    with open(cut, "rb") as file:
        data = file.read()
    with open(cut, "wb") as file:
        file.write(data[: len(data) // 2])
    return [os.path.join(data_dir, "0", "notes.jpg"), cut]


@pytest.mark.parametrize("command", ["finetune", "train", "evaluate"])
def test_undecodable_images_are_named_all_at_once_before_a_model_is_built_or_a_file_written(
        command, digits, tmp_path, monkeypatch, policy):
    """They used to be found only when training reached them (stage 2, perhaps), run.json written."""
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    notes, cut = _bad_images(data_dir)
    for name in ("classifier", "new_model", "load"):
        _refuse(monkeypatch, run_models, name)
    arguments = dict(verbose=0, precision="float32")
    with pytest.raises(run.RunError) as raised:
        if command == "evaluate":
            run.evaluate("XXS24", data_dir, **arguments)
        else:
            getattr(run, command)("XXS24", data_dir, tmp_path / "run", fit_batch_to_data=True, **arguments)
    assert str(raised.value) == (
        f"data={data_dir!r}: 2 files cannot be decoded as images (JPEG, PNG, GIF, BMP or WebP): {notes} (not an "
        f"image file), {cut} (invalid JPEG data (a truncated or damaged file)); remove or replace them")
    assert raised.value.argument == "data" and not (tmp_path / "run").exists()


def test_the_validation_data_s_images_are_named_with_the_training_data_s(digits, tmp_path, monkeypatch, policy):
    train = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    validation = digits(tmp_path / "val", per_class=2, size=8, classes=range(3))
    notes, _ = _bad_images(validation)
    _refuse(monkeypatch, run_models, "classifier")
    with pytest.raises(run.RunError, match=rf"^val_data={validation!r}: 2 files cannot be decoded") as raised:
        run.finetune("XXS24", train, tmp_path / "run", val_data=validation, verbose=0, precision="float32",
                     fit_batch_to_data=True)
    assert raised.value.argument == "val_data" and notes in str(raised.value)


def test_files_of_other_formats_in_a_class_folder_are_said_once_by_name(digits, tmp_path, monkeypatch, capsys):
    """They used to be skipped silently (a .webp too, which is now read)."""
    from PIL import Image

    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    Image.new("RGB", (8, 8)).save(os.path.join(data_dir, "0", "scan.tiff"))
    Image.new("RGB", (8, 8)).save(os.path.join(data_dir, "1", "photo.webp"))
    # Images beside the class folders (Keras and torchvision leave them out without a word); other files there
    # (a README, a labels file) are no images and go unsaid.
    Image.new("RGB", (8, 8)).save(os.path.join(data_dir, "stray.jpg"))
    (tmp_path / "photos" / "README.txt").write_text("my photos")
    _refuse(monkeypatch, run_models, "load")
    with pytest.raises(AssertionError, match="load was reached"):
        run.evaluate("XXS24", data_dir, verbose=0)
    said = [line for line in capsys.readouterr().out.splitlines() if "not read" in line]
    assert said == [f"data={data_dir!r}: 1 file is not read, for an extension other than .jpg, .jpeg, .png, .gif, "
                    f".bmp, .webp (JPEG, PNG, GIF, BMP or WebP): {os.path.join(data_dir, '0', 'scan.tiff')}. Convert "
                    "them to one of those formats to use them, or move them out of the class folders.",
                    f"data={data_dir!r}: 1 image is not read, being in no class folder: "
                    f"{os.path.join(data_dir, 'stray.jpg')}. Move them into the folder of their class to use them."]
    # The command line's words: its flag (it said data='photos' too)
    from keras_cait.cli.errors import flag_name
    from keras_cait.errors import speaking
    from keras_cait.training import run_data

    with speaking(flag_name):
        run_data.open_source("data", data_dir, None, None)
    said = [line for line in capsys.readouterr().out.splitlines() if "not read" in line]
    assert [line.split(":")[0] for line in said] == [f"--data {data_dir}"] * 2


# === A Python user's mistakes: one RunError naming the argument, its value and what is allowed ===


def _refuse_models(monkeypatch):
    for name in ("classifier", "new_model", "load"):
        _refuse(monkeypatch, run_models, name)


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_a_run_given_no_recipe_lowers_its_batch_to_a_small_folder_and_a_recipe_given_keeps_its_own(
        command, digits, tmp_path, monkeypatch, capsys):
    """As the command does when --batch-size is not typed: a notebook's first run on 9 images trains."""
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _refuse_models(monkeypatch)
    arguments = dict(weights=None, val_fraction=0) if command == "finetune" else {}
    recipe = RECIPES["scratch"] if command == "finetune" else RECIPES["deit"]
    with pytest.raises(AssertionError, match="was reached"):
        getattr(run, command)("XXS24", data_dir, tmp_path / "run", verbose=0, **arguments)
    assert (f"Batch {recipe.batch_size} per replica is more than the 9 training images fill: batch 9 instead"
            in capsys.readouterr().out)
    with pytest.raises(run.RunError) as raised:
        getattr(run, command)("XXS24", data_dir, tmp_path / "again", recipe=recipe, verbose=0, **arguments)
    # In Python's words: the batch is the recipe's, and the run's own argument lowers it.
    assert str(raised.value) == (
        f"recipe.batch_size={recipe.batch_size}: the global batch of {recipe.batch_size} is larger than the 9 "
        f"training images of {os.fspath(data_dir)!r}; give recipe.batch_size=9 or less, or more images, or "
        f"fit_batch_to_data=True to have it lowered")
    assert not (tmp_path / "again").exists()
    with pytest.raises(AssertionError, match="was reached"):  # the advice followed: the run goes on
        getattr(run, command)("XXS24", data_dir, tmp_path / "fitted", recipe=recipe, verbose=0,
                              fit_batch_to_data=True, **arguments)


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_a_recipe_is_given_as_a_recipe_or_its_name_and_anything_else_is_refused_naming_the_names(
        command, digits, tmp_path, monkeypatch):
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _refuse_models(monkeypatch)
    arguments = dict(weights=None, val_fraction=0) if command == "finetune" else {}
    for name in ("scratch", "deit"):  # by name: RECIPES[name] itself, its batch (32, 64) kept as a recipe given
        batch = RECIPES[name].batch_size
        with pytest.raises(run.RunError, match=f"recipe.batch_size={batch}: the global batch of {batch} is larger"):
            getattr(run, command)("XXS24", data_dir, tmp_path / name, recipe=name, verbose=0, **arguments)
    for wrong, problem in (("deitt", "no recipe of that name"), (42, "neither a Recipe nor a recipe's name")):
        with pytest.raises(run.RunError) as raised:
            getattr(run, command)("XXS24", data_dir, tmp_path / "wrong", recipe=wrong, verbose=0, **arguments)
        assert str(raised.value) == (
            f"recipe={wrong!r}: {problem}; give a name of RECIPES ('deit', 'deit-highres', 'transfer', 'scratch') or "
            "a Recipe, e.g. RECIPES['deit'].replace(epochs=30)")
        assert raised.value.usage and not (tmp_path / "wrong").exists()


@pytest.mark.parametrize("command, argument, value, problem", [
    ("train", "seed", "a", "must be an integer of at least 0, not str; e.g. seed=0"),
    ("train", "seed", None, "must be an integer of at least 0, not NoneType; e.g. seed=0"),
    ("train", "backup_every", True, "must be an integer of at least 1, not bool; e.g. backup_every=1000"),
    ("train", "backup_every", 0, "must be an integer of at least 1; e.g. backup_every=1000"),
    ("train", "shuffle_buffer", 0, "must be an integer of at least 1; e.g. shuffle_buffer=10000"),
    ("finetune", "lora_rank", -1, "must be an integer of at least 0; e.g. lora_rank=8"),
    ("finetune", "backup_every", 2.5, "must be an integer of at least 1, not float; e.g. backup_every=1000"),
    ("evaluate", "batch_size", 0, "must be an integer of at least 1; e.g. batch_size=64"),
])
def test_a_count_that_cannot_work_is_refused_naming_it_before_anything_is_read_or_written(
        command, argument, value, problem, digits, tmp_path, monkeypatch):
    """They reached Python as numpy's TypeError (seed), Keras' save_freq=0 after the run's folder was
    made (backup_every), lora's rank=-1, and TensorFlow's 'Batch size must be greater than zero'."""
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _refuse(monkeypatch, run_data, "open_data")
    _refuse(monkeypatch, run_data, "open_source")
    where = () if command == "evaluate" else (tmp_path / "run",)
    with pytest.raises(run.RunError) as raised:
        getattr(run, command)("XXS24", data_dir, *where, **{argument: value})
    assert str(raised.value) == f"{argument}={value!r}: {problem}"
    assert raised.value.usage and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_a_folder_of_one_class_is_refused(command, digits, tmp_path, monkeypatch):
    """It used to train for minutes and report 100 % validation accuracy."""
    data_dir = digits(tmp_path / "photos", per_class=4, size=8, classes=range(1))
    _refuse_models(monkeypatch)
    with pytest.raises(run.RunError) as raised:
        getattr(run, command)("XXS24", data_dir, tmp_path / "run", verbose=0, precision="float32",
                              fit_batch_to_data=True)
    assert (raised.value.argument, raised.value.value) == ("data", data_dir)
    assert str(raised.value) == (
        f"data={data_dir!r}: the folder {data_dir!r} holds 1 class (0): a classifier of one class has nothing to "
        "tell apart (it would score 100 %); give a folder with a subfolder of images for each of 2 or more classes")
    assert not (tmp_path / "run").exists()


def test_class_names_given_with_a_folder_are_checked_not_put_aside(tiny_run, tmp_path, monkeypatch):
    """They used to be ignored, and written to run.json."""
    _, data_dir = tiny_run
    _refuse_models(monkeypatch)
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", class_names=["cat", "dog"], verbose=0, precision="float32")
    assert (raised.value.argument, raised.value.value, raised.value.usage) == ("class_names", ["cat", "dog"], True)
    assert str(raised.value).startswith(f"class_names=['cat', 'dog']: the folder {data_dir!r} has the classes 0, 1,")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "finetune", "evaluate"])
@pytest.mark.parametrize("image_size, line", [
    (200, "image_size=200: must be a multiple of the patch size 16; e.g. image_size=208"),
    ("224", "image_size='224': must be a positive integer multiple of the patch size 16, an int, not str; "
            "e.g. image_size=224"),
])
def test_an_image_size_that_cannot_work_is_blamed_on_image_size(command, image_size, line, tiny_run, tmp_path,
                                                                  monkeypatch):
    """200 used to be blamed on `weights=None: input_shape (200, 200, 3) ...`, "224" on `weights=None:
    Cannot convert ... to a shape`."""
    _, data_dir = tiny_run
    _refuse_models(monkeypatch)
    _refuse(monkeypatch, run_data.sources, "source")  # refused before the data are read
    with pytest.raises(run.RunError) as raised:
        if command == "evaluate":
            run.evaluate("XXS24", data_dir, image_size=image_size, verbose=0)
        else:
            getattr(run, command)("XXS24", data_dir, tmp_path / "run", image_size=image_size, verbose=0)
    assert (raised.value.argument, raised.value.value, raised.value.usage) == ("image_size", image_size, True)
    assert str(raised.value) == line


@pytest.mark.parametrize("val_fraction, line", [
    (1.5, "val_fraction=1.5: must be at least 0 and below 1: the part of data held out for validation; e.g. "
          "val_fraction=0.1 (0: no validation)"),
    ("0.1", "val_fraction='0.1': must be a number, not str; e.g. val_fraction=0.1 (0: no validation)"),
])
def test_a_val_fraction_out_of_range_is_named_once(val_fraction, line, tiny_run, tmp_path, monkeypatch):
    """It used to read `val_fraction=1.5: fraction=1.5: ...`."""
    _, data_dir = tiny_run
    _refuse(monkeypatch, run_data.sources, "source")
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", val_fraction=val_fraction, verbose=0)
    assert (raised.value.argument, raised.value.value) == ("val_fraction", val_fraction)
    assert str(raised.value) == line


def test_missing_weights_are_named_once(tiny_run, tmp_path):
    """It used to read `weights='x': weights='x': no such file`."""
    _, data_dir = tiny_run
    missing = str(tmp_path / "missing.safetensors")
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", weights=missing, image_size=32, val_fraction=0,
                     recipe=RECIPES["transfer"].replace(batch_size=8), precision="float32", verbose=0)
    assert (raised.value.argument, raised.value.value) == ("weights", missing)
    from keras_cait.errors import spoken
    from keras_cait.models.variants import weights_allowed

    assert str(raised.value) == f"weights={missing!r}: no such file; {spoken(weights_allowed())}"


def test_epochs_as_a_string_is_refused_naming_epochs(tiny_run, tmp_path):
    """It used to be `must be real number, not str`, naming no knob."""
    _, data_dir = tiny_run
    with pytest.raises(ValueError) as raised:
        run.finetune("XXS24", data_dir, tmp_path / "run", recipe=RECIPES["transfer"].replace(epochs="3"), verbose=0)
    assert (raised.value.argument, raised.value.value) == ("epochs", "3")
    assert str(raised.value) == "epochs='3': must be an integer, not str '3'; e.g. epochs=10"


@pytest.mark.large
def test_a_keras_model_that_is_not_a_cait_is_not_evaluated(digits, tmp_path, policy):
    """A MobileNet of the data's 2 classes used to be evaluated without a word."""
    data_dir = digits(tmp_path / "photos", per_class=2, size=32, classes=range(2))
    path = str(tmp_path / "mobilenet.keras")
    keras.applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=2).save(path)
    with pytest.raises(run.RunError) as raised:
        run.evaluate(path, data_dir, verbose=0)
    assert (raised.value.argument, raised.value.value) == ("model", path)
    assert str(raised.value).startswith(f"model={path!r}: holds 'mobilenet_1.00_32', not a CaiT")


def test_evaluate_s_top5_counts_the_five_highest_scores_not_the_highest(tiny_cait, digits, tmp_path):
    """A head whose scores rank the classes the same for every image (zero kernel, distinct biases):
    of 7 classes, 1 image each, the best-ranked class is right once (top-1 1/7) and the five
    best-ranked five times (top-5 5/7); a top-5 computed as top-1, or over other k, fails."""
    data_dir = digits(tmp_path / "digits", per_class=1, classes=range(7))
    model = tiny_cait(classes=7)
    head = model.get_layer("predictions")
    kernel, bias = head.get_weights()
    ranking = np.random.default_rng(0).permutation(7).astype("float32")
    head.set_weights([np.zeros_like(kernel), ranking])

    summary = run.evaluate(model, data_dir, verbose=0).summary

    assert summary["images"] == 7
    np.testing.assert_allclose(summary["top1"], 1 / 7, atol=1e-6)
    np.testing.assert_allclose(summary["top5"], 5 / 7, atol=1e-6)


@pytest.mark.parametrize("call, message", [
    (dict(data="missing"), "data='{tmp}/missing': "),
    (dict(model="XXS25"), "model='XXS25': "),
    (dict(image_size="32"), "image_size='32': "),
])
def test_a_run_error_is_one_traceback_with_its_message_once(call, message, digits, tmp_path):
    """A notebook shows the chain of an exception: a RunError rewriting the library's own error shows
    that error's text once, not twice (the rewritten error is kept as `cause`)."""
    import traceback

    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    arguments = dict(model="XXS24", data=data_dir, image_size=32, weights=None, verbose=0)
    arguments.update({key: (tmp_path / value if key == "data" else value) for key, value in call.items()})
    model, data = arguments.pop("model"), arguments.pop("data")
    with pytest.raises(run.RunError) as raised:
        run.finetune(model, data, tmp_path / "run", **arguments)
    error = raised.value
    shown = "".join(traceback.format_exception(error))
    assert str(error).startswith(message.format(tmp=tmp_path))
    assert shown.count(str(error).split(": ", 1)[1][:40]) == 1, shown
    assert "direct cause" not in shown and "During handling" not in shown
    assert error.cause is not None and error.__cause__ is None
    assert not (tmp_path / "run").exists()



@pytest.mark.large
def test_a_run_at_verbose_0_says_nothing_and_at_2_says_its_lines(tiny_run, tmp_path, policy, capsys):
    model_path, data_dir = tiny_run
    recipe = RECIPES["transfer"].replace(batch_size=10, head_epochs=1, epochs=1)
    for verbose in (0, 2):
        run.finetune(model_path, data_dir, tmp_path / f"run{verbose}", recipe=recipe, val_fraction=0, verbose=verbose)
        said = capsys.readouterr().out
        if verbose == 0:
            assert said == ""
        else:  # the precision it chose, its plan, its stages, an epoch's line
            assert "Precision " in said and "global batch 10" in said and "Stage 2 of 2" in said, said
            assert "loss:" in said


@pytest.mark.parametrize("model, words", [
    ("XXS25", "model='XXS25': unknown CaiT model"),
    ("{tmp}/missing.keras", "model='{tmp}/missing.keras': no such file"),
    ("{tmp}/done", "model='{tmp}/done': is a folder; give a .keras model in it, e.g. model='{tmp}/done/best.keras'"),
])
def test_a_run_checks_its_model_first_and_says_nothing_before(model, words, digits, tmp_path, capsys):
    """Before its data are read and before any line (the recipe and precision it chose): a wrong
    `model` is the first thing said, even beside `weights=None` (which a .keras file refuses)."""
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "best.keras").write_bytes(b"")
    with pytest.raises(run.RunError) as raised:
        run.finetune(model.format(tmp=tmp_path), data_dir, tmp_path / "run", weights=None, precision="auto")
    assert str(raised.value).startswith(words.format(tmp=tmp_path))
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "finetune"])
@pytest.mark.parametrize("refusal", ["missing data", "strategy", "another run's folder"])
def test_a_run_refused_after_its_checks_says_no_choice_before(command, refusal, digits, tmp_path, capsys):
    """The precision "auto" chose (and the scratch recipe finetune chose for random weights) was said,
    then the run was refused: a choice announced for a run that never ran."""
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    output_dir = tmp_path / "run"
    options = dict(precision="auto", **({"weights": None} if command == "finetune" else {}))
    if refusal == "missing data":
        data_dir = tmp_path / "missing"
    elif refusal == "strategy":
        options["strategy"] = "mirror"
    else:
        output_dir.mkdir()
        (output_dir / "run.json").write_text(json.dumps({"command": "evaluate", "settings": {}, "finished": []}))
        (output_dir / "backup").mkdir()
    with pytest.raises((run.RunError, run.resume.BackupError)):
        getattr(run, command)("XXS24", data_dir, output_dir, **options)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("command", ["train", "finetune", "evaluate"])
def test_a_tfds_dir_for_data_of_no_tfds_split_is_refused_naming_it(command, digits, tmp_path, capsys, monkeypatch):
    """It was ignored without a word."""
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    _refuse_models(monkeypatch)
    arguments = ("XXS24", data_dir) if command == "evaluate" else ("XXS24", data_dir, tmp_path / "run")
    with pytest.raises(run.RunError) as raised:
        getattr(run, command)(*arguments, tfds_dir=str(tmp_path / "tfds"), weights=None) if command != "train" else \
            run.train(*arguments, tfds_dir=str(tmp_path / "tfds"))
    assert str(raised.value) == (f"tfds_dir={str(tmp_path / 'tfds')!r}: applies to TensorFlow Datasets' splits "
                                 "(data='tfds:NAME:SPLIT'), and the run reads none; leave tfds_dir out")
    assert capsys.readouterr().out == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_a_run_that_goes_on_says_the_precision_auto_chose_before_it_builds_a_model(command, digits, tmp_path,
                                                                                  monkeypatch, capsys):
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    _refuse_models(monkeypatch)
    with pytest.raises(AssertionError, match="was reached"):
        getattr(run, command)("XXS24", data_dir, tmp_path / "run", precision="auto", verbose=2,
                              **({"weights": None} if command == "finetune" else {}))
    said = capsys.readouterr().out
    assert f"Precision {run.default_precision()[0]} (" in said, said
    if command == "finetune":
        assert said.index("weights=None: random weights") < said.index("Precision ")


@pytest.mark.parametrize("verbose", ["yes", 5, -1, True])
def test_a_run_refuses_a_verbose_keras_does_not_take(verbose, tmp_path):
    with pytest.raises(run.RunError) as raised:
        run.evaluate("XXS24", tmp_path, weights=None, verbose=verbose)
    assert str(raised.value).startswith(f"verbose={verbose!r}: must be 0 (silent), 1 (a progress bar), 2 (a line "
                                        "per epoch) or 'auto'")



def test_the_scratch_recipe_chosen_is_said_once_in_python_s_words(digits, tmp_path, monkeypatch, capsys):
    data_dir = digits(tmp_path / "photos", per_class=3, size=8, classes=range(3))
    _refuse_models(monkeypatch)
    with pytest.raises(AssertionError, match="was reached"):
        run.finetune("XXS24", data_dir, tmp_path / "run", weights=None, val_fraction=0, verbose=1)
    line = ("weights=None: random weights, so the run trains with recipe=RECIPES['scratch'], the recipe that learns "
            "from them on a small folder (recipe=RECIPES['transfer'] fine-tunes pretrained ones; give recipe to "
            "choose another).\n")
    assert capsys.readouterr().out.count(line) == 1



@pytest.mark.parametrize("data", [
    lambda: __import__("tensorflow").data.Dataset.range(3),
    lambda: (np.zeros((2, 8, 8, 3)), np.zeros(2)),
    lambda: None,
])
@pytest.mark.parametrize("command", ["train", "finetune", "evaluate"])
def test_data_a_run_cannot_read_is_refused_first_saying_model_fit_takes_it(command, data, tmp_path, capsys):
    data = data()
    kind = type(data).__name__
    with pytest.raises(run.RunError) as raised:
        if command == "train":
            run.train("XXS24", data, tmp_path / "run")
        elif command == "finetune":
            run.finetune("XXS24", data, tmp_path / "run", weights=None)
        else:
            run.evaluate("XXS24", data, weights=None)
    assert str(raised.value).startswith(f"data=<{kind}>: a run reads images from files, not from a {kind}; ")
    assert "model.fit" in str(raised.value) and raised.value.argument == "data"
    assert capsys.readouterr().out == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["file", "inside"])
def test_an_output_dir_that_is_a_file_is_refused_first_naming_it(where, digits, tmp_path, capsys):
    data_dir = digits(tmp_path / "photos", per_class=2, size=8, classes=range(2))
    afile = tmp_path / "single.png"
    afile.write_bytes(b"x")
    output_dir = afile if where == "file" else afile / "run"
    with pytest.raises(run.RunError) as raised:
        run.finetune("XXS24", data_dir, output_dir, weights=None)
    problem = "is a file" if where == "file" else f"is inside the file {afile}"
    assert str(raised.value) == f"output_dir={str(output_dir)!r}: {problem}, not a folder; choose another folder"
    assert capsys.readouterr().out == "" and afile.read_bytes() == b"x"


@pytest.mark.parametrize("command, default", [("train", "deit"), ("finetune", "transfer")])
def test_a_recipe_s_knob_typed_as_an_argument_says_where_it_goes(command, default, tmp_path):
    """The command line takes --epochs; from Python the knob is the recipe's."""
    with pytest.raises(TypeError) as raised:
        getattr(run, command)("XXS24", tmp_path, tmp_path / "run", epochs=1)
    assert str(raised.value) == (f"{command}() got an unexpected keyword argument 'epochs': epochs is a knob of the "
                                 f"recipe; give recipe=RECIPES[{default!r}].replace(epochs=1), or another recipe with it")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'epocs'$") as raised:  # not a knob: Python's
        getattr(run, command)("XXS24", tmp_path, tmp_path / "run", epocs=1)
    # Python's own error alone: not chained to the same TypeError of the verbose check's bind
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert not (tmp_path / "run").exists()
