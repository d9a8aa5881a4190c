"""A failed connection in words a user can act on, with the system's own text kept as detail.

asyncio and aiohttp say "[Errno 111] Connect call failed ('127.0.0.1', 1)" or "[Errno -2] Name
or service not known"; a person needs "nothing is listening at 127.0.0.1:1" and what to check.
Every place that reports a connection it could not make (the proxy's 502, the fingerprint, doctor,
conformance, the upstream health probe) says it through `explain`, so the words are the same
everywhere. Pure: an exception in, a ConnectionProblem out.
"""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True, slots=True)
class ConnectionProblem:
    what: str  # what failed, in words: "nothing is listening at 127.0.0.1:1 (connection refused)"
    advice: str  # what to check
    detail: str  # the system's own text, for a second line or a bug report

    def sentence(self) -> str:
        return f"{self.what}. {self.advice}"


_RESET = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)
_NO_ROUTE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN)


def _os_error(exc: BaseException) -> OSError | None:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error
    if isinstance(exc, OSError):
        return exc
    cause = exc.__cause__ or exc.__context__
    return cause if isinstance(cause, OSError) else None


def explain(exc: BaseException, where: str | None = None) -> ConnectionProblem:
    """`exc` (an OSError, an aiohttp ClientError or a TimeoutError) as a ConnectionProblem.

    `where` names the other end ("127.0.0.1:8080") when the exception does not carry it.
    """
    if isinstance(exc, aiohttp.ClientConnectorError):
        where = f"{exc.host}:{exc.port}"
    target = where or "the server"
    os_error = _os_error(exc)
    detail = str(os_error or exc) or type(exc).__name__
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError)) or isinstance(
        os_error, ssl.SSLError
    ):
        return ConnectionProblem(
            f"the TLS (https) handshake with {target} failed",
            "Check http:// versus https:// in the URL, and the server's certificate.",
            detail,
        )
    if isinstance(os_error, socket.gaierror):
        host = target.rsplit(":", 1)[0] if where else target
        return ConnectionProblem(
            f"the host name {host} could not be resolved",
            "Check the host name in the URL (and DNS, if it is right).",
            detail,
        )
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)) or (
        os_error is not None and os_error.errno == errno.ETIMEDOUT
    ):
        return ConnectionProblem(
            f"{target} did not answer in time",
            "Is the server up and reachable from here (a firewall or VPN can swallow connections)?",
            detail,
        )
    if os_error is not None and os_error.errno == errno.ECONNREFUSED:
        return ConnectionProblem(
            f"nothing is listening at {target} (connection refused)",
            "Is the model server running, and are the host and port in the URL right?",
            detail,
        )
    if os_error is not None and os_error.errno in _NO_ROUTE:
        return ConnectionProblem(
            f"there is no network route to {target}", "Is the host reachable from this machine (network, VPN)?", detail
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError) or (os_error is not None and os_error.errno in _RESET):
        return ConnectionProblem(
            f"{target} closed the connection without answering",
            "Is it an HTTP server, and is http:// versus https:// right? It may also have crashed.",
            detail,
        )
    if os_error is not None and os_error.strerror:
        return ConnectionProblem(
            f"cannot connect to {target}: {os_error.strerror.lower()}",
            "Is the server up, and is the URL right?",
            detail,
        )
    return ConnectionProblem(
        f"the connection to {target} failed ({type(exc).__name__})", "Is the server up, and is the URL right?", detail
    )


def with_detail(text: str, detail: str | None) -> str:
    """A problem's sentence, and the system's own text on a second line when there is one."""
    return f"{text}\n  detail: {detail}" if detail else text
