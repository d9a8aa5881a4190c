"""Bodies too large to hold in memory: kept in an unnamed temporary file, written out in pieces.

A body above the proxy's spill threshold is written, as it arrives, to a temporary file that
has no name (it vanishes with the process, whatever kills it) by one background thread. The
record then carries a `SpilledBody` in place of the body's text, and the writer thread streams
it into the record's JSON line a megabyte at a time (`record_pieces`). The file closes when the
last reference to it goes (the record after writing, the flow after forwarding): never earlier,
since the upstream may still be reading a spilled request body when the record is written. The line on disk is the
same as if the body had been held: text when the bytes are UTF-8, base64 otherwise. Memory per
exchange stays near the threshold, whatever the body's size.

What lies in the file is encrypted (AES-256-CTR under a key this process draws at start and
holds only in memory; a fresh nonce per file): a body is on disk for as long as its exchange
runs, unmasked (it has to be forwarded as sent), and a crash, a disk image or a later reader of
the freed blocks must not find prompts and secrets there. Without the process's memory the file
is noise; the record, written from it, is the only copy that stays, masked when `--mask` says so.
"""

from __future__ import annotations

import base64
import codecs
import concurrent.futures
import os
import tempfile
from collections.abc import Iterator

import orjson

from toolproxy.record.model import Record, encode_record

_PIECE = 3 * 256 * 1024  # a multiple of 3, so base64 pieces join without padding in between
SPILLED_FIELDS = ("request_body", "response_body")

# One thread for every spill write of the process: writes of a body stay in order, and the disk
# sees one writer at a time. Nothing here runs on the event loop.
_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="toolproxy-spill")
# The spill files' key: this process's only, never written anywhere.
_KEY = os.urandom(32)
_BLOCK = 16


def _cipher(nonce: bytes, block: int):
    """AES-CTR positioned at block `block` of a file. (cryptography is imported here, not with the
    module: the analyzer and the live page's classifier import this module for its names and never
    spill; the proxy loads it at startup, proxy/spool.py.)"""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.AES(_KEY), modes.CTR(nonce + block.to_bytes(8, "big")))


class SpilledBody:
    """A body being written to a temporary file; `ready` resolves once all of it is there.

    If the temporary file cannot be written (disk full), the rest is kept in memory (`tail`)
    rather than lost: the bound is given up for that body, the record is not.
    """

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.file = None
        self.file_size = 0
        self.file_written = 0  # file_size before the write under way
        self.size = 0
        self.tail: list[bytes] = []
        self.error: str | None = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.utf8 = True
        self.ready: concurrent.futures.Future | None = None
        self._nonce = os.urandom(8)
        self._encrypt = _cipher(self._nonce, 0).encryptor()

    def __len__(self) -> int:
        return self.size

    def write(self, data: bytes) -> concurrent.futures.Future:
        """Queue bytes for the file (called on the loop; returns when they are queued, not written)."""
        self.size += len(data)
        self.ready = _THREAD.submit(self._write, data, False)
        return self.ready

    def close(self) -> concurrent.futures.Future:
        """No more bytes: `ready` resolves when everything is written and the encoding is known."""
        self.ready = _THREAD.submit(self._write, b"", True)
        return self.ready

    def append(self, data: bytes) -> None:
        """Bytes written now, on the calling thread: for a body made off the event loop (a masked
        copy, record/masking.py), which has no reader until it is sealed."""
        self.size += len(data)
        self._write(data, False)

    def seal(self) -> None:
        """The last of append()'s bytes: ready from now on."""
        self._write(b"", True)
        self.ready = concurrent.futures.Future()
        self.ready.set_result(None)

    def _write(self, data: bytes, final: bool) -> None:
        if self.utf8:
            try:
                self._utf8.decode(data, final)
            except UnicodeDecodeError:
                self.utf8 = False
        if not data:
            return
        if not self.tail:
            try:
                if self.file is None:
                    if self.directory:
                        os.makedirs(self.directory, exist_ok=True)
                    # Unbuffered: `chunks` reads by descriptor up to `file_size`, so every byte
                    # counted must be in the file. Buffered, a last piece smaller than the buffer
                    # stayed in this process: a forwarded body fell short of its Content-Length
                    # (the upstream waited for the rest) and a recorded one was cut.
                    self.file = tempfile.TemporaryFile(dir=self.directory, buffering=0)
                sealed = self._encrypt.update(data)
                done = 0
                while done < len(sealed):
                    done += self.file.write(sealed[done:])
                    self.file_size = self.file_written + done
                self.file_written = self.file_size
                return
            except OSError as exc:
                self.error = f"cannot spill a large body to {self.directory or tempfile.gettempdir()}: {exc}"
                data = data[self.file_size - self.file_written :]  # what did not reach the file, in clear
        self.tail.append(data)

    def chunks(self, size: int = _PIECE) -> Iterator[bytes]:
        """The body's bytes in pieces of `size` (blocking: call off the event loop, after `ready`)."""
        self.ready.result()
        offset = 0
        while offset < self.file_size:
            piece = os.pread(self.file.fileno(), min(size, self.file_size - offset), offset)
            if not piece:
                break
            skip = offset % _BLOCK  # 0 unless a read came back short
            piece = _cipher(self._nonce, offset // _BLOCK).decryptor().update(bytes(skip) + piece)[skip:]
            offset += len(piece)
            yield piece
        yield from self.tail

    def read(self) -> bytes:
        return b"".join(self.chunks())


def has_spilled(rec: Record) -> bool:
    return isinstance(rec.request_body, SpilledBody) or isinstance(rec.response_body, SpilledBody)


def record_pieces(rec: Record) -> Iterator[bytes]:
    """The record's JSON line, any spilled body streamed in pieces (writer thread only: it blocks)."""
    spilled = []
    for name in SPILLED_FIELDS:
        body = getattr(rec, name)
        if isinstance(body, SpilledBody):
            body.ready.result()
            # Random, so no header or body a client sends can contain it.
            marker = f"toolproxy-spilled-{name}-{os.urandom(16).hex()}"
            setattr(rec, name, marker)
            setattr(rec, name + "_encoding", "utf8" if body.utf8 else "base64")
            spilled.append((orjson.dumps(marker), body))
    line = encode_record(rec)  # odd header or tag bytes are repaired as in every other record
    for marker, body in spilled:
        head, line = line.split(marker, 1)
        yield head + b'"'
        yield from _json_string_content(body)
        yield b'"'
    yield line


def _json_string_content(body: SpilledBody) -> Iterator[bytes]:
    if body.utf8:
        decoder = codecs.getincrementaldecoder("utf-8")()
        for piece in body.chunks():
            text = decoder.decode(piece)
            if text:
                yield orjson.dumps(text)[1:-1]
    else:
        carry = b""
        for piece in body.chunks():
            piece = carry + piece
            cut = len(piece) - len(piece) % 3
            carry = piece[cut:]
            yield base64.b64encode(piece[:cut])
        yield base64.b64encode(carry)
