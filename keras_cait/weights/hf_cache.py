"""The ImageNet checkpoints through the Hugging Face cache, the one timm fills.

Where huggingface_hub is installed (timm installs it), `weights="imagenet"`
asks it for `timm/<arch>.fb_dist_in1k/model.safetensors`, exactly as timm does:
a file timm already downloaded is not downloaded again, and huggingface_hub's
own settings apply, read when it is imported: `HF_HOME` / `HF_HUB_CACHE` (where
the cache is), `HF_ENDPOINT` (a mirror), `HF_HUB_OFFLINE=1` (the cache only,
no network) and `HF_TOKEN`.

huggingface_hub names each cached blob after the sha256 the hub sent in
`X-Linked-Etag` (`<cache>/models--timm--<arch>.fb_dist_in1k/blobs/<sha256>`)
but does not check the bytes against it. keras_cait does, before the file is
loaded: against the pinned sha256 where `registry.CHECKPOINTS` has one,
else against the blob's name. A blob whose bytes do not match its name is
removed from the cache (with its snapshot link) and refused, so that neither
keras_cait nor timm loads it again. The key set and shapes are checked next,
as it loads (`keras_cait.weights.load_state_dict`).

A file not cached is asked for only once the hub answers one TCP connect
(`unreachable`): without network huggingface_hub would retry its request five
times (25 s, minutes against a host that drops packets) before failing. A
cached file, or HF_HUB_OFFLINE=1, makes no connection for it.

Setting `KERAS_CAIT_HUB_URL` (a plain file mirror) keeps keras_cait's own
downloader (`download.download`), as does an environment without
huggingface_hub.
"""

import hashlib
import os
import re
import socket
import time
import urllib.parse
import urllib.request

from keras_cait.errors import Named, Said, quietly_caused
from keras_cait.weights import registry

# What the errors of getting the weights advise: a local file instead (`weights=` as each caller
# writes it: Python's keyword, the command line's flag).
LOCAL_FILE = Named("weights", "/path/to/model.safetensors")


def instead_of_imagenet(arch, cache=None):
    """The end of every error of getting `arch`'s ImageNet weights (no network, a broken mirror):
    what works without them, random weights with the recipe that trains from them or a checkpoint
    file of a kind `weights=` reads, and (given) the `cache` the downloads go to."""
    cached = f"; downloaded weights are cached in {cache}" if cache else ""
    return ("Without them, ", Named("weights", None), " trains from random weights (with "
            "keras_cait.training.RECIPES['scratch'], the recipe that learns from them on a small folder), "
            "or pass a checkpoint file: ", LOCAL_FILE, f" (a {', '.join(registry.WEIGHT_FILES[:-1])} or "
            f"{registry.WEIGHT_FILES[-1]} file, e.g. the official {registry.official_pth(arch)}){cached}.")


class CacheError(Said, OSError):
    """The weights in the Hugging Face cache cannot be used (corrupted, unverifiable)."""


class NotCached(Said, ConnectionError):
    """The weights are not in the Hugging Face cache, and the hub cannot give them."""

FILENAME = "model.safetensors"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
# Seconds the one TCP connect of `unreachable` may take (resolving the name not counted):
# time for a SYN lost twice (resent after 1 s and 3 s) to be answered.
PROBE_SECONDS = 5


def huggingface_hub_or_none():
    """The huggingface_hub module when it is installed and KERAS_CAIT_HUB_URL is not set, else None."""
    if registry.hub_url_override():
        return None
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def first_hop(url):
    """(host, port, through a proxy) a request for `url` connects to: its proxy, else its host.

    The proxy is the one urllib and huggingface_hub's httpx both take from
    http_proxy / https_proxy / all_proxy unless no_proxy exempts the host: a
    host reached only through a proxy is not unreachable.
    """
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    proxied = bool(proxy) and not urllib.request.proxy_bypass(parts.hostname or "")
    if proxied:
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), proxied


def unreachable(url, seconds=PROBE_SECONDS):
    """Why no TCP connection to `url`'s host (or its proxy) opens, as text; None when one does.

    One connect, closed at once, finds out what a download would take its
    retries to learn: a name that does not resolve, a refused connection or no
    route fail at once, a host that drops packets within `seconds` (every
    address of the name is tried within that one deadline).
    """
    host, port, proxied = first_hop(url)
    where = f"{'the proxy ' if proxied else ''}{host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        return f"cannot resolve {where} ({type(error).__name__}: {error})"
    deadline = time.monotonic() + seconds
    failure = None
    for family, kind, protocol, _, address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.socket(family, kind, protocol) as connection:
                connection.settimeout(left)
                connection.connect(address)
            return None
        except OSError as error:
            failure = error
    if failure is None or isinstance(failure, TimeoutError):
        return f"no answer from {where} within {seconds} s"
    return f"cannot connect to {where} ({type(failure).__name__}: {failure})"


def repo_id(arch):
    """timm's repository of a checkpoint on the hub, e.g. "timm/cait_s24_224.fb_dist_in1k"."""
    return f"timm/{arch}.{registry.TAG}"


def sha256_of(path):
    """The sha256 of the file at `path`, as hex."""
    sha256 = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            sha256.update(chunk)
    return sha256.hexdigest()


def _hub_sha256(huggingface_hub, arch):
    """The sha256 the hub sends for the file (its X-Linked-Etag), from a HEAD request.

    Needed only where the cache keeps no blob named by it: huggingface_hub
    without symlinks (Windows without developer mode) moves the blob to the
    snapshot's file name.
    """
    url = huggingface_hub.hf_hub_url(repo_id(arch), FILENAME)
    try:
        etag = huggingface_hub.get_hf_file_metadata(url).etag or ""
    except Exception as error:  # noqa: BLE001  any failure means: no hash to check against
        raise CacheError(
            f"Cannot verify the ImageNet weights of {arch} in the Hugging Face cache: the cached "
            f"file is no blob named by its sha256 (a cache without symlinks), keras_cait pins no "
            f"sha256 for it, and asking {url} for it failed ({error}). Pass the file's path "
            "instead: ", LOCAL_FILE, "."
        ) from error
    if not _SHA256.fullmatch(etag):
        raise CacheError(
            f"Cannot verify the ImageNet weights of {arch}: {url} sent no sha256 (ETag {etag!r}) "
            "and keras_cait pins none. Pass a file you checked: ", LOCAL_FILE, "."
        )
    return etag


def _remove(*paths):
    """Removes `paths`; returns what could not be removed, as text for an error message."""
    failures = []
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            failures.append(f"{path} ({error.strerror})")
    return "; ".join(failures)


def verify(huggingface_hub, arch, snapshot_path):
    """Checks the bytes of the cached file against the pinned sha256, else its blob's name.

    A blob whose bytes differ from its name is removed with its snapshot link
    before the error is raised.
    """
    blob = os.path.realpath(snapshot_path)
    name = os.path.basename(blob)
    blob_sha256 = name if blob != os.path.abspath(snapshot_path) and _SHA256.fullmatch(name) else None
    actual = sha256_of(blob)
    if blob_sha256 is not None and actual != blob_sha256:
        failed = _remove(snapshot_path, blob)
        removed = (f"It could not be removed: {failed}; delete it yourself" if failed
                   else "It was removed from the cache")
        raise OSError(
            f"The Hugging Face cache holds corrupted ImageNet weights of {arch}: the sha256 of "
            f"{blob} is {actual}, not the {blob_sha256} it is named after (the hash the hub sent). "
            f"{removed}, and nothing was converted; try again to download it anew."
        )
    pinned = registry.CHECKPOINTS[arch]["sha256"]
    expected, source = (pinned, "the pinned sha256") if pinned else (
        (blob_sha256, "the sha256 the hub sent (the blob's name)") if blob_sha256
        else (_hub_sha256(huggingface_hub, arch), "the sha256 the hub sent (X-Linked-Etag)")
    )
    if actual != expected:
        raise CacheError(
            f"The ImageNet weights of {arch} in the Hugging Face cache ({blob}) are not the ones "
            f"keras_cait expects: their sha256 is {actual}, {source} is {expected}. Nothing was "
            "converted. If the hub's file changed, pass it explicitly once you trust it: ",
            Named("weights", snapshot_path), "."
        )


def _own_http_client():
    """Whether huggingface_hub makes its requests with its default client.

    One the user set (`set_client_factory`: a proxy of its own, say) may reach
    the hub by a route `first_hop` does not know, so the hub is not probed then.
    """
    try:
        from huggingface_hub.utils import _http
    except ImportError:
        return True
    factory = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    return factory is None or factory is getattr(_http, "default_client_factory", None)


def _unreachable_hub(huggingface_hub, arch):
    """Why the hub cannot be reached (`unreachable`), probed only where a download is due.

    None, without a connection, where huggingface_hub would send no request
    (HF_HUB_OFFLINE=1) or needs no answer (the file is cached: it falls back to
    it after one failed request, without retries), or where a client of the
    user's own may route otherwise.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or not _own_http_client() or cached(huggingface_hub, arch):
        return None
    return unreachable(constants.ENDPOINT)


def cached(huggingface_hub, arch):
    """The path of `arch`'s model.safetensors in the Hugging Face cache, else None (nothing asked)."""
    path = huggingface_hub.try_to_load_from_cache(repo_id(arch), FILENAME)
    return path if isinstance(path, str) else None


def _not_cached(arch, cache, reason):
    return NotCached(
        f"The ImageNet weights of {arch} are not in the Hugging Face cache ({cache}) and "
        f"{reason}. Download them where there is network (timm.create_model('{arch}', "
        f"pretrained=True) fills the same cache; HF_HUB_OFFLINE=1 then reads it with no network). ",
        *instead_of_imagenet(arch)
    )


def checkpoint(huggingface_hub, arch):
    """(path, description) of `arch`'s verified model.safetensors in the Hugging Face cache.

    Downloads it through huggingface_hub unless it is cached already, once one
    connect found the hub reachable.
    """
    from huggingface_hub import constants, errors

    where = f"{constants.ENDPOINT}/{repo_id(arch)}"
    cache = constants.HF_HUB_CACHE
    why = _unreachable_hub(huggingface_hub, arch)
    if why:
        raise _not_cached(arch, cache, f"{where} is unreachable: {why}")
    try:
        path = huggingface_hub.hf_hub_download(repo_id(arch), FILENAME)
    except errors.LocalEntryNotFoundError as error:
        reason = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
                  else f"{where} is unreachable")
        raise quietly_caused(_not_cached(arch, cache, reason), error) from None
    except errors.HfHubHTTPError as error:
        raise quietly_caused(NotCached(
            f"The Hugging Face hub at {where} refused the ImageNet weights of {arch} ({error}). "
            "If HF_ENDPOINT is set, check that it points at a mirror of https://huggingface.co. ",
            *instead_of_imagenet(arch)
        ), error) from None
    verify(huggingface_hub, arch, path)
    return path, f"Hugging Face cache file {path}"
