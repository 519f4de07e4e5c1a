"""notebooks/: each one runs top to bottom offline, and the committed copies hold a real run's outputs."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.large

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
# The figures each notebook draws (matplotlib images among its outputs).
FIGURES = {
    "01_inference": 1,
    "02_transfer_learning": 1,
    "03_attention_maps": 3,
    "04_export_and_serving": 0,
}


def images_in(notebook):
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.outputs
    )


def test_the_four_notebooks_are_there():
    assert [path.stem for path in NOTEBOOKS] == list(FIGURES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_committed_notebook_holds_the_outputs_of_a_full_run(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert images_in(notebook) == FIGURES[path.stem]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_notebook_runs_offline_in_small_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_CAIT_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))  # no cached weights
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails
    assert images_in(notebook) == FIGURES[path.stem]
