"""The remote blob tier: a Bazel-remote-cache-shaped place where stores share avatars.

Layout under the remote URL (`http(s)://host/prefix`, `s3://bucket/prefix`, ...):

- `cas/<sha256>`: one store blob (the codec bytes exactly as LMDB holds them), named by
  the SHA-256 of those bytes, which is what bazel-remote checks on a CAS PUT;
- `ac/<sha256("hotplate:avatar:" + avatar key)>`: the avatar's manifest, JSON (see
  cachestore/remote/pull.py), which names every stage record and, per blob, its xxh3-128 (the
  store's name for it), its SHA-256 (the remote's) and its size. bazel-remote wants
  64 hex digits under ac/ too, hence the hash of the key rather than the key itself.

One maintained client speaks every scheme: obstore (Rust's object_store), with short
timeouts and few retries so that a remote that is down or slow costs a render seconds,
never minutes. The client is opened once per URL and process. A remote that failed is
skipped for `DOWN_SECONDS` by this process, so a dead tier costs one warning and one
timeout, not one per miss.

Which remote a store uses: `attach(cache, url, key)` (the CLI does it from the `remote`
and `remote_key` settings), else `HOTPLATE_REMOTE` and `HOTPLATE_REMOTE_KEY`; `attach`
also exports both per store path so that the worker processes a command spawns (the
server's, the watcher's, a push's) use the same tier and key.

The key (`remote_key`: the key itself, or `@FILE` for a file holding it) signs each
manifest a push writes (HMAC-SHA256 over its canonical body, cachestore/remote/manifest.py)
and makes pulls refuse manifests not signed with it. Without a key, anyone who can PUT
to the tier can publish what the stores render: keep it writable by trusted stores only.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cachestore.errors import StoreError

CONNECT_TIMEOUT = "2s"  # a host that does not answer: give up fast and build locally
REQUEST_TIMEOUT = 30.0  # seconds for one object, headers to last byte (blobs reach ~100 MB)
TIMEOUT_ENV = "HOTPLATE_REMOTE_TIMEOUT"  # overrides REQUEST_TIMEOUT (a slow LAN, the tests)
RETRIES = 2  # 5xx and dropped connections, within RETRY_WINDOW
RETRY_WINDOW = timedelta(seconds=5)
DOWN_SECONDS = 60.0  # after a failure, this process builds locally without asking again
ENV = "HOTPLATE_REMOTE"
KEY_ENV = "HOTPLATE_REMOTE_KEY"
ATTACHED_ENV = "HOTPLATE_REMOTE_ATTACHED"  # {store path: {"url", "key"}}, for spawned workers


class RemoteError(StoreError):
    """The remote could not be reached or answered with an error (a miss is not one)."""


class RemoteDamagedError(RemoteError):
    """A remote object is not what its name or its manifest says (damaged, truncated,
    unsigned); `path` is the blob's object path when a blob was refused."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def cas_path(digest: str) -> str:
    return f"cas/{digest}"


def ac_path(kind: str, key: str) -> str:
    return f"ac/{sha256(f'hotplate:{kind}:{key}'.encode())}"


@dataclass
class Remote:
    """One blob tier. get/head/put raise RemoteError naming the URL and the object."""

    url: str
    client: Any = field(repr=False)
    down_until: float = 0.0

    def where(self, path: str) -> str:
        return f"{self.url.rstrip('/')}/{path}"

    @property
    def down(self) -> bool:
        return time.monotonic() < self.down_until

    def _failed(self, path: str, exc: Exception) -> RemoteError:
        self.down_until = time.monotonic() + DOWN_SECONDS
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return RemoteError(f"remote {self.where(path)} unreachable or failing ({reason[:160]})")

    def get(self, path: str) -> Any:
        """The object's bytes (a buffer: obstore's Bytes, not copied), or None when the
        remote has no such object."""
        import obstore

        try:
            return obstore.get(self.client, path).bytes()
        except FileNotFoundError:
            return None
        except Exception as exc:  # obstore's errors share no base with OSError
            raise self._failed(path, exc) from exc

    def head(self, path: str) -> int | None:
        """The object's size, or None when it is absent."""
        import obstore

        try:
            return int(obstore.head(self.client, path)["size"])
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._failed(path, exc) from exc

    def put(self, path: str, data: bytes | memoryview) -> None:
        """Write one object whole (obstore's put is atomic: no reader sees a part)."""
        import obstore

        try:
            # one PUT, never multipart: plain HTTP servers (nginx, bazel-remote) have none
            obstore.put(self.client, path, data, use_multipart=False)
        except Exception as exc:
            raise self._failed(path, exc) from exc


_REMOTES: dict[str, Remote] = {}
_ATTACHED: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()


def open_remote(url: str) -> Remote:
    """The process's client for `url`; raises RemoteError for a URL obstore cannot use."""
    with _LOCK:
        found = _REMOTES.get(url)
        if found is not None:
            return found
        from obstore.store import from_url

        timeout = float(os.environ.get(TIMEOUT_ENV) or REQUEST_TIMEOUT)
        options = {
            "connect_timeout": CONNECT_TIMEOUT,
            "timeout": timedelta(seconds=timeout),
            "allow_http": True,  # loopback and LAN caches are plain HTTP, as bazel-remote's
        }
        retry = {"max_retries": RETRIES, "retry_timeout": RETRY_WINDOW}
        try:
            client = from_url(url.rstrip("/"), client_options=options, retry_config=retry)
        except Exception as exc:
            raise RemoteError(
                f"remote {url} is not a blob tier URL hotplate can use ({str(exc).splitlines()[0]}); "
                f"set remote (HOTPLATE_REMOTE) to http(s)://host/prefix or s3://bucket/prefix"
            ) from exc
        remote = _REMOTES[url] = Remote(url.rstrip("/"), client)
        return remote


def attach(cache: str | os.PathLike, url: str | None, key: str = "") -> None:
    """Use `url` as the blob tier of the store at `cache` in this process and its children,
    and `key` (the `remote_key` setting: a key, or `@FILE`) to sign and check manifests.

    Children (spawned workers) learn both from ATTACHED_ENV, a map keyed by the store's
    path: exporting the settings themselves would hand the tier to every store this
    process opens later, and to every later settings load."""
    if not url:
        return
    real = os.path.realpath(cache)
    with _LOCK:
        _ATTACHED[real] = {"url": url, "key": key or ""}
        exported = json.loads(os.environ.get(ATTACHED_ENV) or "{}")
        exported[real] = _ATTACHED[real]
        os.environ[ATTACHED_ENV] = json.dumps(exported)


def _attached(cache: str | os.PathLike) -> dict[str, str]:
    real = os.path.realpath(cache)
    found = _ATTACHED.get(real) or json.loads(os.environ.get(ATTACHED_ENV) or "{}").get(real)
    return found if isinstance(found, dict) else {}


def remote_url(cache: str | os.PathLike) -> str | None:
    return _attached(cache).get("url") or os.environ.get(ENV) or None


def remote_key(cache: str | os.PathLike) -> bytes | None:
    """The key that signs this store's manifests, or None when none is set. Raises
    RemoteError when `@FILE` names a file that cannot be read or is empty: then nothing
    is pulled (a refused key must not turn into trusting every manifest) or pushed."""
    spec = _attached(cache).get("key") or os.environ.get(KEY_ENV) or ""
    if not spec:
        return None
    if not spec.startswith("@"):
        return spec.encode()
    path = os.path.expanduser(spec[1:])
    try:
        key = open(path, "rb").read().strip()
    except OSError as exc:
        raise RemoteError(
            f"remote_key file {path} cannot be read ({exc.strerror}); fix it or unset remote_key"
        ) from exc
    if not key:
        raise RemoteError(f"remote_key file {path} is empty; put the key in it or unset remote_key")
    return key


def remote_for(store: Any, say: Callable[[str], None]) -> Remote | None:
    """The blob tier of this writable store, or None when none is set, it failed just now,
    or the store is read-only (nothing pulled could be written). A tier that cannot be
    opened (a bad URL, an unknown scheme) is one warning line to `say`, and None; the
    key (`remote_key`) is read by the push and the pull themselves."""
    try:
        url = remote_url(store.path)
        remote = None if url is None else open_remote(url)
    except RemoteError as exc:
        say(f"warning: {exc}")
        return None
    if remote is None or remote.down or store.readonly:
        return None
    return remote
