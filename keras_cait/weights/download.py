"""Downloading, verifying, converting and caching the ImageNet checkpoints.

Nothing unverified or half-done ever reaches the cache: the download goes to a
temporary file beside it, is checked (sha256, size, exact keys and shapes),
converted, written to another temporary file and only then renamed into place.
The sha256 is the pinned one, else the one the hub itself sends before the
redirect to its CDN; without either nothing is downloaded.

This follows huggingface_hub's protocol with the standard library rather than
depending on it: the download is one file, and the package keeps to its few
core dependencies.
"""

import hashlib
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings

import keras

from keras_cait import atomic
from keras_cait.weights import registry
from keras_cait.weights.convert import load_state_dict, read_checkpoint

_CHUNK = 1 << 20


def cache_dir():
    """`$KERAS_HOME/models/keras_cait` (KERAS_HOME defaults to ~/.keras), as Keras' own cache."""
    home = os.environ.get("KERAS_HOME", os.path.join(os.path.expanduser("~"), ".keras"))
    return os.path.join(home, "models", "keras_cait")


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    """Hands a redirect back as the response: its headers are the hub's own."""

    def redirect_request(self, *args, **kwargs):
        return None


def _first_response(url):
    """(the response with the body, the headers of the server's first response).

    huggingface.co answers `resolve/main/model.safetensors` with a 302 whose
    `X-Linked-Etag` / `X-Linked-Size` are the file's sha256 and size; the body
    then comes from a CDN whose response need not carry either. So the redirect
    is not followed blindly: its headers are kept, then its Location is opened.
    """
    try:
        response = urllib.request.build_opener(_KeepRedirects).open(url, timeout=60)
        return response, response.headers
    except urllib.error.HTTPError as error:
        if error.code not in (301, 302, 303, 307, 308) or "Location" not in error.headers:
            raise
        headers = error.headers
        error.close()
    return urllib.request.urlopen(urllib.parse.urljoin(url, headers["Location"]), timeout=60), headers


def _expected_digest(arch, url, headers):
    """(sha256, where it comes from): the pinned one, else the hub's X-Linked-Etag."""
    pinned = registry.CHECKPOINTS[arch]["sha256"]
    if pinned:
        return pinned, "the pinned sha256"
    linked = (headers.get("X-Linked-Etag") or "").strip().removeprefix("W/").strip('"')
    if re.fullmatch(r"[0-9a-fA-F]{64}", linked):
        return linked.lower(), "the sha256 the hub sent (X-Linked-Etag)"
    raise OSError(
        f"Cannot verify the ImageNet weights of {arch}: keras_cait pins no sha256 for them and "
        f"the server at {url} sent none (no X-Linked-Etag header on its first response, as "
        f"huggingface.co sends). Nothing was downloaded or cached. Download that file yourself, "
        f"check it, and pass its path: weights='/path/to/model.safetensors'; or point "
        f"{registry.HUB_URL_ENV} at a server that sends the hash."
    )


def download(arch, destination):
    """Downloads `arch`'s model.safetensors to `destination`, verified; returns the URL."""
    url = registry.checkpoint_url(arch)
    try:
        response, hub_headers = _first_response(url)
    except urllib.error.HTTPError as error:
        raise ConnectionError(
            f"The server answered {error.code} {error.reason} for the ImageNet weights of {arch} "
            f"at {url}. If {registry.HUB_URL_ENV} is set, check that it points at a mirror of "
            f"{registry.HUB_URL}; or pass a local file: weights='/path/to/model.safetensors'."
        ) from error
    except (urllib.error.URLError, OSError) as error:
        raise ConnectionError(
            f"Could not download the ImageNet weights of {arch} from {url} ({error}). "
            f"Without network, fetch that file elsewhere and pass its path: "
            f"weights='/path/to/model.safetensors' (or the official {registry.official_pth(arch)})."
        ) from error
    with response:
        digest, digest_source = _expected_digest(arch, url, hub_headers)
        size = hub_headers.get("X-Linked-Size") or response.headers.get("Content-Length")
        size = int(size) if size else None
        progress = keras.utils.Progbar(size, unit_name="B") if size else None
        sha256, received = hashlib.sha256(), 0
        with open(destination, "wb") as file:
            while chunk := response.read(_CHUNK):
                file.write(chunk)
                sha256.update(chunk)
                received += len(chunk)
                if progress:
                    progress.update(received)
    if size is not None and received != size:
        raise OSError(f"Download of {url} is incomplete: {received} of {size} bytes.")
    if sha256.hexdigest() != digest:
        raise OSError(
            f"Download of {url} is corrupted: its sha256 is {sha256.hexdigest()}, "
            f"{digest_source} is {digest}. Nothing was cached; try again."
        )
    return url


def _usable_cache(path):
    """Whether the cached `path` opens as a complete HDF5 file; a broken one is removed."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            file.visititems(lambda name, item: None)
        return True
    except OSError as error:
        warnings.warn(
            f"The cached weights {path} are unreadable ({error}); removing them and "
            "downloading again.",
            stacklevel=3,
        )
        os.remove(path)
        return False


def imagenet_weights(arch, build_reference_model):
    """Path of the cached Keras weights of `arch`, downloading and converting once.

    Args:
        arch: a key of `registry.CHECKPOINTS`, e.g. "cait_s24_224".
        build_reference_model: returns the full model at the checkpoint's own
            resolution, into which the checkpoint is converted and saved.
    """
    directory = cache_dir()
    target = os.path.join(directory, f"{arch}.{registry.TAG}.weights.h5")
    if os.path.exists(target) and _usable_cache(target):
        return target
    os.makedirs(directory, exist_ok=True)
    atomic.remove_stale_partials(directory)
    # Temporary names keep the real suffix last: read_checkpoint goes by the suffix.
    handle, downloaded = tempfile.mkstemp(
        prefix=atomic.partial_prefix(arch), suffix=".safetensors", dir=directory
    )
    os.close(handle)
    converted = downloaded.removesuffix(".safetensors") + ".weights.h5"
    try:
        url = download(arch, downloaded)
        model = build_reference_model()
        load_state_dict(model, read_checkpoint(downloaded), source=f"file downloaded from {url}")
        model.save_weights(converted)
        os.replace(converted, target)
    finally:
        for leftover in (downloaded, converted):
            if os.path.exists(leftover):
                os.remove(leftover)
    return target
