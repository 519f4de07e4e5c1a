"""Downloading, verifying and caching the ImageNet checkpoints: the one way `weights="imagenet"`
and keras-hub's presets get them (`with_imagenet_checkpoint`).

The cache holds timm's `model.safetensors` itself, as the Hugging Face cache does, under
`cache_dir()` as `<arch>.fb_dist_in1k.safetensors`; every load puts it into the model through
timm's key map. Nothing unverified or half-done ever reaches the cache: the download goes to a
temporary file beside it, is checked (sha256, size, then exact keys and shapes as it loads into
the model) and only then renamed into place, its sha256 recorded beside it (`.<name>.sha256`),
which every later load checks it against, as the Hugging Face cache's loads do. The sha256 is the
pinned one, else the one the hub itself sends before the redirect to its CDN; without either
nothing is downloaded.

Every download is bounded: it stops within one byte of the size the server
declares (`X-Linked-Size`, else `Content-Length`), or of the variant's own
float32 size + 1 % where it declares none; every read times out after
`TIMEOUT_SECONDS` of silence; only http(s) URLs are opened, redirects included.
One TCP connect to the hub first (`hf_cache.unreachable`) tells within
`hf_cache.PROBE_SECONDS` that it cannot be reached, where urllib would wait
`TIMEOUT_SECONDS` for a host that drops packets.
Each failure is a `DownloadError` naming the URL and what to do. One process at
a time fills a cache entry (a lock file beside it); the others wait and use its
verified result.

This follows huggingface_hub's protocol with the standard library rather than
depending on it: the download is one file, and the package keeps to its few
core dependencies. Where huggingface_hub is installed, the file comes through
its cache instead, the one timm fills (`hf_cache`); `with_imagenet_checkpoint` chooses.
"""

import contextlib
import hashlib
import http.client
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings

import keras

from keras_cait.errors import Said
from keras_cait.io import atomic
from keras_cait.weights import hf_cache, registry

try:
    import fcntl
except ImportError:  # Windows: no lock, each process downloads on its own
    fcntl = None

_CHUNK = 1 << 20
_MAX_REDIRECTS = 5
# Seconds one connect or one read may wait for the server before the download fails.
TIMEOUT_SECONDS = 60
_LOCK_POLL_SECONDS = 0.1
# Every released checkpoint's head classifies the 1000 ImageNet classes.
IMAGENET_CLASSES = 1000


class DownloadError(Said, ConnectionError):
    """A download of ImageNet weights failed; the message names the URL and what to do.

    A `ConnectionError`, hence an `OSError`: code catching those keeps working. Made from its
    parts (`keras_cait.errors.Said`): the advice names `weights=` as a `Named`, which the command
    line writes as its flag.
    """


def cache_dir():
    """`$KERAS_HOME/models/keras_cait` (KERAS_HOME defaults to ~/.keras), as Keras' own cache."""
    home = os.environ.get("KERAS_HOME", os.path.join(os.path.expanduser("~"), ".keras"))
    return os.path.join(home, "models", "keras_cait")


def _advice(arch):
    return hf_cache.instead_of_imagenet(arch, cache_dir())


def _http_only(arch, url, via=None):
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise DownloadError(
            f"Refusing to download the ImageNet weights of {arch} from {url!r}"
            + (f" (a redirect from {via})" if via else "")
            + f": only http and https URLs are opened. If {registry.HUB_URL_ENV} is set, point "
            f"it at an http(s) mirror of {registry.HUB_URL}. ", *_advice(arch)
        )
    return url


def _reachable(arch, url):
    """Raises DownloadError within `hf_cache.PROBE_SECONDS` where the host of `url` cannot be reached.

    A name that does not resolve or a refused connection fail urllib at once
    too; a host that drops packets would hold it `TIMEOUT_SECONDS`.
    """
    why = hf_cache.unreachable(_http_only(arch, url))
    if why:
        raise DownloadError(
            f"Could not download the ImageNet weights of {arch} from {url}: {why}; nothing was "
            f"downloaded or cached. Try again later. ", *_advice(arch)
        )


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    """Hands a redirect back as the response: its headers are the hub's own."""

    def redirect_request(self, *args, **kwargs):
        return None


def _follow_http_only(arch):
    class FollowHttpOnly(urllib.request.HTTPRedirectHandler):
        """Follows the CDN's own redirects, to http(s) URLs only (urllib allows ftp too)."""

        def http_error_302(self, request, fp, code, message, headers):
            location = headers.get("Location") or headers.get("URI") or ""
            _http_only(arch, urllib.parse.urljoin(request.full_url, location), via=request.full_url)
            return super().http_error_302(request, fp, code, message, headers)

        http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    return FollowHttpOnly


def _first_response(arch, url):
    """(the response with the body, the headers of the hub's own response).

    huggingface.co answers `resolve/main/model.safetensors` with a 302 whose
    `X-Linked-Etag` / `X-Linked-Size` are the file's sha256 and size; the body
    then comes from a CDN whose response need not carry either. So redirects
    are not followed blindly: relative ones stay on the hub (a renamed
    repository) and are followed; the headers of the one to another host are
    kept, as huggingface_hub does.
    """
    opener = urllib.request.build_opener(_KeepRedirects)
    for _ in range(_MAX_REDIRECTS):
        _http_only(arch, url)
        try:
            response = opener.open(url, timeout=TIMEOUT_SECONDS)
            return response, response.headers
        except urllib.error.HTTPError as error:
            if error.code not in (301, 302, 303, 307, 308) or "Location" not in error.headers:
                raise
            headers = error.headers
            error.close()
        location = headers["Location"]
        if urllib.parse.urlsplit(location).netloc:  # to another host: the CDN
            _http_only(arch, location, via=url)
            cdn = urllib.request.build_opener(_follow_http_only(arch))
            return cdn.open(location, timeout=TIMEOUT_SECONDS), headers
        url = urllib.parse.urljoin(url, location)
    raise DownloadError(
        f"More than {_MAX_REDIRECTS} redirects within the hub from {url}. ", *_advice(arch)
    )


def _expected_digest(arch, url, headers):
    """(sha256, where it comes from): the pinned one, else the hub's X-Linked-Etag."""
    pinned = registry.CHECKPOINTS[arch]["sha256"]
    if pinned:
        return pinned, "the pinned sha256"
    linked = (headers.get("X-Linked-Etag") or "").strip().removeprefix("W/").strip('"')
    if re.fullmatch(r"[0-9a-fA-F]{64}", linked):
        return linked.lower(), "the sha256 the hub sent (X-Linked-Etag)"
    raise DownloadError(
        f"Cannot verify the ImageNet weights of {arch}: keras_cait pins no sha256 for them and "
        f"the server at {url} sent none (no X-Linked-Etag header on its first response, as "
        f"huggingface.co sends). Nothing was downloaded or cached. Point {registry.HUB_URL_ENV} at a "
        "server that sends the hash, or download that file yourself and check it. ", *_advice(arch)
    )


def _declared_size(arch, url, hub_headers, response, max_bytes):
    """The size the server declares (None: none), refused when above `max_bytes`."""
    declared = hub_headers.get("X-Linked-Size") or response.headers.get("Content-Length")
    if declared is None:
        return None
    if not declared.strip().isdigit():
        raise DownloadError(
            f"The server at {url} declares the size {declared!r}, not a number of bytes. ", *_advice(arch)
        )
    if max_bytes is not None and int(declared) > max_bytes:
        raise DownloadError(
            f"The server at {url} declares {int(declared)} bytes for the ImageNet weights of "
            f"{arch}, more than the {max_bytes} bytes they can take; nothing was downloaded. ", *_advice(arch)
        )
    return int(declared)


def _copy_bounded(response, file, limit, sha256, progress):
    """Copies at most `limit` + 1 bytes of `response` into `file`; returns how many came."""
    received = 0
    while chunk := response.read(min(_CHUNK, limit + 1 - received)):
        file.write(chunk)
        sha256.update(chunk)
        received += len(chunk)
        if progress:
            progress.update(min(received, progress.target))
    return received


def download(arch, destination, max_bytes=None):
    """Downloads `arch`'s model.safetensors to `destination`, verified; returns the URL.

    Args:
        arch: a key of `registry.CHECKPOINTS`.
        destination: the file to write.
        max_bytes: the most the file can hold; a server that declares more is
            refused, and one that declares nothing is cut off after it.

    Raises:
        DownloadError: naming the URL and what to do, for every network error,
            a host that cannot be reached (`hf_cache.PROBE_SECONDS`), a
            non-http(s) URL or redirect, a silent server (`TIMEOUT_SECONDS`),
            a body longer or shorter than declared, or a wrong sha256.
    """
    url = registry.checkpoint_url(arch)
    _reachable(arch, url)
    try:
        response, hub_headers = _first_response(arch, url)
        with response:
            digest, digest_source = _expected_digest(arch, url, hub_headers)
            size = _declared_size(arch, url, hub_headers, response, max_bytes)
            limit = size if size is not None else max_bytes
            if limit is None:
                raise DownloadError(
                    f"The server at {url} declares no size and no bound was given. ", *_advice(arch)
                )
            progress = keras.utils.Progbar(size, unit_name="B") if size else None
            sha256 = hashlib.sha256()
            with open(destination, "wb") as file:
                received = _copy_bounded(response, file, limit, sha256, progress)
    except DownloadError:
        raise
    except urllib.error.HTTPError as error:
        raise DownloadError(
            f"The server answered {error.code} {error.reason} for the ImageNet weights of {arch} "
            f"at {url}. If {registry.HUB_URL_ENV} is set, check that it points at a mirror of "
            f"{registry.HUB_URL}. ", *_advice(arch)
        ) from error
    except (OSError, http.client.HTTPException) as error:  # timeouts, resets, cut-off bodies
        if isinstance(error, OSError) and error.filename == destination:
            raise
        received = os.path.getsize(destination) if os.path.exists(destination) else 0
        raise DownloadError(
            f"Could not download the ImageNet weights of {arch} from {url} "
            f"({type(error).__name__}: {error or 'no reason given'}) after {received} bytes; "
            f"nothing was cached. Try again later. ", *_advice(arch)
        ) from error
    if received > limit:
        raise DownloadError(
            f"Download of {url} stopped: the server sent more than the {limit} bytes "
            + ("it declared" if size is not None else f"the weights of {arch} can take")
            + ". Nothing was cached. ", *_advice(arch)
        )
    if size is not None and received != size:
        raise DownloadError(
            f"Download of {url} is incomplete: {received} of {size} bytes. Nothing was cached; "
            "try again. ", *_advice(arch)
        )
    if sha256.hexdigest() != digest:
        raise DownloadError(
            f"Download of {url} is corrupted: its sha256 is {sha256.hexdigest()}, "
            f"{digest_source} is {digest}. Nothing was cached; try again. ", *_advice(arch)
        )
    return url


def size_bound(model, arch):
    """The most bytes `arch`'s checkpoint takes, from `model` of its variant (at any input size,
    with or without a head): 4 bytes a parameter of the model with the checkpoint's position
    embedding and its 1000-class head, + 1 % (the header)."""
    width = model.get_layer("final_norm").gamma.shape[0]
    grid = registry.CHECKPOINTS[arch]["resolution"] // model.get_layer("patch_embedding").patch_size
    replaced = {id(weight) for layer in model.layers if layer.name in ("position_embedding", "predictions")
                for weight in layer.weights}
    parameters = sum(int(keras.ops.size(weight)) for weight in model.weights if id(weight) not in replaced)
    parameters += grid * grid * width + (width + 1) * IMAGENET_CLASSES
    return 4 * parameters * 101 // 100


def cache_entry(arch):
    """Where keras_cait's own cache keeps `arch`'s verified model.safetensors."""
    return os.path.join(cache_dir(), f"{arch}.{registry.TAG}.safetensors")


def cached_checkpoint(arch):
    """The path of `arch`'s checkpoint where a cache holds it (the Hugging Face cache where
    huggingface_hub is installed, else keras_cait's), else None; nothing is asked of the network."""
    huggingface_hub = hf_cache.huggingface_hub_or_none()
    if huggingface_hub is not None:
        return hf_cache.cached(huggingface_hub, arch)
    return cache_entry(arch) if os.path.isfile(cache_entry(arch)) else None


def _usable_cache(path):
    """Whether the cached `path` is a safetensors file whose header reads; anything else there
    is removed."""
    from safetensors import safe_open

    if not os.path.lexists(path):
        return False
    if os.path.isfile(path):
        try:
            with safe_open(path, framework="numpy"):
                return True
        except Exception as error:  # safetensors' own error type is not public
            problem = f"are unreadable ({error})"
    else:
        problem = "are not a file"
    warnings.warn(
        f"The cached weights {path} {problem}; removing them and downloading again.",
        stacklevel=3,
    )
    remove_entry(path)
    return False


def remove_entry(path):
    """Removes a cache entry, whatever it is (a file, a link, a folder), and its recorded sha256."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(_digest_path(path))


def _digest_path(target):
    directory, name = os.path.split(target)
    return os.path.join(directory, f".{name}.sha256")


def _record_digest(target, sha256=None):
    """Writes the sha256 of the verified cache entry `target` (`sha256`, where already read) beside it
    (`.<name>.sha256`)."""
    atomic.write_text(_digest_path(target), (sha256 or hf_cache.sha256_of(target)) + "\n")


def _intact(target, arch):
    """Whether the cached `target` holds the bytes verified when it was downloaded: its pinned sha256,
    else the one recorded beside it then. An entry that has changed since is removed (said). One
    cached by an earlier keras_cait, which recorded none, was verified as it came: recorded now."""
    try:
        with open(_digest_path(target)) as file:
            recorded = file.read().strip()
    except (OSError, ValueError):
        recorded = None
    expected = registry.CHECKPOINTS[arch]["sha256"] or recorded
    actual = hf_cache.sha256_of(target)
    if expected is None:
        _record_digest(target, actual)
        return True
    if actual == expected:
        return True
    warnings.warn(f"The cached weights {target} have changed since they were verified (sha256 {actual}, not "
                  f"{expected}); removing them and downloading again.", stacklevel=3)
    remove_entry(target)
    return False


def _lock_path(target):
    directory, name = os.path.split(target)
    return os.path.join(directory, f".{name}.lock")


@contextlib.contextmanager
def one_download_at_a_time(target):
    """Holds the lock of the cache entry `target` (the file `.<name>.lock` beside it).

    A second process waits here until the first is done; a killed holder's lock
    is released by the kernel at once (flock), so it blocks no one. The holder
    removes the file while it still holds it; a waiter that then gets the lock
    of the removed file takes the lock again on the new one.
    """
    if fcntl is None:
        yield
        return
    path = _lock_path(target)
    told = False
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        holder = os.pread(handle, 32, 0).decode(errors="replace").strip()
                        print(f"Waiting for another process (pid {holder or '?'}) downloading "
                              f"{os.path.basename(target)}...", file=sys.stderr, flush=True)
                        told = True
                    time.sleep(_LOCK_POLL_SECONDS)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(handle), os.stat(path)):
                    break
        except BaseException:
            os.close(handle)
            raise
        os.close(handle)  # locked a file the previous holder had removed: lock the new one
    try:
        os.ftruncate(handle, 0)
        os.pwrite(handle, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.close(handle)


def _writable_cache(directory, arch):
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK):
            raise PermissionError(13, "Permission denied", directory)
    except PermissionError as error:
        raise PermissionError(
            error.errno,
            f"The weights cache {directory} is not writable ({error.strerror}: "
            f"{error.filename}). Set KERAS_HOME to a folder you can write, or pass a local "
            f"file: weights='/path/to/model.safetensors' (the official "
            f"{registry.official_pth(arch)}).",
            directory,
        ) from error
    except (NotADirectoryError, FileExistsError) as error:  # a file where a folder of the path must be
        home = os.environ.get("KERAS_HOME")
        raise type(error)(
            error.errno,
            f"The weights cache {directory} cannot be made: {error.filename} or a folder above it is a file, "
            f"not a folder" + (f" (KERAS_HOME={home!r})" if home is not None else "") + ". Set KERAS_HOME to a "
            f"folder, or pass a local file: weights='/path/to/model.safetensors' (the official "
            f"{registry.official_pth(arch)}).",
            directory,
        ) from error


def with_imagenet_checkpoint(arch, max_bytes, load):
    """Calls `load(path, description)` with `arch`'s verified model.safetensors, fetched once.

    Through the Hugging Face cache where huggingface_hub is installed and
    KERAS_CAIT_HUB_URL is not set (`hf_cache`); else from keras_cait's cache
    (`cache_entry`), where a download (`download`, at most `max_bytes`) enters
    only once `load` took it: every key and shape fitted. A cache entry that is
    unreadable, not a file, or that `load` refuses (another variant's file) is
    removed and downloaded again, once.

    Args:
        arch: a key of `registry.CHECKPOINTS`, e.g. "cait_s24_224".
        max_bytes: the most the file can hold (`size_bound`).
        load: puts the checkpoint into a model; raises ValueError where it does not fit.
    """
    huggingface_hub = hf_cache.huggingface_hub_or_none()
    if huggingface_hub is not None:
        return load(*hf_cache.checkpoint(huggingface_hub, arch))
    target = cache_entry(arch)
    if _usable_cache(target) and _intact(target, arch):
        try:
            return load(target, f"cached file {target}")
        except ValueError as error:
            warnings.warn(f"The cached weights {target} do not fit {arch} ({error}); removing them and "
                          "downloading again.", stacklevel=3)
            remove_entry(target)
    _writable_cache(cache_dir(), arch)
    with one_download_at_a_time(target):
        if _usable_cache(target) and _intact(target, arch):  # another process filled it while this one waited
            return load(target, f"cached file {target}")
        with atomic.written_atomically(target) as partial:
            url = download(arch, partial, max_bytes=max_bytes)
            loaded = load(partial, f"file downloaded from {url}")
        _record_digest(target)  # what a later load checks the entry against (`_intact`)
        return loaded
