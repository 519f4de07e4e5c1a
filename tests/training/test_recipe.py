"""keras_cait.training.recipe: one object holds every knob, and builds what a run trains with."""

import dataclasses
import json
import os
import re

import keras
import numpy as np
import pytest

from keras_cait.models.architecture import build_cait
from keras_cait.training import Augmentation, adamw, resume, schedule
from keras_cait.cli.errors import flag_name
from keras_cait.errors import ArgumentError, spoken
from keras_cait.training.knobs import knobs
from keras_cait.training.recipe import DEIT, RECIPES, KnobError, Recipe
from keras_cait.training.resume import BackupError, RunRecord
from tests.conftest import TINY_CAIT


def test_library_defaults_are_deits_recipe():
    """A default changes in recipe.py alone: the optimizer, schedule and augmentation read it."""
    augmentation = Augmentation(224, 10)
    assert (augmentation.rand_augment_magnitude, augmentation.random_erasing, augmentation.mixup_alpha,
            augmentation.cutmix_alpha, augmentation.switch_prob, augmentation.label_smoothing,
            augmentation.repeats) == (DEIT.randaugment, DEIT.reprob, DEIT.mixup, DEIT.cutmix,
                                      DEIT.mixup_switch_prob, DEIT.smoothing, DEIT.repeated_aug)
    assert augmentation == DEIT.augmentation(224, 10)
    model = build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=3)
    optimizer = adamw(model, 1e-3)
    assert (optimizer.weight_decay, optimizer.epsilon, (optimizer.beta_1, optimizer.beta_2)) == (
        DEIT.weight_decay, DEIT.opt_eps, DEIT.opt_betas)
    assert schedule.scaled_learning_rate(DEIT.lr_batch) == DEIT.lr
    epoch_cosine = schedule.EpochCosine(1.0, 10, 3)
    assert (epoch_cosine.warmup_epochs, epoch_cosine.warmup_start, epoch_cosine.minimum) == (
        DEIT.warmup_epochs, DEIT.warmup_lr, DEIT.min_lr)


@pytest.mark.parametrize("name", RECIPES)
def test_the_optimizer_a_recipe_builds_has_every_knob(name):
    rng = np.random.default_rng(len(name))
    recipe = RECIPES[name].replace(weight_decay=float(rng.uniform(0, 0.1)), opt_eps=float(rng.uniform(1e-9, 1e-7)),
                                   opt_betas=(float(rng.uniform(0.8, 0.9)), float(rng.uniform(0.95, 0.999))),
                                   clip_grad=float(rng.uniform(0.5, 2)), model_ema=bool(rng.integers(2)),
                                   model_ema_decay=float(rng.uniform(0.9, 0.999)), epochs=12, head_epochs=2)
    model = build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=3)
    global_batch, steps = int(rng.integers(8, 100)), 7
    optimizer = recipe.optimizer(model, global_batch, steps)
    assert (optimizer.weight_decay, optimizer.epsilon, optimizer.beta_1, optimizer.beta_2, optimizer.global_clipnorm,
            optimizer.use_ema) == (recipe.weight_decay, recipe.opt_eps, *recipe.opt_betas, recipe.clip_grad,
                                   recipe.model_ema)
    if recipe.model_ema:
        assert optimizer.ema_momentum == recipe.model_ema_decay
    peak = recipe.lr * global_batch / recipe.lr_batch
    assert recipe.peak_lr(global_batch) == pytest.approx(peak)
    # The schedule is the building block the recipe names, with the recipe's values.
    minimum = min(recipe.min_lr, peak)
    if recipe.sched == "epoch":
        expected = schedule.EpochCosine(peak, recipe.epochs, steps, recipe.warmup_epochs, recipe.warmup_lr, minimum)
    else:
        expected = schedule.warmup_cosine(peak, recipe.epochs * steps, round(recipe.warmup_epochs * steps),
                                          recipe.warmup_lr, minimum)
    every_step = range(recipe.epochs * steps + 2)
    assert [float(recipe.learning_rate(
        global_batch, steps)(step)) for step in every_step] == pytest.approx(
        [float(expected(step)) for step in every_step], rel=1e-6)
    assert float(optimizer._learning_rate(0)) == pytest.approx(float(expected(0)), rel=1e-6)
    head = recipe.learning_rate(global_batch, steps, head=True)
    assert float(head(0)) == pytest.approx(recipe.head_lr * global_batch / recipe.lr_batch, rel=1e-5)
    assert float(head(recipe.head_epochs * steps)) == pytest.approx(min(recipe.min_lr, recipe.peak_lr(
        global_batch, head=True)), rel=1e-5)


@pytest.mark.parametrize("call, line", [
    # Before: the schedule's own names (global_batch_size=0, total_steps=0 for a recipe without head
    # epochs) and adamw's ("adamw takes a Keras model"), none of them an argument the caller gave.
    (lambda recipe, model: recipe.optimizer(model, 0, 10), "global_batch=0: must be a positive whole number; "
                                                          "e.g. global_batch=512"),
    (lambda recipe, model: recipe.optimizer(model, "64", 10), "global_batch='64': must be a positive whole number, "
                                                             "not str; e.g. global_batch=512"),
    (lambda recipe, model: recipe.optimizer(model, 64, 1.5), "steps_per_epoch=1.5: must be a positive whole number; "
                                                            "e.g. steps_per_epoch=2502"),
    (lambda recipe, model: recipe.optimizer(model, 64, 10, head=True),
     "head=True: this recipe has no head-only epochs (head_epochs=0); give it some, recipe.replace(head_epochs=2), "
     "or use head=False"),
    (lambda recipe, model: recipe.optimizer(model, 64, 10, head="yes"),
     "head='yes': must be True (the head-only epochs) or False (the whole network's), not str"),
    (lambda recipe, model: recipe.optimizer("best.keras", 64, 10),
     "model='best.keras': Recipe.optimizer takes a Keras model, not a name or a path; load it first: "
     "keras_cait.models.load_classifier('best.keras')"),
    (lambda recipe, model: recipe.learning_rate(-8, 10), "global_batch=-8: must be a positive whole number; "
                                                        "e.g. global_batch=512"),
    (lambda recipe, model: recipe.peak_lr(None), "global_batch=None: must be a positive whole number, not NoneType; "
                                                "e.g. global_batch=512"),
])
def test_what_a_recipe_builds_refuses_its_arguments_in_their_own_names(call, line):
    model = build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=3)
    with pytest.raises(ArgumentError) as caught:
        call(RECIPES["deit"], model)
    assert str(caught.value) == line


def test_a_warmup_shorter_than_the_run_in_epochs_stays_shorter_in_steps():
    """The scratch recipe's 1.5 warmup epochs of 2, at 1 step an epoch (a folder of 14 images), rounded to
    2 steps of 2: `warmup_steps=2: must be … shorter than the run of total_steps=2` (keras-cait finetune
    --weights none --epochs 2 on a tiny folder named flags it has not)."""
    recipe = RECIPES["scratch"].replace(epochs=2)
    rates = recipe.learning_rate(14, 1)
    assert float(rates(0)) == pytest.approx(recipe.warmup_lr) and float(rates(1)) == pytest.approx(recipe.peak_lr(14))


def test_what_a_recipe_builds_takes_a_config_s_whole_float_as_before():
    assert RECIPES["deit"].peak_lr(64.0) == RECIPES["deit"].peak_lr(64)
    schedule_of = RECIPES["transfer"].learning_rate(32.0, 10.0, head=True)
    assert float(schedule_of(3)) == float(RECIPES["transfer"].learning_rate(32, 10, head=True)(3))


def test_replace_save_load_and_differences_name_the_knobs(tmp_path):
    recipe = RECIPES["deit"].replace(epochs=30, opt_betas=(0.8, 0.99))
    assert recipe.epochs == 30 and RECIPES["deit"].epochs == 400  # frozen: a copy
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.epochs = 3
    path = str(tmp_path / "recipe.json")
    recipe.save(path, "deit")
    saved = json.loads(open(path).read())
    assert saved["recipe"] == "deit" and saved["epochs"] == 30 and saved["opt_betas"] == [0.8, 0.99]
    assert Recipe.load(path) == recipe
    changed = resume._recipe_differences(str(tmp_path), recipe.replace(epochs=10, model_ema=False))
    assert spoken(changed) == "epochs 30 then, 10 now; model_ema True then, False now"
    assert spoken(changed, flag_name) == "--epochs 30 then, 10 now; --model-ema True then, False now"
    with pytest.raises(TypeError, match="no knob epoch;"):
        recipe.replace(epoch=3)
    with pytest.raises(ValueError, match=r"^reprob=1.5: must be between 0 and 1; e.g. reprob=0.25$"):
        recipe.replace(reprob=1.5)
    # 1 was taken, then refused by the optimizer as beta_1=1.0 or ema_momentum=1.0, a name the recipe has not.
    with pytest.raises(ValueError, match=r"^opt_betas=\(0\.9, 1\.0\): must be at least 0 and below 1; "
                                         r"e\.g\. opt_betas=\([\d.]+, [\d.]+\)$"):
        recipe.replace(opt_betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"^model_ema_decay=1\.0: must be at least 0 and below 1; "):
        recipe.replace(model_ema_decay=1.0)
    # numpy's numbers (a value read from an array) are kept as the Python type of the knob
    numpy_made = recipe.replace(epochs=np.int64(10), lr=np.float32(0.5), opt_betas=(np.float64(0.8), 0.99))
    assert type(numpy_made.epochs) is int and type(numpy_made.lr) is float
    assert [type(beta) for beta in numpy_made.opt_betas] == [float, float]
    assert recipe.replace(model_ema=np.bool_(False)).model_ema is False  # was "must be True or False, not bool"
    assert numpy_made == recipe.replace(epochs=10, lr=0.5)
    numpy_made.save(path, "deit")  # JSON takes it
    assert Recipe.load(path) == numpy_made


@pytest.mark.parametrize("knob, value, line", [
    ("epochs", "3", "epochs='3': must be an integer, not str '3'; e.g. epochs=400"),
    ("epochs", 2.5, "epochs=2.5: must be an integer, not float 2.5; e.g. epochs=400"),
    ("lr", "1e-3", "lr='1e-3': must be a number, not str '1e-3'; e.g. lr=0.0005"),
    ("model_ema", 1, "model_ema=1: must be True or False, not int 1; e.g. model_ema=True"),
    ("opt_betas", (0.9,), "opt_betas=(0.9,): must be 2 numbers, not tuple (0.9,); e.g. opt_betas=(0.9, 0.999)"),
    ("lr", -1.0, "lr=-1.0: must be at least 0; e.g. lr=0.0005"),
])
def test_a_knob_of_the_wrong_type_or_range_is_one_error_naming_it(knob, value, line):
    """`epochs="3"` used to be TypeError's `must be real number, not str`, naming no knob."""
    for make in (lambda: RECIPES["deit"].replace(**{knob: value}), lambda: Recipe(**{knob: value})):
        with pytest.raises(KnobError) as raised:
            make()
        assert isinstance(raised.value, ArgumentError) and raised.value.usage
        assert (raised.value.argument, raised.value.knob, raised.value.value) == (knob, knob, value)
        assert str(raised.value) == line


def test_a_rerun_with_a_changed_knob_is_refused_by_name(tmp_path):
    recipe = RECIPES["transfer"]
    record = RunRecord.open(str(tmp_path), "finetune", {"data": "a"}, recipe=recipe, recipe_name="transfer")
    assert not (tmp_path / "recipe.json").exists()  # written when the run starts training
    record.begin()
    assert Recipe.load(str(tmp_path / "recipe.json")) == recipe
    RunRecord.open(str(tmp_path), "finetune", {"data": "a"}, recipe=recipe)  # the same: resumes
    (tmp_path / "backup").mkdir()  # a backup: the run has something to lose
    with pytest.raises(BackupError, match=r"head_epochs 2 then, 3 now; mixup 0.0 then, 0.8 now"):
        RunRecord.open(str(tmp_path), "finetune", {"data": "a"}, recipe=recipe.replace(head_epochs=3, mixup=0.8))


def test_a_folder_whose_run_trained_nothing_is_started_over_by_a_run_with_other_settings(tmp_path):
    """A start refused or stopped before its first backup leaves run.json; the corrected rerun
    is not "a run with other settings"."""
    RunRecord.open(str(tmp_path), "finetune", {"data": "a"}, recipe=RECIPES["transfer"]).begin()
    other = RECIPES["transfer"].replace(batch_size=4)
    record = RunRecord.open(str(tmp_path), "finetune", {"data": "b"}, recipe=other)
    record.begin()
    assert record.settings == {"data": "b"} and Recipe.load(str(tmp_path / "recipe.json")) == other
    record.finish("head")
    with pytest.raises(BackupError, match=r"data b then, a now"):
        RunRecord.open(str(tmp_path), "finetune", {"data": "a"}, recipe=other)


def test_a_recipe_name_it_has_not_is_a_key_error_listing_its_names():
    with pytest.raises(KeyError, match=r"RECIPES has no recipe 'transfr'; did you mean 'transfer'\? its recipes: deit,"):
        RECIPES["transfr"]
    with pytest.raises(KeyError, match=r"RECIPES has no recipe 'adam'; its recipes: deit, deit-highres, transfer"):
        RECIPES["adam"]
    assert RECIPES.get("adam") is None and "adam" not in RECIPES


def test_the_demo_trains_with_its_recipe_compiled_as_a_run_compiles():
    from keras_cait.training import run

    from keras_cait.cli import demo

    assert demo.STARTS["scratch"].recipe is RECIPES["scratch"] is RECIPES["demo"]  # "demo": its former name
    assert "run.compile_for(model, recipe," in open(demo.__file__).read()
    model = build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=3)
    run.compile_for(model, RECIPES["scratch"], RECIPES["scratch"].batch_size, steps_per_epoch=10)
    assert isinstance(model.optimizer, keras.optimizers.AdamW)
    assert float(model.optimizer.learning_rate) == pytest.approx(RECIPES["scratch"].warmup_lr, rel=1e-4)


def sample_photo_crops(root, per_photo, columns, seed, side=96):
    """`per_photo` random `side`-pixel crops of each of scikit-learn's two sample photos (china.jpg,
    flower.jpg: one class each), taken within `columns` (fractions of the photo's width), as PNGs."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images()
    for path, photo in zip(photos.filenames, photos.images):
        folder = root / os.path.splitext(os.path.basename(path))[0]
        folder.mkdir(parents=True)
        height, width = photo.shape[:2]
        low, high = int(columns[0] * width), int(columns[1] * width) - side
        for index in range(per_photo):
            top, left = rng.integers(0, height - side), rng.integers(low, high)
            Image.fromarray(photo[top:top + side, left:left + side]).save(folder / f"{index}.png")
    return root


@pytest.mark.large
def test_finetune_from_random_weights_takes_the_scratch_recipe_and_learns_two_real_photos(tmp_path, capsys):
    """`finetune(..., weights=None)` without a recipe trains with RECIPES["scratch"], says so, and
    tells crops of two photos apart on the parts of them it never saw (the right third), well above
    chance (measured 91 %, 3 min of CPU time on 2 cores). The transfer recipe, the default with
    ImageNet weights, stays at chance there (measured 50 %)."""
    from keras_cait.training import run

    train = sample_photo_crops(tmp_path / "train", 80, (0.0, 0.6), seed=0)
    held_out = sample_photo_crops(tmp_path / "held_out", 40, (0.65, 1.0), seed=1)

    result = run.finetune("XXS24", train, tmp_path / "run", weights=None, image_size=64, val_fraction=0,
                          verbose=2)

    assert Recipe.load(str(tmp_path / "run" / "recipe.json")) == RECIPES["scratch"]
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "RECIPES['scratch']" in line]
    assert len(said) == 1 and "weights=None" in said[0], said
    # No head-only stage in this recipe: its one stage is not "2 of 2".
    assert f"Stage 1 of 1: the whole network, {RECIPES['scratch'].epochs} epochs" in out, out
    assert "Stage 2" not in out
    report = run.evaluate(result.model, held_out, verbose=0)
    assert report["images"] == 80 and report["top1"] >= 0.75, report


def test_clip_grad_clips_the_global_norm_as_timm_does():
    """--clip-grad is timm's: torch.nn.utils.clip_grad_norm_ scales every gradient by one factor, that
    of their norm taken together, before the step. The recipe's AdamW, fed the random gradients that
    torch's AdamW (with DeiT's decay groups) steps on after clip_grad_norm_, ends at the same weights
    (the knobs random but ε: Keras adds it to √v before the bias correction, torch after, which the
    gradients of 1e-5 here would show; tensors of very different norms, steps above and below the clip)."""
    import torch

    from keras_cait.training import weight_decay_exclusions

    rng = np.random.default_rng(13)
    steps = 5
    recipe = RECIPES["transfer"].replace(
        clip_grad=float(rng.uniform(0.5, 2)), lr=float(rng.uniform(1e-3, 1e-2)), lr_batch=8, epochs=1,
        weight_decay=float(rng.uniform(0, 0.1)), opt_eps=0.0,
        opt_betas=(float(rng.uniform(0.8, 0.9)), float(rng.uniform(0.95, 0.999))))
    model = build_cait(embed_dim=16, depth=1, num_heads=2, init_values=0.1, input_shape=(32, 32, 3), classes=3)
    variables = model.trainable_variables
    optimizer = recipe.optimizer(model, 8, steps)
    excluded = {id(variable) for variable in weight_decay_exclusions(model)}
    parameters = [torch.nn.Parameter(torch.tensor(np.array(variable))) for variable in variables]
    reference = torch.optim.AdamW(
        [{"params": [p for p, v in zip(parameters, variables) if id(v) not in excluded]},
         {"params": [p for p, v in zip(parameters, variables) if id(v) in excluded], "weight_decay": 0.0}],
        lr=recipe.lr, betas=recipe.opt_betas, eps=recipe.opt_eps, weight_decay=recipe.weight_decay)
    schedule = recipe.learning_rate(8, steps)
    norms = []
    for step, times_the_clip in enumerate(rng.permutation(np.geomspace(0.3, 3, steps))):
        # Each tensor its own scale (1e-3 to 1), the whole set at 0.3 to 3 times the clip.
        gradients = [rng.normal(size=v.shape) * 10 ** rng.uniform(-3, 0) for v in variables]
        total = np.sqrt(sum(np.sum(g**2) for g in gradients))
        gradients = [(g * recipe.clip_grad * times_the_clip / total).astype("float32") for g in gradients]
        for parameter, gradient in zip(parameters, gradients):
            parameter.grad = torch.tensor(gradient)
        norms.append(float(torch.nn.utils.clip_grad_norm_(parameters, recipe.clip_grad)))
        for group in reference.param_groups:
            group["lr"] = float(schedule(step))
        reference.step()
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in gradients], variables)
    assert min(norms) < recipe.clip_grad < max(norms)
    for variable, parameter in zip(variables, parameters):
        np.testing.assert_allclose(np.array(variable), parameter.detach().numpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=variable.path)


@pytest.mark.parametrize("text, line", [
    ("", "is no recipe file: not JSON text (Expecting value: line 1 column 1 (char 0)); write it with Recipe.save(path), "
         'or as JSON {"recipe": "<name>", "<knob>": value, ...}'),
    ("[1, 2]", "is no recipe file: a JSON list, not an object; write it with Recipe.save(path), or as JSON "
               '{"recipe": "<name>", "<knob>": value, ...}'),
    ('{"epoch": 3}', f"has no knob epoch; its knobs: {', '.join(knobs())}"),
    ('{"recipe": "transfer", "lr": -1}', "its lr=-1: must be at least 0; e.g. lr=0.0005"),
], ids=["empty", "list", "unknown knob", "out of range"])
def test_a_recipe_file_that_is_no_recipe_is_refused_naming_it(tmp_path, text, line):
    """A bare JSONDecodeError, Recipe.__init__'s TypeError, `pop expected at most 1 argument`, a
    KnobError naming no file."""
    path = tmp_path / "recipe.json"
    path.write_text(text)
    with pytest.raises(ArgumentError) as raised:
        Recipe.load(path)
    assert str(raised.value) == f"path={str(path)!r}: {line}"


def test_a_recipe_file_that_is_no_text_names_no_recipe_or_is_a_folder_is_refused_naming_it(tmp_path):
    """A UnicodeDecodeError, `unhashable type: 'list'`, an IsADirectoryError and a TypeError before."""
    path = tmp_path / "recipe.json"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ArgumentError, match=r"^path='.*recipe\.json': is no recipe file: not JSON text \('utf-8' codec"):
        Recipe.load(path)
    path.write_text('{"recipe": ["x"], "epochs": 3}')
    with pytest.raises(ArgumentError, match=r"^path='.*': names the recipe \['x'\], which is no name; give \"recipe\": "
                                            r"one of 'deit', .*, or null$"):
        Recipe.load(path)
    with pytest.raises(ArgumentError, match=rf"^path={re.escape(repr(str(tmp_path)))}: is a folder, not a recipe file; "
                                            r"give the file, e\.g\. '.*recipe\.json'$"):
        Recipe.load(tmp_path)
    with pytest.raises(FileNotFoundError) as raised:  # Python's raw `[Errno 2] No such file or directory` before
        Recipe.load(tmp_path / "nope" / "recipe.json")
    assert str(raised.value) == (f"path={str(tmp_path / 'nope' / 'recipe.json')!r}: no such file; give a recipe.json: "
                                 "a run's, or one written by Recipe.save(path)")
    for given in (None, 3, ""):
        with pytest.raises(ArgumentError, match=rf"^path={re.escape(repr(given))}: must be the path of a recipe file"):
            Recipe.load(given)


@pytest.mark.parametrize("folder", ["runs", "", "."])
def test_saving_a_recipe_to_a_folder_is_refused_and_the_folder_kept(tmp_path, monkeypatch, folder):
    """`save('runs')` replaced the folder, and everything in it, by the JSON file; `save('')` the working
    folder itself."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine")
    with pytest.raises(ArgumentError) as raised:
        RECIPES["deit"].save(folder)
    assert raised.value.argument == "path"
    assert str(raised.value) == ("path='': must be the path of a recipe file; e.g. 'recipe.json'" if not folder else
                                 f"path={folder!r}: is a folder, where save writes one JSON file; give a file in it, "
                                 f"e.g. {os.path.join(folder, 'recipe.json')!r}")
    assert sorted(os.listdir(tmp_path)) == ["runs"] and (tmp_path / "runs" / "notes.txt").read_text() == "mine"
    with pytest.raises(ArgumentError, match=r"^name=<object>: must be the name of a recipe \(a str\) or None"):
        RECIPES["deit"].save("recipe.json", name=object())
    assert not (tmp_path / "recipe.json").exists()


def test_a_hand_written_recipe_takes_the_knobs_it_leaves_out_from_the_recipe_it_names(tmp_path):
    """`{"recipe": "transfer", "lr": 1e-3}` loaded with DeiT's 400 epochs and mixup 0.8."""
    path = tmp_path / "recipe.json"
    path.write_text('{"recipe": "transfer", "lr": 0.001}')
    assert Recipe.load(path) == RECIPES["transfer"].replace(lr=0.001)
    path.write_text('{"lr": 0.001}')
    assert Recipe.load(path) == Recipe(lr=0.001)  # no name: DeiT's, as Recipe() and every older run's file
    path.write_text('{"recipe": "mine", "lr": 0.001}')
    with pytest.raises(ArgumentError, match="lacks the knobs batch_size, .* and names the recipe 'mine', which RECIPES "
                                            "has not, to take them from; give \"recipe\": one of 'deit'"):
        Recipe.load(path)
