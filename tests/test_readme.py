"""The README's examples run as written (a newcomer copies them first)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_python_block(heading):
    """The first ```python block after `heading` in README.md."""
    with open(os.path.join(REPOSITORY, "README.md"), encoding="utf-8") as file:
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


def run(code, cwd):
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": REPOSITORY})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def test_fine_tuning_snippet_runs_as_written_on_a_folder_of_images(tmp_path):
    folder = image_folder(tmp_path / "flowers")
    code = readme_python_block("### Fine-tuning in your own code")
    code = substitute(code, r'weights="imagenet"', "weights=None")   # offline: random weights
    code = substitute(code, r'"flowers/"', repr(str(folder)))
    code = substitute(code, r"epochs=\d+", "epochs=1", count=2)
    run(code, cwd=tmp_path)
    assert (tmp_path / "flowers.keras").stat().st_size > 0

    # Saving and loading, as the README says: import keras_cait, then keras.models.load_model.
    load = readme_python_block("### Saving and loading")
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
