"""A fake Hugging Face hub on 127.0.0.1 and the `hub` / `hf` fixtures that point huggingface_hub at it.

The hub answers as huggingface.co does: `HEAD` and `GET .../resolve/main/model.safetensors`
get a 302 carrying `X-Repo-Commit`, `X-Linked-Etag` (the sha256) and `X-Linked-Size`, to a
CDN on another host name (`localhost`) that sends the bytes. huggingface_hub reads the HF_*
variables when it is imported, so `hf` sets them and reloads its `constants`, as a fresh
process would read them. Test files use the fixtures with
`from tests.weights.fake_hf_hub import FakeHub, hf, hub  # noqa: F401`.

`unreachable_url` and `load_in_a_fresh_process` stand for no network: a hub that refuses,
does not resolve or drops packets, and a new process that counts its connection attempts.
"""

import contextlib
import hashlib
import http.server
import importlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse

import pytest

from keras_cait.weights.registry import HUB_URL_ENV, TAG

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN", HUB_URL_ENV)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


class FakeHub:
    """huggingface.co for `timm/<arch>.fb_dist_in1k/model.safetensors`, and its CDN."""

    def __init__(self):
        self.files = {}  # resolve path -> (hub headers, body the CDN sends)
        self.requests = []  # (method, path, Authorization header) of the file and its CDN copy
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, send_body):
                if "/resolve/" in self.path:  # not huggingface_hub's own /api calls
                    hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
                if self.path in hub.files:  # the hub: 302 with the file's metadata
                    headers, _ = hub.files[self.path]
                    self.send_response(302)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                cdn = {hub.cdn_path(path): body for path, (_, body) in hub.files.items()}
                if self.path not in cdn:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(cdn[self.path])))
                self.end_headers()
                if send_body:
                    self.wfile.write(cdn[self.path])

            def do_HEAD(self):
                self.answer(send_body=False)

            def do_GET(self):
                self.answer(send_body=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        self.cdn_url = f"http://localhost:{port}"  # another host: huggingface_hub stops at the 302
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def path(arch):
        return f"/timm/{arch}.{TAG}/resolve/main/model.safetensors"

    @staticmethod
    def cdn_path(path):
        return "/cdn" + path

    def serve(self, arch, body, cdn_body=None):
        """Serves `body` as `arch`'s file, its sha256 on the 302; the CDN sends `cdn_body` (default `body`)."""
        headers = {
            "Location": self.cdn_url + self.cdn_path(self.path(arch)),
            "X-Repo-Commit": COMMIT,
            "X-Linked-Etag": f'"{sha256(body)}"',
            "X-Linked-Size": str(len(body)),
            "ETag": '"0a1b2c"',  # the git pointer's etag, which X-Linked-Etag overrides
        }
        self.files[self.path(arch)] = (headers, body if cdn_body is None else cdn_body)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def reload_huggingface_hub_settings():
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)


@pytest.fixture
def hub():
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture
def hf(tmp_path, hub, keras_cache):
    """Points huggingface_hub at the fake hub and an empty HF_HOME; `hf.set(NAME=value)` sets more."""

    class Settings:
        home = tmp_path / "hf_home"
        cache = home / "hub"

        def set(self, **variables):
            for name, value in variables.items():
                patch.setenv(name, value)
            reload_huggingface_hub_settings()

        def repo(self, arch):
            return self.cache / f"models--timm--{arch}.{TAG}"

    with pytest.MonkeyPatch.context() as patch:
        for name in HF_VARIABLES:
            patch.delenv(name, raising=False)
        settings = Settings()
        settings.set(HF_HOME=str(settings.home), HF_ENDPOINT=hub.url)
        yield settings
    reload_huggingface_hub_settings()


UNREACHABLE = ("refused", "unresolvable", "silent")
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@contextlib.contextmanager
def unreachable_url(kind):
    """The URL of a host that cannot be reached, one of `UNREACHABLE`.

    refused: a 127.0.0.1 port nothing listens on. unresolvable: `.invalid` never
    resolves (RFC 2606), as any name without network. silent: a 127.0.0.1 port whose
    accept queue is full, so that the kernel drops each new SYN, as a firewall does.
    """
    if kind == "unresolvable":
        yield "http://nonexistent.invalid"
        return
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if kind == "refused":
            listener.close()
        else:
            listener.listen(0)
            for _ in range(3):  # more than the queue holds: the next SYN is dropped
                filler = stack.enter_context(socket.socket())
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
        yield f"http://127.0.0.1:{port}"


LOAD = """
import json, socket, sys, time

host, attempts = sys.argv[1], []
resolve = socket.getaddrinfo


def counted(name, *args, **kwargs):  # every connection, huggingface_hub's and urllib's, resolves first
    if name == host:
        attempts.append(name)
    return resolve(name, *args, **kwargs)


socket.getaddrinfo = counted
import keras_cait

start = time.monotonic()
try:
    keras_cait.CaiT_XXS24(weights="imagenet")
    error = None
except Exception as raised:
    error = raised
print(json.dumps(dict(seconds=time.monotonic() - start, attempts=len(attempts),
                      error=type(error).__name__, connection_error=isinstance(error, ConnectionError),
                      message=str(error))))
"""


def load_in_a_fresh_process(url, home, **variables):
    """Runs `CaiT_XXS24(weights="imagenet")` in a new process with empty caches under `home`.

    `variables` (HF_ENDPOINT or KERAS_CAIT_HUB_URL) point it at `url`, whose host
    name's resolutions (one per connection attempt) are counted. Returns the outcome:
    seconds (the call, import not counted), attempts, error, connection_error, message.
    """
    env = {name: value for name, value in os.environ.items()
           if name not in HF_VARIABLES and name.lower() not in PROXY_VARIABLES}
    env.update(HF_HOME=os.path.join(home, "hf_home"), KERAS_HOME=os.path.join(home, "keras_home"),
               TF_CPP_MIN_LOG_LEVEL="3", **variables)
    try:
        done = subprocess.run([sys.executable, "-c", LOAD, urllib.parse.urlsplit(url).hostname], env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the load against {url} had not failed after 120 s") from None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
