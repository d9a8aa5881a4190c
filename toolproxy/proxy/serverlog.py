"""aiohttp's own error lines, made safe for stderr before they are printed.

When aiohttp's HTTP parser rejects a request (a 400 before the proxy sees it), it logs the
exception with the offending bytes quoted: the request line with its query string (`?key=...`),
or a whole header line (`X-Api-Key: sk-...`). stderr goes to journald, `docker logs`, a CI log:
places that keep it and that more people read than the recordings. So every record of the
`aiohttp.server` logger is rewritten on its way out: a parse error becomes one line naming what
was wrong, with the quoted bytes shown as a record would store them (secret header values and
query parameters replaced by their keyed stand-in), and every other line (a traceback from a bug)
has its control characters escaped, so a client's bytes cannot act on the terminal that shows it.
"""

from __future__ import annotations

import ast
import logging
import re

from aiohttp.http_exceptions import HttpProcessingError

from toolproxy.proxy.headers import Redactor, is_secret_name
from toolproxy.term.printable import printable

LOGGER = "aiohttp.server"
SHOWN_BYTES = 200  # of a rejected line (aiohttp quotes up to a whole 8 KiB line)
# A Python bytes or str literal as aiohttp quotes what it rejected (`b'...'`, `'...'`).
_QUOTED = re.compile(r"""b?'(?:[^'\\\n]|\\.)*'|b?"(?:[^"\\\n]|\\.)*\"""")
_REQUEST_LINE = re.compile(rb"^([A-Z]+) ([/*]\S*)(.*)$")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def shown(raw: bytes, redactor: Redactor) -> str:
    """What a log may show of a rejected line: a request line with its query redacted, a header
    with its value (a stand-in when the name is a secret's); escaped either way. A line that is
    neither is not shown, only counted: it may be a header whose malformed name hides a secret."""
    m = _REQUEST_LINE.match(raw)
    if m is not None:
        path, q, query = m.group(2).decode("latin-1").partition("?")
        target = path + (q + redactor.query(query) if q else "")
        return printable(f"{m.group(1).decode('latin-1')} {target}{m.group(3).decode('latin-1')}")
    name, sep, value = raw.decode("latin-1").partition(":")
    if sep and _TOKEN.fullmatch(name):
        if is_secret_name(name):
            value = " " + redactor.value(value.strip().encode("latin-1"))
        return printable(f"{name}:{value}")
    return f"({len(raw)} bytes not shown)"


def what_was_wrong(exc: HttpProcessingError) -> str:
    """The parser's verdict in words, without the bytes it quotes (`Invalid header value char`)."""
    message = exc.message if isinstance(exc.message, str) else str(exc.message)
    quoted = _QUOTED.search(message)
    what = message[: quoted.start()] if quoted else message
    return printable(" ".join(what.split()).rstrip(" :.") or type(exc).__name__)


def parse_error_line(exc: HttpProcessingError, remote: str, redactor: Redactor) -> str:
    message = exc.message if isinstance(exc.message, str) else str(exc.message)
    quoted = _QUOTED.search(message)
    line = f"toolproxy: refused a malformed request from {printable(remote)}: {exc.code} {what_was_wrong(exc)}"
    if quoted is not None:
        try:
            raw = ast.literal_eval(quoted.group(0))
        except (ValueError, SyntaxError):
            raw = None
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        if isinstance(raw, bytes):
            line += f": {shown(raw[:SHOWN_BYTES], redactor)}" + (
                f" ({len(raw):,} bytes)" if len(raw) > SHOWN_BYTES else ""
            )
    return line


class SafeServerLog(logging.Filter):
    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            text = parse_error_line(exc, str(remote), self.redactor)
        else:
            text = printable(record.getMessage(), lines=True)
            if record.exc_info:
                text += "\n" + printable(logging.Formatter().formatException(record.exc_info), lines=True)
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = text, (), None, None, None
        return True


def install(redactor: Redactor) -> None:
    """Rewrite aiohttp's server log lines from now on (once per process: a second call replaces the first)."""
    log = logging.getLogger(LOGGER)
    for old in [f for f in log.filters if isinstance(f, SafeServerLog)]:
        log.removeFilter(old)
    log.addFilter(SafeServerLog(redactor))
