"""Which names this proxy answers to: the Host check, and the Origin check for state-changing calls.

A proxy on 127.0.0.1 without a token is reachable by every web page the user opens. The
same-origin policy stops a page from reading another origin's answers, but not DNS rebinding: a
page on `evil.example` whose name then resolves to 127.0.0.1 reads the proxy's answers as its
own (the live page, any recorded prompt), since to the browser it is still `evil.example`. Its
requests say so in their Host header, which is why the proxy checks Host by default against the
names it is known by: `localhost` (and `*.localhost`, which browsers resolve to loopback
themselves), the address it listens on as an IP literal (any IP literal when it listens on every
address: a rebinding page can only choose a name), the `--host` name itself, and every
`--allowed-host`. The port is not compared: a port forward (`ssh -L 9000:...`, `docker -p
9000:8787`) changes the port clients see, and a rebinding page cannot change which socket its
request reaches.

Host says nothing about who sent a request, so a page can still send one cross-site (a form
POST of `text/plain` needs no preflight). Browsers name the sending page in Origin on every
POST; for any method but GET, HEAD and OPTIONS the Origin's name, when there is one, must pass
the same check (`null`, from a sandboxed frame or a file, does not). SDK clients send no Origin,
so they are unaffected. `--allowed-host '*'` turns both checks off.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from urllib.parse import urlsplit

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.term.printable import printable

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})
ANY = "*"


def host_name(value: str) -> str | None:
    """The name or IP literal of a Host value (`name[:port]`, `[v6][:port]`), lower-cased and
    without a trailing dot; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not (value[end + 1] == ":" and value[end + 2 :].isdigit())):
            return None
        return value[1:end]
    name, sep, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if sep and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class Exposure(Addon):
    """The check, built once from `--host` and `--allowed-host`, and what it refused. As an
    addon it refuses forwarded requests (recorded, as every refusal is); the handler asks it
    directly for the admin routes, which are never recorded."""

    stats_key = "exposure"

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()) -> None:
        allowed = tuple(allowed)
        self.off = ANY in allowed
        self.hooked = not self.off
        self.allowed = allowed
        self.names = set(LOCAL_NAMES)
        self.ips: set = set()
        self.any_ip = False
        bound = _ip(bind_host.strip("[]"))
        if bound is None:
            self.names.add(bind_host.lower().rstrip("."))
        elif bound.is_unspecified:
            self.any_ip = True
        else:
            self.ips.add(bound)
        for name in allowed:
            ip = _ip(name.strip("[]"))
            if ip is not None:
                self.ips.add(ip)
            elif name != ANY:
                self.names.add(name.lower().rstrip("."))
        self.refused: Counter[str] = Counter()
        self._hosts: dict[str, bool] = {}  # Host values seen: a client sends the same one every time

    def known(self, name: str | None) -> bool:
        if name is None:
            return False
        if name in self.names or name.endswith(".localhost"):
            return True
        ip = _ip(name)
        return ip is not None and (
            self.any_ip or ip in self.ips or (ip.is_loopback and any(i.is_loopback for i in self.ips))
        )

    def refusal(self, method: str, headers) -> tuple[str, str, str] | None:
        """(kind, code, message) when a request must be refused, else None. No Host at all (an
        HTTP/1.0 client) passes: a browser always sends one."""
        if self.off:
            return None
        host = headers.get("Host")
        if host is not None:
            ok = self._hosts.get(host)
            if ok is None:
                ok = self.known(host_name(host))
                if len(self._hosts) < 1024:
                    self._hosts[host] = ok
        if host is not None and not ok:
            self.refused["host"] += 1
            return (
                "host_refused",
                "host_not_allowed",
                f"this toolproxy does not answer to the name {printable(host)!r} (a page whose name was pointed at "
                f"this machine, DNS rebinding, is refused this way); if that is your proxy's name, start it with "
                f"--allowed-host NAME",
            )
        if method not in SAFE_METHODS:
            origin = headers.get("Origin")
            if origin is not None and not self.known(_origin_name(origin)):
                self.refused["origin"] += 1
                return (
                    "origin_refused",
                    "origin_not_allowed",
                    f"a web page at {printable(origin)!r} may not send requests to this toolproxy (a cross-site "
                    f"request from a browser); to allow that page, start the proxy with --allowed-host NAME",
                )
        return None

    def request_headers(self, flow: Flow) -> None:
        refused = self.refusal(flow.request.method, flow.request.headers)
        if refused is not None:
            flow.refuse(403, refused[0], refused[2], refused[1])

    def report(self) -> dict:
        return {
            "checked": not self.off,
            "allowed_hosts": list(self.allowed),
            "refused_host": self.refused["host"],
            "refused_origin": self.refused["origin"],
        }


def _origin_name(origin: str) -> str | None:
    if origin.strip() == "null":
        return None
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return host_name(parts.netloc)
