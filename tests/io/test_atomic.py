"""keras_cait.io.atomic: a write is all or nothing, an overwrite never leaves the destination
missing, and the leftovers of killed writers are cleaned up by the next one."""

import os
import subprocess
import sys
import time

import pytest

from keras_cait.io import atomic

ATOMIC_PY = atomic.__file__


def dead_pid():
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True)
    return int(process.stdout)


def write_version(folder, text):
    os.makedirs(folder)
    with open(os.path.join(folder, "saved_model.pb"), "w") as file:
        file.write(text)


def read_version(folder):
    with open(os.path.join(folder, "saved_model.pb")) as file:
        return file.read()


def test_an_overwrite_never_leaves_the_folder_missing(tmp_path, monkeypatch):
    target = str(tmp_path / "1")
    write_version(target, "old")
    seen = []

    def watched(function):
        def call(*args):
            result = function(*args)
            seen.append(os.path.isdir(target))
            return result
        return call

    monkeypatch.setattr(atomic, "_exchange", watched(atomic._exchange))
    monkeypatch.setattr(os, "replace", watched(os.replace))
    with atomic.written_atomically(target) as temporary:
        write_version(temporary, "new")

    assert read_version(target) == "new"
    assert seen and all(seen), "a moment without the version folder"
    assert os.listdir(tmp_path) == ["1"]


KILLED_BETWEEN_RENAMES = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("atomic", sys.argv[1])
atomic = importlib.util.module_from_spec(spec); spec.loader.exec_module(atomic)
atomic._exchange = lambda new, path: False  # a file system without RENAME_EXCHANGE
replace = os.replace
def replace_then_die(source, destination):
    replace(source, destination)
    os._exit(9)  # SIGKILL-like: no finally, no cleanup
os.replace = replace_then_die
with atomic.written_atomically(sys.argv[2]) as temporary:
    os.makedirs(temporary)
    open(os.path.join(temporary, "saved_model.pb"), "w").write("new")
"""


def test_without_the_atomic_exchange_a_kill_between_renames_is_undone_by_the_next_writer(tmp_path):
    target = str(tmp_path / "1")
    write_version(target, "old")

    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, ATOMIC_PY, target])

    assert killed.returncode == 9
    assert not os.path.exists(target), "the fallback's window: the old folder moved aside"
    assert atomic.remove_stale_partials(str(tmp_path))
    assert read_version(target) == "old"
    assert os.listdir(tmp_path) == ["1"]


def test_leftovers_of_dead_or_long_silent_writers_are_removed(tmp_path):
    dead = f".1.partial-{dead_pid()}-abc123_x"
    running = f".2.partial-{os.getppid()}-abc123_x"  # pytest's parent: alive
    silent = f".3.partial-{os.getppid()}-def456_y"
    for name in (dead, running, silent):
        write_version(str(tmp_path / name / name.split(".")[1]), "half")
    file = f".model.partial-{dead_pid()}-xyz98765.safetensors"
    (tmp_path / file).write_bytes(b"half a download")
    unrelated = [".hidden-but-not-ours", ".config.settings",  # a user's, though like ours:
                 f".mynotes.partial-{dead_pid()}-keep", f".notes.partial-{dead_pid()}-abcdefgh.txt"]
    undated = [".5.partial-k2j4h6g8", ".cait_s24_224.ab12cd34.part.safetensors"]  # older names
    fresh_undated = ".6.partial-m3n5b7v9"
    for name in unrelated + undated + [fresh_undated]:
        (tmp_path / name).mkdir()
    two_days_ago = time.time() - 2 * 24 * 3600
    for name in [silent, *unrelated, *undated]:
        os.utime(tmp_path / name, (two_days_ago, two_days_ago))

    with atomic.written_atomically(str(tmp_path / "4")) as temporary:
        write_version(temporary, "new")

    assert sorted(os.listdir(tmp_path)) == sorted([running, *unrelated, fresh_undated, "4"])


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_failed_write_leaves_the_old_one_and_no_leftover(tmp_path, overwrite):
    target = str(tmp_path / "1")
    write_version(target, "old")

    with pytest.raises(RuntimeError, match="disk full"):
        with atomic.written_atomically(target, overwrite) as temporary:
            write_version(temporary, "half")
            raise RuntimeError("disk full")

    assert read_version(target) == "old"
    assert os.listdir(tmp_path) == ["1"]


def test_companions_go_into_place_first_so_a_new_file_never_meets_old_companions(tmp_path, monkeypatch):
    graph, weights = tmp_path / "cait.xml", tmp_path / "cait.bin"
    graph.write_text("old graph")
    weights.write_text("old weights")
    moved = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: (moved.append(os.path.basename(target)),
                                                              replace(source, target)))

    with atomic.written_atomically(graph, companions=[weights]) as temporary:
        with open(temporary, "w") as file:
            file.write("new graph")
        with open(temporary.removesuffix(".xml") + ".bin", "w") as file:  # as OpenVINO writes it
            file.write("new weights")

    assert moved == ["cait.bin", "cait.xml"]
    assert (graph.read_text(), weights.read_text()) == ("new graph", "new weights")
    assert sorted(os.listdir(tmp_path)) == ["cait.bin", "cait.xml"]


def test_a_companion_left_unwritten_places_nothing(tmp_path):
    graph, weights = tmp_path / "cait.xml", tmp_path / "cait.bin"

    with pytest.raises(RuntimeError, match="cait.bin"):
        with atomic.written_atomically(graph, companions=[weights]) as temporary:
            with open(temporary, "w") as file:
                file.write("a graph without its weights")

    assert os.listdir(tmp_path) == []


def test_a_companion_elsewhere_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must be in the folder"):
        with atomic.written_atomically(tmp_path / "cait.xml", companions=[tmp_path / "other" / "cait.bin"]):
            pass


def test_write_text_replaces_a_pointer_file_whole(tmp_path):
    pointer = tmp_path / "latest.json"
    pointer.write_text('{"folder": "step-1"}')

    atomic.write_text(pointer, '{"folder": "step-2"}')

    assert pointer.read_text() == '{"folder": "step-2"}'
    assert os.listdir(tmp_path) == ["latest.json"]


def test_a_failed_write_removes_the_folders_it_made_and_only_those(tmp_path):
    """`export_litert(model, 'new/deep/cait.tflite')` that failed in conversion left `new/deep/`."""
    with pytest.raises(RuntimeError, match="conversion failed"):
        with atomic.written_atomically(tmp_path / "new" / "deep" / "cait.tflite"):
            raise RuntimeError("conversion failed")
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError):
        with atomic.written_atomically(tmp_path / "kept" / "new" / "cait.tflite"):
            (tmp_path / "kept" / "notes.txt").write_text("another writer's")
            raise RuntimeError("conversion failed")
    assert sorted(os.listdir(tmp_path / "kept")) == ["notes.txt"]
    with pytest.raises(RuntimeError):
        with atomic.written_atomically(tmp_path / "busy" / "deep" / "cait.tflite"):
            (tmp_path / "busy" / "other.onnx").write_text("another writer's")
            raise RuntimeError("conversion failed")
    assert sorted(os.listdir(tmp_path / "busy")) == ["other.onnx"]


def test_a_file_never_replaces_a_folder_nor_a_folder_a_file(tmp_path):
    """`write_text` to a folder's path replaced the folder, and all it held, with the file (a recipe saved
    to 'runs', or to '', the working folder)."""
    import errno

    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(IsADirectoryError) as raised:
        atomic.write_text(str(folder), "{}")
    assert raised.value.errno == errno.EISDIR and raised.value.filename == str(folder)
    assert str(raised.value) == (f"[Errno 21] is a folder, where a file is written; give the path of a file in it, "
                                 f"or move the folder away: {str(folder)!r}")
    (tmp_path / "notes").write_text("mine too")
    with pytest.raises(NotADirectoryError):
        with atomic.written_atomically(str(tmp_path / "notes")) as temporary:
            write_version(temporary, "new")
    assert (folder / "notes.txt").read_text() == "mine" and (tmp_path / "notes").read_text() == "mine too"
    assert sorted(os.listdir(tmp_path)) == ["notes", "runs"]
