"""The Python blocks of the guides in docs/ run as written, in order, one process per guide.

Offline and small: `weights="imagenet"` becomes random weights, CaiT-S24 becomes CaiT-XXS24, and a
short prelude gives the blocks what their page says the reader already has (`images`, a `model`).
README's blocks and the training guide's are run by tests/test_readme.py, keras_hub.md's by
tests/hub/test_keras_hub_guide.py; tests/test_docs.py checks that every page's blocks are covered.
"""

import os
import re
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = "import numpy as np\nimages = np.random.default_rng(0).uniform(0, 255, (1, {side}, {side}, 3)).astype('float32')\n"
# guide -> (prelude, check run after its blocks)
GUIDES = {
    "docs/weights.md": (IMAGES.format(side=384), "assert probs.shape == (1, 1000)\n"),
    "docs/attention.md": ("import keras_cait\n" + IMAGES.format(side=224) + "model = keras_cait.CaiT_XXS24(weights=None)\n",
                          "assert maps.self_attention[-1].shape == (1, 4, 196, 196)\n"),
    "docs/serving.md": (IMAGES.format(side=32), "assert probabilities.shape == (1, 1000)\n"),
    "docs/export.md": ("import keras_cait\n" + IMAGES.format(side=224)
                       + "keras_cait.export_openvino(keras_cait.CaiT_XXS24(weights=None), 'cait.xml')\n",
                       "assert probabilities.shape == (1, 1000)\n"),
    "docs/lora.md": ("", "assert not any('lora' in weight.path for weight in served.weights)\n"),
}


# serving.md converts one model to every format (minutes for a 24-block CaiT): a 2-block one at 32×32.
TINY_IMAGENET_CAIT = ("keras_cait.models.architecture.build_cait(embed_dim=64, depth=2, num_heads=4, init_values=0.1, "
                      "input_shape=(32, 32, 3))")


def guide_code(document):
    with open(os.path.join(REPOSITORY, document), encoding="utf-8") as file:
        blocks = re.findall(r"```python\n(.*?)```", file.read(), re.DOTALL)
    assert blocks, document
    code = "\n".join(blocks)
    code = code.replace('weights="imagenet"', "weights=None")  # offline: random weights
    code = code.replace("CaiT_S24", "CaiT_XXS24")  # the smallest variant: the same code, faster
    if document == "docs/serving.md":
        code = code.replace("keras_cait.CaiT_XXS24(weights=None)", TINY_IMAGENET_CAIT, 1)
        assert TINY_IMAGENET_CAIT in code, "serving.md no longer builds its model as it did"
    return code


@pytest.mark.large
@pytest.mark.parametrize("document", GUIDES)
def test_the_guides_python_runs_as_written(document, tmp_path):
    prelude, check = GUIDES[document]
    done = subprocess.run([sys.executable, "-c", prelude + guide_code(document) + "\n" + check], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
