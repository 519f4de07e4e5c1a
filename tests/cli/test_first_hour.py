"""A new user's first `keras-cait finetune`: a small folder, only the flags that name it, no false start."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import write_digits

pytestmark = pytest.mark.large

KERAS_CAIT = shutil.which("keras-cait", path=os.path.dirname(sys.executable))


def test_finetune_of_a_folder_of_20_images_with_only_its_required_flags_ends_with_a_model(tmp_path):
    """The defaults a user meets first, offline: XXS24 at its checkpoint's side, random weights so the scratch
    recipe (said), the precision of this machine, the recipe's batch lowered to what 18 training images fill
    (said)."""
    from keras_cait.training.recipe import RECIPES
    from keras_cait.training.run import default_precision

    write_digits(tmp_path / "photos", per_class=10, size=40, classes=[3, 8])
    done = subprocess.run([KERAS_CAIT, "finetune", "--data", "photos", "--output-dir", "runs/first",
                           "--weights", "none", "--verbose", "0"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    precision, _ = default_precision()
    assert f"Precision {precision} (" in done.stdout and "; --precision chooses another)." in done.stdout
    assert "--weights none: random weights, so the run trains with --recipe scratch" in done.stdout
    batch = RECIPES["scratch"].batch_size
    assert f"Batch {batch} per replica is more than the 18 training images fill: batch 18 instead" in done.stdout
    run = tmp_path / "runs" / "first"
    assert {"best.keras", "final.keras", "run.json", "recipe.json"} <= set(os.listdir(run))
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["precision"] == precision and settings["global batch size"] == 18
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["batch_size"] == 18 and recipe["sched"] == RECIPES["scratch"].sched


def _requirement_closure(requirements):
    """The distributions `requirements` (PEP 508 strings) install, with their own requirements."""
    import importlib.metadata
    import re

    seen, todo = set(), list(requirements)
    while todo:
        requirement = todo.pop()
        if ";" in requirement and "extra ==" in requirement.split(";", 1)[1]:
            continue  # another package's extra: not installed by this requirement
        name = re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(importlib.metadata.requires(name) or [])
        except importlib.metadata.PackageNotFoundError:
            pass
    return seen


SITECUSTOMIZE = """
import importlib.abc, sys
BLOCKED = set({blocked!r})

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed by the README's set-up)", name=name)

sys.meta_path.insert(0, Refuse())
"""


def test_the_commands_defaults_import_only_what_the_readme_s_set_up_installs(tmp_path, tiny_cait):
    """README's main command installs `-e ".[demo]"`: every module beyond that install (the test extra's torch, timm,
    jax, tensorboard, keras-hub, ...) is made unimportable, and finetune, evaluate, predict and export
    run with their defaults."""
    import importlib.metadata
    import re

    repository = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repository, "README.md"), encoding="utf-8") as file:
        extra = re.search(r'pip install -q -e "\.\[(\w+)\]" && \.venv/bin/keras-cait', file.read()).group(1)
    requirements = importlib.metadata.requires("keras-cait") or []
    readme = [requirement.split(";")[0] for requirement in requirements  # the base install and the extra
              if "extra ==" not in requirement or re.search(rf"extra\s*==\s*['\"]{extra}['\"]", requirement)]
    wanted = _requirement_closure(readme) | {"keras-cait", "pip", "setuptools", "wheel"}
    installed = importlib.metadata.packages_distributions()  # module -> [distributions]
    blocked = sorted(module for module, distributions in installed.items()
                     if not {d.lower().replace("_", "-") for d in distributions} & wanted
                     and not module.startswith("_"))
    assert {"torch", "timm", "jax", "tensorboard", "keras_hub"} <= set(blocked), blocked
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=blocked))

    write_digits(tmp_path / "photos", per_class=4, size=32, classes=[3, 8])
    tiny_cait(classes=10).save(tmp_path / "start.keras")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), repository])}
    image = os.path.join("photos", "3", sorted(os.listdir(tmp_path / "photos" / "3"))[0])
    for argv in (["finetune", "--data", "photos", "--output-dir", "run", "--model", "start.keras",
                  "--head-epochs", "1", "--epochs", "1", "--verbose", "0"],
                 ["evaluate", "--data", "photos", "--model", "run/best.keras"],
                 ["predict", image, "--model", "run/best.keras"],
                 ["export", "serving/1", "--model", "run/best.keras"]):
        done = subprocess.run([KERAS_CAIT, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                              env=env)
        assert done.returncode == 0, f"keras-cait {' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    probe = subprocess.run([sys.executable, "-c", "import tensorboard"], capture_output=True, text=True, env=env)
    assert "not installed by the README's set-up" in probe.stderr  # the block holds in the commands' processes
