"""Writing files and folders so that a failure never leaves half of one behind.

Work in progress lives beside its destination under a hidden name that records
the writer's process id, `.<name>.partial-<pid>-<random><suffix>`; it is not a
number, so TF Serving, which watches a model base path, never loads it. The
next writer in the same folder removes what dead processes left behind.
"""

import contextlib
import ctypes
import errno
import os
import re
import shutil
import sys
import tempfile
import time

# A leftover whose writer's pid is alive (or reused) is removed once untouched for this long.
STALE_AFTER_SECONDS = 24 * 3600
# Exactly the names partial_prefix + tempfile write: the 8 characters tempfile draws, then
# no suffix (a workspace folder) or a checkpoint's; a user's `.notes.partial-1-mine` is not ours.
_PARTIAL = re.compile(
    r"^\..+\.partial-(?P<pid>\d+)-[a-z0-9_]{8}(\.safetensors|\.weights\.h5)?$"
)
# Names of keras_cait before they carried the pid: only their age tells they are stale.
_UNDATED_PARTIAL = re.compile(
    r"^\..+(\.partial-[a-z0-9_]{8}|\.[a-z0-9_]{8}\.part\.(safetensors|weights\.h5))$"
)
_PREVIOUS = ".previous"


def partial_prefix(name):
    """The start of the hidden name of work in progress for `name` by this process."""
    return f".{name}.partial-{os.getpid()}-"


def _writer_is_gone(path, pid):
    if pid is None:
        return time.time() - os.lstat(path).st_mtime > STALE_AFTER_SECONDS
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return time.time() - os.lstat(path).st_mtime > STALE_AFTER_SECONDS


def remove_stale_partials(parent):
    """Removes the work in progress that dead writers left in `parent`; returns what it removed.

    Only names this module writes are touched (`partial_prefix` with a pid, then
    tempfile's 8 characters); a pid still alive keeps its work for 24 hours.

    A leftover folder holding `.previous` is an overwrite killed between its two
    renames (where the atomic exchange is unavailable): the old version is put
    back if nothing took its place.
    """
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        match = _PARTIAL.match(entry)
        undated = not match and _UNDATED_PARTIAL.match(entry)
        path = os.path.join(parent, entry)
        try:
            if not (match or undated) or not _writer_is_gone(path, match and int(match["pid"])):
                continue
        except FileNotFoundError:  # another process cleaned it meanwhile
            continue
        target = os.path.join(parent, entry[1:].split(".partial-")[0])
        previous = os.path.join(path, _PREVIOUS)
        if os.path.isdir(previous) and not os.path.exists(target):
            os.replace(previous, target)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        removed.append(path)
    return removed


def _exchange(first, second):
    """Swaps two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # e.g. a file system without it
        return False
    raise OSError(code, os.strerror(code), second)


def replace_folder(new, path):
    """Puts the folder `new` at `path`, where a folder already is, with no moment without one.

    On Linux the two are exchanged in one step; elsewhere the old folder is moved
    into `new`'s parent as `.previous` first, which `remove_stale_partials` puts back
    if the process dies before the second rename. The old folder ends up in
    `new`'s parent (a workspace) for the caller to delete.
    """
    if _exchange(new, path):
        return
    previous = os.path.join(os.path.dirname(new), _PREVIOUS)
    os.replace(path, previous)
    try:
        os.replace(new, path)
    except OSError:
        os.replace(previous, path)
        raise


@contextlib.contextmanager
def written_atomically(path, overwrite=True, companions=()):
    """Yields a temporary path beside `path`; moves it to `path` only if the block succeeds.

    Works for a file or a folder. An existing `path` is replaced only with
    `overwrite`, and a folder is swapped in without a moment when neither the
    old nor the new one is there (`replace_folder`).

    `companions` are files in `path`'s folder that the block writes together with
    it (OpenVINO's `.bin` beside its `.xml`): the block leaves each under its own
    name next to the yielded path, and they are moved into place before `path`,
    so a new `path` never meets old companions. A block that fails leaves nothing behind, the
    folders made for `path` included (where nothing else was put in them meanwhile).
    """
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    companions = [os.path.abspath(os.fspath(companion)) for companion in companions]
    if any(os.path.dirname(companion) != parent for companion in companions):
        raise ValueError(f"companions {companions} must be in the folder of {path!r}.")
    created = _first_missing(parent)
    os.makedirs(parent, exist_ok=True)
    remove_stale_partials(parent)
    workspace = tempfile.mkdtemp(prefix=partial_prefix(name), dir=parent)
    done = False
    try:
        written = os.path.join(workspace, name)
        yield written
        for target in [*companions, path]:
            if not os.path.exists(os.path.join(workspace, os.path.basename(target))):
                raise RuntimeError(f"The writer of {path!r} wrote nothing for {target!r}.")
            _check_same_kind(os.path.join(workspace, os.path.basename(target)), target)
        for companion in companions:
            os.replace(os.path.join(workspace, os.path.basename(companion)), companion)
        if os.path.isdir(path) and overwrite:
            replace_folder(written, path)
        else:
            os.replace(written, path)
        done = True
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        if not done and created:  # the folders made for `path`, where they are still empty
            _remove_empty(parent, up_to=created)


def _check_same_kind(written, target):
    """A file never replaces a folder, nor a folder a file: `Recipe.save('runs')` of a folder (or of '',
    the working folder) used to replace it, and all it held, with one JSON file."""
    if os.path.isdir(target) and not os.path.isdir(written):
        raise IsADirectoryError(errno.EISDIR, "is a folder, where a file is written; give the path of a file in it, "
                                "or move the folder away", target)
    if os.path.lexists(target) and not os.path.isdir(target) and os.path.isdir(written):
        raise NotADirectoryError(errno.ENOTDIR, "is a file, where a folder is written; give another path, or "
                                 "move the file away", target)


def _first_missing(folder):
    """The outermost folder of `folder`'s path that does not exist yet (`folder` itself at most), or None."""
    missing = None
    while not os.path.lexists(folder):
        missing, folder = folder, os.path.dirname(folder)
    return missing


def _remove_empty(folder, up_to):
    """Removes `folder` and the folders above it up to `up_to`, stopping at the first that is not empty."""
    while True:
        try:
            os.rmdir(folder)
        except OSError:
            return
        if folder == up_to:
            return
        folder = os.path.dirname(folder)


def write_text(path, text):
    """Writes `text` to the file `path` in one step: a reader sees the old file or the new one."""
    with written_atomically(path) as temporary, open(temporary, "w") as file:
        file.write(text)


def unwritable(folder, given=None):
    """Why files cannot be written in `folder` (which may not exist yet: the nearest part of it that
    exists decides), as `(problem, what to do)`, or None where they can. `given`: the path the
    caller was given, where `folder` is the one that would hold it."""
    folder = os.path.abspath(folder)
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        named = os.path.abspath(folder if given is None else given)
        return (f"{'is a file' if existing == named else f'is inside the file {existing}'}, not a folder",
                "choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"cannot write in {existing} (permission denied)",
                "choose a folder you can write to, or fix its permissions")
    return None
