"""Secret keys kept in the data directory (masking, sampling): made once, private, stable.

A key lives beside the recordings it shapes so that a restarted proxy, or a second worker,
masks and samples exactly as the first one did; deleting the file starts a new key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_key(data_dir: str | Path, name: str) -> bytes:
    """The data directory's key `name`, created (0600, 32 random bytes) on first use."""
    path = Path(data_dir) / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < 16:
            raise ValueError(f"{path} is shorter than 16 bytes; restore it or delete it to start a new key") from None
        return key
    key = secrets.token_bytes(32)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key
