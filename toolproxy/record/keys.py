"""Secret keys kept in the data directory (masking, sampling, redaction): made once, private, stable.

A key lives beside the recordings it shapes so that a restarted proxy, or a second worker,
masks, samples and redacts exactly as the first one did; deleting the file starts a new key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_key(data_dir: str | Path, name: str) -> bytes:
    """The data directory's key `name`, created (0600, 32 random bytes) on first use.

    Created whole or not at all: the key is written to a private temporary file that is then
    linked to its name, so a second process starting at the same moment (`serve --workers`) reads
    either no file or the complete key, never an empty one, and both end up with the same key.
    """
    path = Path(data_dir) / name
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    temp = path.with_name(f".{name}.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(32))
        os.fsync(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the key
    finally:
        os.close(fd)
        temp.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    key = path.read_bytes()
    if len(key) < 16:
        raise ValueError(f"{path} is shorter than 16 bytes; restore it or delete it to start a new key")
    return key
