"""README and the guides in docs/: every link leads somewhere, every `keras-cait` command line they
show is one the command line takes, and every Python block is run by a test."""

import glob
import os
import re
import shlex

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = sorted(["README.md", "CONTRIBUTING.md", *(os.path.relpath(path, REPOSITORY) for path in glob.glob(
    os.path.join(REPOSITORY, "docs", "*.md")))])
# The Python blocks of the front pages and the test that runs each: (page, the heading above the
# block, its number under that heading) -> test.
README_TESTS = "tests/test_readme.py::"
RUN_BY = {
    ("README.md", "## Load and predict", 0): README_TESTS + "test_load_and_predict_snippet_runs_as_written",
    ("README.md", "## Fine-tune with model.fit", 0):
        README_TESTS + "test_fine_tuning_snippet_runs_as_written_on_a_folder_of_images",
    ("README.md", "## Export and serve", 0):
        README_TESTS + "test_export_and_serve_snippet_answers_the_readme_request",
    ("docs/training.md", "## Recipes", 0): README_TESTS + "test_recipes_and_lora_blocks_of_the_training_guide",
    ("docs/training.md", "## A whole run in Python", 0):
        README_TESTS + "test_the_python_run_snippet_runs_as_written_and_resumes_as_the_command_would",
    ("docs/training.md", "## Saving and loading", 0):
        README_TESTS + "test_fine_tuning_snippet_runs_as_written_on_a_folder_of_images",
    ("docs/training.md", "## Saving and loading", 1): README_TESTS + "test_recipes_and_lora_blocks_of_the_training_guide",
}


def text(document):
    with open(os.path.join(REPOSITORY, document), encoding="utf-8") as file:
        return file.read()


def anchors(markdown):
    """GitHub's anchors of a page's headings."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", markdown, re.MULTILINE)}


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_leads_to_a_file_and_heading(document):
    markdown = text(document)
    for target in re.findall(r"\]\(([^)\s]+)\)", markdown):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(document), path)) if path else document
        assert os.path.exists(os.path.join(REPOSITORY, resolved)), f"{document}: {target}"
        if anchor and resolved.endswith(".md"):
            assert anchor in anchors(text(resolved)), f"{document}: {target}"


def command_lines(markdown):
    """`keras-cait ...` lines of code: indented blocks and fenced ones, continuation lines joined."""
    lines, pending = [], ""
    for line in markdown.split("\n"):
        stripped = line.strip()
        if pending:
            pending += " " + stripped.rstrip("\\").strip()
            if not stripped.endswith("\\"):
                lines.append(pending)
                pending = ""
        elif (line.startswith("    ") or line.startswith("\t")) and re.match(r"(\S+=\S+ )*keras-cait ", stripped):
            if stripped.endswith("\\"):
                pending = stripped.rstrip("\\").strip()
            else:
                lines.append(stripped)
    return lines


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_command_line_shown_is_one_the_command_line_takes(document):
    """Parsed by the command's own parser (nothing runs): a renamed or removed flag fails here."""
    from keras_cait.cli import commands, runs

    for line in command_lines(text(document)):
        line = re.sub(r"^(\S+=\S+ )+", "", line)  # KERAS_BACKEND=jax keras-cait ...
        if re.match(r"keras-cait \w+:", line):
            continue  # an error line the page quotes, not a command
        if "..." in line or "|" in line.split("#")[0] or "[" in line or "<" in line:
            continue  # a synopsis (alternatives, optional parts), not a command
        argv = shlex.split(line.split(" #")[0])[1:]
        command = argv[0]
        if command in runs.COMMANDS:
            runs.parse_arguments(command, argv[1:])
        else:
            commands.build_parser().parse_args(argv)


def python_blocks(markdown):
    """(the heading above it, its number under that heading) of every ```python block."""
    blocks, heading, number = [], None, 0
    for part in re.split(r"(^#+ .*$|```python\n.*?```)", markdown, flags=re.MULTILINE | re.DOTALL):
        if part.startswith("#"):
            heading, number = part.strip(), 0
        elif part.startswith("```python"):
            blocks.append((heading, number))
            number += 1
    return blocks


def test_every_python_block_of_the_front_pages_is_run_by_a_test():
    """README's and the training guide's blocks, each by the test RUN_BY names (which must exist)."""
    for document in ("README.md", "docs/training.md"):
        for heading, number in python_blocks(text(document)):
            assert (document, heading, number) in RUN_BY, (document, heading, number)
    for test in set(RUN_BY.values()):
        path, name = test.split("::")
        assert f"def {name}(" in text(path), test


def test_every_python_block_of_every_guide_is_run_by_a_test():
    """A page with Python blocks is run whole by tests/test_guides.py, or its blocks are listed in
    RUN_BY (README, the training guide), or it is keras_hub.md (tests/hub/test_keras_hub_guide.py)."""
    from tests.test_guides import GUIDES

    for document in DOCUMENTS:
        if python_blocks(text(document)) and document not in ("README.md", "docs/training.md", "docs/keras_hub.md"):
            assert document in GUIDES, document
    assert "docs/keras_hub.md" in text("tests/hub/test_keras_hub_guide.py")
