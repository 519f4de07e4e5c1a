"""constraints.txt, the reproducible install the README documents, pins everything the suite needs."""

import ast
import os
import re

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def setup_requirements():
    """install_requires and the test extra of setup.py, as canonical names."""
    tree = ast.parse(open(os.path.join(REPOSITORY, "setup.py")).read())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "setup")
    arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords
                 if keyword.arg in ("install_requires", "extras_require")}
    requirements = arguments["install_requires"] + arguments["extras_require"]["test"]
    return {canonical(re.split(r"[\[<>=!~ ]", requirement)[0]) for requirement in requirements}


def test_every_requirement_of_the_test_install_is_pinned_exactly():
    pins = {}
    for line in open(os.path.join(REPOSITORY, "constraints.txt")):
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonical(name)] = version
    missing = setup_requirements() - set(pins)
    assert not missing, f"constraints.txt lacks {sorted(missing)}: regenerate it with pip freeze"


def test_every_requirement_of_the_test_install_is_installed():
    """The suite imports what the [test] extra installs: a missing one is this error, never a skip."""
    import importlib.metadata

    missing = []
    for name in sorted(setup_requirements()):
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    assert not missing, f'not installed: {missing}; pip install -e ".[test]" -c constraints.txt'
