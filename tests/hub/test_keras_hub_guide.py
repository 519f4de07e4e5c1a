"""Every code block of docs/keras_hub.md runs, in order, as written; so does the README's keras-hub snippet
where the README still has one (the rewritten README links this guide instead).

They run in a fresh process against the fake Hugging Face hub (tests/weights/fake_hf_hub.py), which
serves a random timm checkpoint of `TINY_CAIT`'s shape for every released preset; the registry's
architecture is made that tiny one too (`PRELUDE`), so the code is the guide's, the sizes are not.
`keras_hub.upload_preset` goes to a folder (huggingface_hub's upload replaced by a copy).
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_cait.hub import PRESETS
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.weights.fake_hf_hub import FakeHub

pytestmark = pytest.mark.large

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(REPOSITORY, "docs", "keras_hub.md")
README = os.path.join(REPOSITORY, "README.md")

PRELUDE = """
import json, os, shutil, sys
import huggingface_hub
from keras_cait.hub import presets
from keras_cait.weights import CHECKPOINTS

TINY = json.loads(sys.argv[1])
presets.backbone_config = lambda preset: dict(image_shape=(TINY["size"],) * 2 + (3,), **TINY["cait"])
presets.image_size = lambda preset: (TINY["size"],) * 2
for checkpoint in CHECKPOINTS.values():
    checkpoint["sha256"] = None  # the random checkpoints are verified by the sha256 the fake hub sends


class Repo:
    repo_id = "your-name/cait_flowers"


huggingface_hub.create_repo = lambda repo_id, exist_ok: Repo()
huggingface_hub.file_exists = lambda repo_id, filename: False
huggingface_hub.upload_folder = lambda repo_id, folder_path: shutil.copytree(folder_path, "uploaded")
"""


def python_blocks(path):
    with open(path, encoding="utf-8") as file:
        return re.findall(r"```python\n(.*?)```", file.read(), re.DOTALL)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder with photo.jpg and flowers/ (5 classes), and a fake hub serving every preset."""
    from tests.conftest import TimmReference

    root = tmp_path_factory.mktemp("guide")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(root / "photo.jpg")
    for index in range(5):
        os.makedirs(root / "flowers" / f"class_{index}")
        for number in range(2):
            pixels = rng.integers(0, 256, (48 + 8 * number, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "flowers" / f"class_{index}" / f"{number}.jpg")
    reference = TimmReference(root)
    body = reference.save(reference.tiny_model(num_classes=1000)).read_bytes()
    hub = FakeHub()
    for preset in PRESETS:
        hub.serve(preset, body)
    yield root, hub
    hub.close()


def run_blocks(blocks, workspace, epilogue=""):
    root, hub = workspace
    for name in ("cait_flowers", "cait_flowers_int8", "uploaded"):
        subprocess.run(["rm", "-rf", str(root / name)], check=True)
    code = "\n".join([PRELUDE, *blocks, epilogue])
    env = {name: value for name, value in os.environ.items() if not name.startswith(("HF_", "KERAS_CAIT"))}
    env.update(PYTHONPATH=REPOSITORY, HF_HOME=str(root / "hf_home"), HF_ENDPOINT=hub.url,
               KERAS_HOME=str(root / "keras_home"), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(dict(size=TINY_SIZE, cait=TINY_CAIT))],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


GUIDE_CHECKS = """
import numpy as np
assert logits.shape == (1, 1000), logits.shape
assert several.shape == (2, 1000) and np.allclose(several[0], logits[0], atol=1e-5), several.shape
assert type(again).__name__ == "CaiTImageClassifier" and again.num_classes == 5
assert os.path.isfile("uploaded/config.json")
assert tokens.shape == (1, 1 + (TINY["size"] // 16) ** 2, TINY["cait"]["embed_dim"]), tokens.shape
assert tuned.backbone.trainable and tuned.output_dense.kernel.shape[-1] == 5
assert fast.backbone.dtype_policy.name == "mixed_bfloat16" and str(fast.predict(images).dtype) == "float32"
assert {layer.quantization_mode for layer in loaded.backbone._flatten_layers()
        if type(layer).__name__ == "Dense"} == {"int8"}
assert np.array_equal(loaded.predict(images), small.predict(images))
print("guide checks passed")
"""


def test_every_code_block_of_the_keras_hub_guide_runs_in_order(workspace):
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 6, f"docs/keras_hub.md has {len(blocks)} python blocks"

    stdout = run_blocks(blocks, workspace, GUIDE_CHECKS)

    assert "guide checks passed" in stdout
    assert re.search(r"\[\('n\d{8}', '[^']+', ", stdout), "decode_predictions printed no ImageNet classes"


def test_the_readme_s_keras_hub_snippet_runs_or_the_readme_links_this_guide(workspace):
    """The README's python blocks that use keras_cait.hub run, after the guide's first block (which
    reads the `images` they predict on). A README that moved its snippet here links the guide."""
    with open(README, encoding="utf-8") as file:
        readme = file.read()
    snippets = [block for block in python_blocks(README) if "keras_cait.hub" in block]
    if not snippets:
        assert "(docs/keras_hub.md)" in readme, "README.md neither shows keras_cait.hub nor links docs/keras_hub.md"
        return

    stdout = run_blocks([python_blocks(GUIDE)[0], *snippets], workspace,
                        "assert type(again).__name__ == 'CaiTImageClassifier'\n"
                        "assert logits.shape == (1, 1000) and tuned.output_dense.units == 5\n"
                        "print('readme snippet ran')")

    assert "readme snippet ran" in stdout
