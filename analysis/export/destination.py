"""Where an export goes: a local directory or any fsspec URL (s3://, gs://, memory://, ...).

Every filesystem call goes through here so that what users get wrong (an unknown scheme, s3fs not
installed, no credentials, a bucket that does not exist) arrives as one ExportError sentence
naming the URL and what to do, never a botocore traceback.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")

# The packages fsspec asks for, by scheme, and the extra of ours that installs them.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class ExportError(Exception):
    """A problem with the export the user must fix; the CLI prints it and exits 2."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _hint(exc: BaseException) -> str:
    name = type(exc).__name__
    if "Credential" in name or "credential" in str(exc):
        return (
            " (no credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the store's own "
            "variables)"
        )
    if isinstance(exc, PermissionError):
        return " (permission denied: check the credentials' rights on this location)"
    return ""


class Destination:
    """A root directory on one fsspec filesystem, with paths given relative to it."""

    def __init__(self, url: str) -> None:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.url = url
        scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except ImportError as exc:
            extra = _EXTRAS.get(scheme)
            how = f"pip install 'toolproxy-recorder[{extra}]'" if extra else "install the fsspec package for it"
            raise ExportError(
                f"--out {url}: {scheme}:// needs a package that is not installed ({exc}); {how}"
            ) from None
        except ValueError as exc:
            known = ", ".join(sorted(p for p in fsspec.available_protocols() if len(p) > 1)[:40])
            raise ExportError(
                f"--out {url}: {exc} (unknown scheme {scheme!r}); give a local directory or a URL with one of: {known}"
            ) from None
        except Exception as exc:  # a malformed URL for its scheme
            raise ExportError(f"--out {url} is not usable: {_first_line(exc)}") from None
        self.root = self.root.rstrip("/") or "/"
        self.local = isinstance(self.fs, LocalFileSystem)

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def call(self, what: str, fn: Callable[..., _T], *args, **kwargs) -> _T:
        """fn(*args) with any failure turned into an ExportError saying `what` failed where."""
        try:
            return fn(*args, **kwargs)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"cannot {what} at {self.url}: {_first_line(exc)}{_hint(exc)}") from None

    def check(self) -> None:
        """Fail early (before any work) when the root cannot be created, or its bucket listed."""
        if self.local and Path(self.root).exists() and not Path(self.root).is_dir():
            raise ExportError(f"--out {self.url} is a file; give a directory (it is created if missing)")
        if hasattr(self.fs, "split_path"):
            # An object store (s3fs, gcsfs, adlfs): prefixes need no creating, and a missing bucket
            # is the user's to create (with its own policies), never made here.
            bucket = self.fs.split_path(self.root)[0]
            try:
                self.fs.ls(bucket, detail=False)
            except FileNotFoundError:
                raise ExportError(
                    f"--out {self.url}: bucket {bucket!r} does not exist, or these credentials cannot "
                    "see it; create it first"
                ) from None
            except Exception as exc:
                raise ExportError(
                    f"cannot list bucket {bucket!r} of {self.url}: {_first_line(exc)}{_hint(exc)}"
                ) from None
            return
        self.call("create the export directory", self.fs.makedirs, self.root, exist_ok=True)
        self.call("list the export directory", self.fs.ls, self.root, detail=False)

    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        path = self.path(rel)
        if not self.call(f"look for {rel}", self.fs.exists, path):
            return None
        return self.call(f"read {rel}", self.fs.cat_file, path)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace the object in one step: readers see the old bytes or the new, never a part.

        Object stores replace an object atomically on upload; a local file is written beside and
        renamed over the old one.
        """
        path = self.path(rel)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return
        self.call(f"write {rel}", self.fs.pipe_file, path, data)

    def put(self, files: list[tuple[str, str]]) -> None:
        """Place finished local files at their destination paths: renames when the export is local,
        one concurrent batch upload otherwise (object stores take one request per file)."""
        if self.local:
            for local_file, rel in files:
                path = self.path(rel)
                self.call(f"create {os.path.dirname(rel)}", os.makedirs, os.path.dirname(path), exist_ok=True)
                self.call(f"move a file to {rel}", os.replace, local_file, path)
            return
        self.call(
            f"upload {len(files)} files", self.fs.put, [f for f, _ in files], [self.path(rel) for _, rel in files]
        )

    def get(self, files: list[tuple[str, str]]) -> None:
        """Download (destination path, local file) pairs: one concurrent batch on an object store."""
        if files:
            what = files[0][0] if len(files) == 1 else f"{len(files)} files"
            self.call(f"download {what}", self.fs.get, [self.path(rel) for rel, _ in files], [f for _, f in files])

    def names(self, rel: str) -> set[str]:
        """The paths (relative to the root) of the files directly in folder `rel`; none when it is missing.

        One listing, where asking for each file would be a request each; refreshed, since an object
        store's filesystem caches listings and another exporter may have written since."""

        def ls(path: str) -> list[str]:
            try:
                return self.fs.ls(path, detail=False, refresh=True)
            except FileNotFoundError:
                return []

        return {f"{rel}/{p.rstrip('/').rsplit('/', 1)[-1]}" for p in self.call(f"list {rel}", ls, self.path(rel))}

    def exists(self, rel: str) -> bool:
        return self.call(f"look for {rel}", self.fs.exists, self.path(rel))

    def delete(self, rels: list[str]) -> None:
        """Remove files that are gone from the manifest; one already missing is no error."""
        for rel in rels:
            path = self.path(rel)
            if self.call(f"look for {rel}", self.fs.exists, path):
                self.call(f"delete {rel}", self.fs.rm_file, path)
