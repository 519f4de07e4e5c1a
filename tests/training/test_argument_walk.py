"""Bad arguments of the augmentation, mixing, callback and LoRA entry points, as a notebook gives them:
each refused as an ArgumentError naming the argument at fault, with a value that fits."""

import numpy as np
import pytest

from keras_cait.errors import ArgumentError
from keras_cait.training import Augmentation, augment
from keras_cait.training.callbacks import BestModelCheckpoint, MovingAverageFile, run_callbacks
from keras_cait.training.mixup_cutmix import MixupCutmix


def _refused(call, argument, line):
    with pytest.raises(ArgumentError, match=line) as caught:
        call()
    assert caught.value.argument == argument
    assert caught.value.usage
    return caught.value


@pytest.mark.parametrize("flip", ["no", "False", None, 0.5])
def test_augmentation_refuses_a_horizontal_flip_that_is_no_bool(flip):
    """'no' from a config is truthy: it used to be taken, and half of the images were flipped."""
    _refused(lambda: Augmentation(32, 10, horizontal_flip=flip), "horizontal_flip",
             r"^horizontal_flip=.*: must be True \(flip half of the images\) or False, not \w+$")


def test_augmentation_takes_bools_numpy_bools_and_0_1_for_horizontal_flip():
    assert Augmentation(32, 10, horizontal_flip=np.bool_(False)).horizontal_flip is False
    assert Augmentation(32, 10, horizontal_flip=1).horizontal_flip is True


@pytest.mark.parametrize("name, value, example", [
    ("scale", 0.5, r"scale=\(0\.08, 1\.0\)"),  # a TypeError ('float' object is not subscriptable) in crop()
    ("scale", (1.0, 0.08), r"scale=\(0\.08, 1\.0\)"),  # taken, refused only as the stream started
    ("scale", ("0.08", "1"), r"scale=\(0\.08, 1\.0\)"),
    ("ratio", (0, 1), r"ratio=\(3/4, 4/3\)"),
    ("ratio", (0.75, float("inf")), r"ratio=\(3/4, 4/3\)"),
])
def test_augmentation_refuses_a_scale_or_ratio_that_is_no_ordered_pair(name, value, example):
    bounds = r"0 < min <= max <= 1" if name == "scale" else r"0 < min <= max"
    _refused(lambda: Augmentation(32, 10, **{name: value}), name,
             rf"^{name}=.*: must be a pair \(min, max\) of numbers with {bounds}; e\.g\. {example}$")


def test_augmentation_refuses_an_infinite_alpha():
    _refused(lambda: Augmentation(32, 10, mixup_alpha=float("inf")), "mixup_alpha",
             r"^mixup_alpha=inf: must be a number of at least 0; e\.g\. mixup_alpha=0\.8$")


@pytest.mark.parametrize("magnitude, line", [
    ("9", r"^magnitude='9': must be a number in \[0, 10\] as timm's, not str; e\.g\. magnitude=9$"),
    (11, r"^magnitude=11: must be a number in \[0, 10\] as timm's; e\.g\. magnitude=9$"),
])
def test_rand_augment_refuses_a_magnitude_naming_it(magnitude, line):
    """'9' used to fail on `<=` with a bare TypeError."""
    _refused(lambda: augment.rand_augment(magnitude), "magnitude", line)


def test_rand_augment_takes_a_numpy_float_magnitude():
    """np.float32(9) used to be refused by Keras: `factor=0.07500000298023224` must be a number in [0, 1]."""
    layer = augment.rand_augment(np.float32(9), num_ops=np.int64(2))
    assert layer.num_ops == 2 and type(layer.num_ops) is int


@pytest.mark.parametrize("num_ops, kind", [(2.5, ", not float"), (-1, ""), ("2", ", not str")])
def test_rand_augment_refuses_a_num_ops_that_is_no_count(num_ops, kind):
    """All three used to be taken (2.5 failing inside tf.data, -1 applying nothing)."""
    _refused(lambda: augment.rand_augment(9, num_ops=num_ops), "num_ops",
             rf"^num_ops=.*: must be a non-negative integer{kind}; e\.g\. num_ops=2$")


@pytest.mark.parametrize("probability, kind", [("0.25", ", not str"), (True, ", not bool"), (-0.1, "")])
def test_random_erasing_refuses_a_probability_naming_it(probability, kind):
    """'0.25' used to fail on `<=` with a bare TypeError; True was taken as 1 (every image erased)."""
    _refused(lambda: augment.random_erasing(probability), "probability",
             rf"^probability=.*: must be a number in \[0, 1\]{kind}; e\.g\. probability=0\.25$")


@pytest.mark.parametrize("arguments, argument, line", [
    # 10.7 used to be cut to 10 classes; 0 made NaN labels (smoothing / 0); '10' was taken.
    (dict(num_classes=10.7), "num_classes", r"^num_classes=10\.7: must be a positive integer, not float; "
                                            r"e\.g\. num_classes=10$"),
    (dict(num_classes=0), "num_classes", r"^num_classes=0: must be a positive integer; e\.g\. num_classes=10$"),
    (dict(num_classes="10"), "num_classes", r"^num_classes='10': must be a positive integer, not str"),
    # NaN and inf used to be taken; '0.8' failed on `<` with a bare TypeError.
    (dict(mixup_alpha=float("nan")), "mixup_alpha",
     r"^mixup_alpha=nan: must be a number of at least 0 \(0 disables it\); e\.g\. mixup_alpha=0\.8$"),
    (dict(cutmix_alpha=float("inf")), "cutmix_alpha", r"^cutmix_alpha=inf: must be a number of at least 0"),
    (dict(mixup_alpha="0.8"), "mixup_alpha", r"^mixup_alpha='0\.8': must be a number of at least 0 "
                                             r"\(0 disables it\), not str; e\.g\. mixup_alpha=0\.8$"),
    # Both used to be named together, whichever was at fault; None failed on `<=`.
    (dict(label_smoothing=1.5), "label_smoothing",
     r"^label_smoothing=1\.5: must be a number in \[0, 1\); e\.g\. label_smoothing=0\.1$"),
    (dict(label_smoothing=None), "label_smoothing", r"^label_smoothing=None: must be a number in \[0, 1\), not"),
    (dict(switch_prob=float("nan")), "switch_prob",
     r"^switch_prob=nan: must be a number in \[0, 1\]; e\.g\. switch_prob=0\.5$"),
])
def test_mixup_cutmix_refuses_each_argument_by_its_name(arguments, argument, line):
    _refused(lambda: MixupCutmix(**{"num_classes": 10, **arguments}), argument, line)


def test_mixup_cutmix_takes_numpy_numbers():
    mix = MixupCutmix(np.int64(10), mixup_alpha=np.float32(0.8), switch_prob=np.float64(0.5))
    assert (mix.num_classes, type(mix.num_classes), mix.switch_prob) == (10, int, 0.5)


@pytest.mark.parametrize("make", [BestModelCheckpoint, MovingAverageFile])
@pytest.mark.parametrize("filepath", ["best.h5", None])
def test_the_callbacks_refuse_a_filepath_that_is_no_keras_file_when_made(make, filepath):
    """'best.h5' used to be refused by save_model only after the first epoch (or the whole training)."""
    _refused(lambda: make(filepath), "filepath",
             r"^filepath=.*: must be the path of a \.keras file; e\.g\. filepath='(best|ema)\.keras'$")


def test_best_model_checkpoint_refuses_a_mode_or_monitor_naming_it(tmp_path):
    path = tmp_path / "best.keras"
    _refused(lambda: BestModelCheckpoint(path, mode="MAX"), "mode",
             r"^mode='MAX': must be 'min' \(a loss\) or 'max' \(an accuracy\); e\.g\. mode='max'$")
    # None used to be taken, and refused as a KeyError at the end of the first epoch.
    line = (r"^monitor=None: must be the name of a metric in the epoch's logs; "
            r"e\.g\. monitor='val_accuracy' or monitor='val_loss'$")
    _refused(lambda: BestModelCheckpoint(path, monitor=None), "monitor", line)
    # run_callbacks: an AttributeError ('NoneType' object has no attribute 'endswith').
    _refused(lambda: run_callbacks(tmp_path, tmp_path / "backup", 100, monitor=None), "monitor", line)


@pytest.mark.parametrize("backup_every, kind", [(0, ""), (2.5, ", not float"), ("100", ", not str")])
def test_run_callbacks_name_backup_every_not_the_backup_s_save_freq(tmp_path, backup_every, kind):
    """`run_callbacks(backup_every=0)` used to be refused by the ResumableBackup it makes, as `save_freq=0`."""
    from keras_cait.errors import ArgumentError
    from keras_cait.training.callbacks import run_callbacks
    from keras_cait.training.resume import ResumableBackup

    with pytest.raises(ArgumentError, match=rf"^backup_every={backup_every!r}: must be a positive integer{kind}; "
                       r"e\.g\. backup_every=1000$"):
        run_callbacks(str(tmp_path / "run"), str(tmp_path / "backup"), backup_every)
    with pytest.raises(ArgumentError, match=r"^save_freq=0: must be a positive integer, the steps between backups; "
                       r"e\.g\. save_freq=500$"):
        ResumableBackup(str(tmp_path / "backup"), save_freq=0)
    assert ResumableBackup(str(tmp_path / "backup"), save_freq=np.int64(3)).save_freq == 3
