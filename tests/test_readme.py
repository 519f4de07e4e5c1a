"""The README's examples run as written (a newcomer copies them first), and the guides' copies of them."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_python_block(heading, document="README.md"):
    """The first ```python block after `heading` in `document` (README.md or a guide)."""
    with open(os.path.join(REPOSITORY, document), encoding="utf-8") as file:
        text = file.read()
    after = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", after, re.DOTALL).group(1)


def substitute(code, old, new, count=1):
    """Replaces `old` (a regular expression), failing if the README no longer has it `count` times."""
    code, made = re.subn(old, new, code)
    assert made == count, f"README snippet changed: {old!r} found {made} times, expected {count}"
    return code


def image_folder(root, classes=("daisy", "roses"), per_class=5):
    """A folder of real JPEG files, one subfolder per class, of several sizes and aspects."""
    rng = np.random.default_rng(0)
    for index, name in enumerate(classes):
        os.makedirs(root / name)
        for number in range(per_class):
            height, width = 48 + 8 * number, 64 - 4 * number
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            pixels[..., index] = 255  # a class the model can tell apart
            Image.fromarray(pixels).save(root / name / f"{number}.jpg", quality=90)
    return root


# TensorFlow's Abseil records ("I0000 00:00:1795884093.947941   13910 port.cc:153] ...", W, E, F)
# and the notice that opens them: none reaches a reader who runs a snippet as written.
TENSORFLOW_RECORD = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] |WARNING: All log messages before absl)", re.MULTILINE)


def run(code, cwd):
    """`code` run as a reader runs it: a fresh Python, TensorFlow's log level unset as in a fresh
    terminal. It must succeed and leave no record of TensorFlow's on standard error."""
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**environment, "PYTHONPATH": REPOSITORY})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert not TENSORFLOW_RECORD.search(done.stderr), done.stderr[-6000:]
    return done


def test_fine_tuning_snippet_runs_as_written_on_a_folder_of_images(tmp_path):
    folder = image_folder(tmp_path / "flowers")
    code = readme_python_block("## Fine-tune with model.fit")
    code = substitute(code, r'weights="imagenet"', "weights=None")   # offline: random weights
    code = substitute(code, r'"flowers/"', repr(str(folder)))
    code = substitute(code, r'RECIPES\["transfer"\]', 'RECIPES["transfer"].replace(head_epochs=1, epochs=1)')
    code += "print('stages', model.get_layer('self_attention_block_0').dtype_policy.name)\n"
    code += "print('stages', model.optimizer.iterations.numpy(), recipe.batch_size)\n"
    done = run(code, cwd=tmp_path)
    assert (tmp_path / "flowers.keras").stat().st_size > 0
    # The second stage's optimizer ran one epoch of the recipe's batches: 8 training images of 10.
    assert done.stdout.split()[-2:] == ["1", "64"], done.stdout[-500:]
    # The blocks computed in the precision the command line picks on this machine.
    from keras_cait.training.run import default_precision

    assert f"stages {default_precision()[0]}\n" in done.stdout, done.stdout[-500:]

    # Saving and loading, as the README says: import keras_cait, then keras.models.load_model.
    load = readme_python_block("## Saving and loading", "docs/training.md")
    load += "print(model.output_shape)\n"
    done = run(substitute(load, r'"flowers.keras"', repr(str(tmp_path / "flowers.keras"))),
               cwd=tmp_path)
    assert "(None, 2)" in done.stdout

    # Without the import Keras cannot find CaiT's classes, with the message the README quotes.
    without = substitute(load, r"import keras_cait.*\n", "")
    done = subprocess.run([sys.executable, "-c", substitute(
        without, r'"flowers.keras"', repr(str(tmp_path / "flowers.keras")))],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "Could not locate class 'CaiTModel'" in done.stderr


def test_load_and_predict_snippet_runs_as_written(tmp_path):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(
        tmp_path / "cat.jpg")
    code = readme_python_block("## Load and predict")
    code = substitute(code, r'weights="imagenet"', "weights=None")   # offline: random weights
    done = run(code, cwd=tmp_path)
    predictions = eval(done.stdout.strip().splitlines()[-1], {"float32": np.float32, "np": np})  # noqa: S307
    assert len(predictions) == 1 and len(predictions[0]) == 5
    assert all(len(entry) == 3 and entry[0].startswith("n") for entry in predictions[0])  # WordNet ids


def test_export_and_serve_snippet_answers_the_readme_request(tmp_path):
    """The README's export, then its REST request body (made by its own printf line) through the
    SavedModel's signature as TF Serving decodes it: {"b64": ...} becomes the bytes."""
    import base64
    import json

    import keras

    from keras_cait.models.architecture import build_cait
    from keras_cait.training import with_new_head
    from tests.conftest import TINY_CAIT

    backbone = build_cait(**TINY_CAIT, input_shape=(32, 32, 3), include_top=False, pooling="token")
    with_new_head(backbone, 2, class_names=["daisy", "roses"]).save(tmp_path / "flowers.keras")
    run(readme_python_block("## Export and serve"), cwd=tmp_path)
    Image.fromarray(np.full((40, 50, 3), 200, np.uint8)).save(tmp_path / "rose.jpg")
    with open(os.path.join(REPOSITORY, "README.md"), encoding="utf-8") as file:
        printf = next(line.strip() for line in file if line.strip().startswith("printf '{\"signature_name\""))
    subprocess.run(["bash", "-c", printf], cwd=tmp_path, check=True)
    body = json.loads((tmp_path / "request.json").read_text())

    import tensorflow as tf

    served = tf.saved_model.load(str(tmp_path / "serving" / "flowers" / "1"))
    signature = served.signatures[body["signature_name"]]
    images = tf.constant([base64.b64decode(instance["b64"]) for instance in body["instances"]])
    answer = signature(image_bytes=images)
    assert sorted(answer["top_k_classes"].numpy()[0].astype(str)) == ["daisy", "roses"]
    assert keras.ops.convert_to_numpy(answer["probabilities"]).shape == (1, 2)


def test_recipes_and_lora_blocks_of_the_training_guide(tmp_path):
    """The guide's Recipes block and its LoRA block, after a tiny model, data and a run's recipe.json."""
    from tests.conftest import TINY_CAIT

    prelude = (
        "import keras_cait, keras, numpy as np\n"
        "from keras_cait import training\n"
        "from keras_cait.models.architecture import build_cait\n"
        f"model = build_cait(**{TINY_CAIT!r}, input_shape=(32, 32, 3), classes=2)\n"
        "training.RECIPES['transfer'].save('runs/flowers/recipe.json', 'transfer')\n"
        "rng = np.random.default_rng(0)\n"
        "train_ds = val_ds = (rng.uniform(0, 255, (8, 32, 32, 3)).astype('float32'), np.eye(2)[rng.integers(0, 2, 8)])\n"
    )
    (tmp_path / "runs" / "flowers").mkdir(parents=True)
    recipes = readme_python_block("## Recipes", "docs/training.md")
    lora = re.findall(r"```python\n(.*?)```", open(os.path.join(REPOSITORY, "docs/training.md")).read().split(
        "## Saving and loading")[1], re.DOTALL)[1]
    lora = substitute(lora, r"model.fit\(train_ds, validation_data=val_ds, epochs=10\)",
                      "model.fit(*train_ds, validation_data=val_ds, epochs=1)")
    checks = ("assert recipe.epochs == 30 and recipe.drop_path == 0.2 and optimizer.use_ema\n"
              "assert ran == training.RECIPES['transfer'] and augmentation.repeats == 3\n"
              "assert not any('lora' in w.path for w in served.weights)\n")
    run(prelude + recipes + lora + checks, cwd=tmp_path)


def test_the_python_run_snippet_runs_as_written_and_resumes_as_the_command_would(tmp_path):
    folder = image_folder(tmp_path / "flowers")
    code = readme_python_block("## A whole run in Python", "docs/training.md")
    code = substitute(code, r'run\.finetune\("XXS24", ', 'run.finetune("XXS24", weights=None, image_size=32, data=')
    code = substitute(code, r'"flowers/", "runs/flowers"', f'{str(folder)!r}, output_dir="runs/flowers"')
    code = substitute(code, r'RECIPES\["transfer"\]', 'RECIPES["transfer"].replace(head_epochs=1, epochs=1, batch_size=4)')
    code = substitute(code, r'"flowers/"\)', f'{str(folder)!r})')
    done = run(code, cwd=tmp_path)
    assert "['daisy', 'roses']" in done.stdout or "('daisy', 'roses')" in done.stdout, done.stdout[-800:]
    assert '"top1"' in done.stdout or "'top1'" in done.stdout
    assert "top5" not in done.stdout  # 2 classes: top-1 only, as the guide says
    # The prediction of the fine-tuned model, decoded with its class names: (index, name, probability).
    decoded = eval(next(line for line in done.stdout.splitlines() if line.startswith("[[(")))  # noqa: S307
    (first, second), = decoded
    assert {first[:2], second[:2]} == {(0, "daisy"), (1, "roses")} and first[2] >= second[2]
    assert first[2] + second[2] == pytest.approx(1, abs=1e-5)
    again = run(code, cwd=tmp_path)  # the same call again: the finished run trains nothing
    assert "finished earlier with the same settings" in again.stdout
