"""What `import keras_cait` loads, and that no module of keras_cait imports private APIs."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_cait"
REPOSITORY = str(PACKAGE.parent)
TENSORFLOW_MODULES = ["keras_cait.training", "keras_cait.export", "keras_cait.images.evaluation_transform",
                      "keras_cait.cli.commands", "keras_cait.cli.runs", "keras_cait.cli.demo", "keras_cait.cli.errors"]
# What `import keras_cait` loads of the command line: the start-up it runs before Keras, nothing else.
COMMAND_STARTUP = {"keras_cait.cli", "keras_cait.cli.startup", "keras_cait.cli.startup.interrupt",
                   "keras_cait.cli.startup.onednn"}


def loaded_modules(code, backend):
    """sys.modules after running `code` in a fresh Python on `backend`."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"KERAS_BACKEND": backend, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3",
             "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_import_keras_cait_loads_only_inference():
    modules = loaded_modules("import keras_cait\nkeras_cait.CaiT_XXS24", "jax")
    assert "keras_cait.models.variants" in modules
    assert [name for name in modules if any(name == m or name.startswith(f"{m}.") for m in TENSORFLOW_MODULES)] == []
    assert {name for name in modules if name.startswith("keras_cait.cli")} == COMMAND_STARTUP
    # On JAX nothing of keras_cait needs TensorFlow.
    assert "tensorflow" not in modules
    # keras-hub loads with keras_cait.hub only.
    assert {"keras_hub", "keras_cait.hub"}.isdisjoint(modules)


@pytest.mark.large
def test_training_and_the_exporters_load_on_first_use():
    modules = loaded_modules("import keras_cait\nkeras_cait.training.adamw\nkeras_cait.export_onnx", "tensorflow")
    assert {"keras_cait.training", "keras_cait.training.optimizer", "keras_cait.export"} <= modules
    # keras_cait.export.<exporter>, as docs/export.md writes it, right after `import keras_cait`
    modules = loaded_modules("import keras_cait\nkeras_cait.export.export_onnx", "tensorflow")
    assert {"keras_cait.export", "keras_cait.export.onnx"} <= modules


@pytest.mark.large
def test_the_runs_load_when_first_read_as_the_readme_calls_them():
    """README: `from keras_cait import training` ... `training.run.finetune(...)`; the runs (tf.data)
    load then, not with `keras_cait.training`."""
    modules = loaded_modules("from keras_cait import training\n"
                             "assert 'keras_cait.training.run' not in sys.modules\n"
                             "assert callable(training.run.finetune)", "tensorflow")
    assert "keras_cait.training.run" in modules


@pytest.mark.large
def test_the_data_modules_load_when_first_read():
    """docs/training.md: `keras_cait.training.sources.image_folder(...)`, `...stream.training_stream`
    right after `import keras_cait` (they were an AttributeError unless imported by name)."""
    modules = loaded_modules("import keras_cait\n"
                             "assert 'keras_cait.training.sources' not in sys.modules\n"
                             "assert callable(keras_cait.training.sources.image_folder)\n"
                             "assert callable(keras_cait.training.stream.training_stream)\n"
                             "assert callable(keras_cait.training.image_checks.check_images)", "tensorflow")
    assert {"keras_cait.training.sources", "keras_cait.training.stream", "keras_cait.training.image_checks"} <= modules

# The private imports that have no public counterpart, by file, each with its reason.
PRIVATE_WITHOUT_PUBLIC = {
    # TensorFlow exports enable_op_determinism alone: a run puts the caller's setting back (off) with
    # config.disable_op_determinism and reads it with config.is_op_determinism_enabled.
    "training/run_state.py": {"tensorflow.python.framework"},
}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_keras_or_tensorflow_import(path):
    tree = ast.parse(path.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    allowed = PRIVATE_WITHOUT_PUBLIC.get(str(path.relative_to(PACKAGE)), set())
    private = [name for name in imported
               if name.startswith(("keras.src", "tensorflow.python", "keras_hub.src")) and name not in allowed]
    assert private == [], f"{path.name} imports private APIs {private}; use keras.* / tf.* / keras_hub.* public APIs"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_package_imports_none_of_its_own_moved_paths(path):
    """An old path (`keras_cait.atomic`) warns a DeprecationWarning at every user's first use of the
    module that imports it; the package itself imports the new one."""
    from keras_cait.deprecation import MOVED

    tree = ast.parse(path.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    old = sorted(name for name in imported if name in MOVED)
    assert old == [], f"{path.relative_to(PACKAGE)} imports {old}; import {[MOVED[name] for name in old]} instead"


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=lambda p: p.name)
def test_the_command_line_uses_only_public_names_of_the_library(path):
    """keras_cait/cli/ is an application of the library: it imports no `_name` of keras_cait outside
    cli/ and reads no `module._name` of one it imported."""
    tree = ast.parse(path.read_text())
    library = {}  # local name -> module of keras_cait outside cli/
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_cait") \
                and not node.module.startswith("keras_cait.cli"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    private.append(f"from {node.module} import {alias.name}")
                library[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_cait") and not alias.name.startswith("keras_cait.cli"):
                    library[(alias.asname or alias.name).split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in library \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            private.append(f"{node.value.id}.{node.attr}")
    assert private == [], f"keras_cait/cli/{path.name} uses private names of the library: {private}"
def import_graph():
    """{module: the keras_cait modules it imports}, every import counted: at the top of the file
    or inside a function (a lazy import only hides a circle until the function runs)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in names.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from keras_cait.training import schedule` imports the module schedule.
                imported |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names
                             else node.module for alias in node.names}
        graph[module] = {name for name in imported if name in names and name != module}
    return graph


def circles(graph):
    """The import circles of `graph`: its strongly connected components of more than one module."""
    index, low, stack, found = {}, {}, [], []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_package_has_no_import_circle():
    assert circles(import_graph()) == []


def test_an_import_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_private_name_of_another(path):
    """A name with a leading underscore is its module's own; what another module needs is public."""
    tree = ast.parse(path.read_text())
    private = [f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("keras_cait") for alias in node.names
               if alias.name.startswith("_")]
    assert private == [], f"{path.name} imports private names {private}; make them public or move them"
