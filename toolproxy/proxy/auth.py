"""Clients must present the proxy's token when one is set (`--auth-token`)."""

from __future__ import annotations

import hmac

from toolproxy.proxy.flow import Addon, Flow


def presented_token(headers, token: str) -> tuple[bool, bool]:
    """(authorised, forward the Authorization header upstream)."""
    # Compared as bytes: a value with a byte that is not UTF-8 (a surrogate escape here) is a
    # wrong token (401), not an encoding error (500).
    given = headers.get("X-Toolproxy-Token")
    if given is not None:
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()), True
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return hmac.compare_digest(auth[7:].strip().encode("utf-8", "surrogateescape"), token.encode()), False
    return False, True


class Auth(Addon):
    """Refuses a request without the token; a token sent as the API key is not passed upstream."""

    def __init__(self, token: str) -> None:
        self.token = token

    def request_headers(self, flow: Flow) -> None:
        presented, forward_auth = presented_token(flow.request.headers, self.token)
        if not presented:
            flow.refuse(
                401,
                "unauthorized",
                "this toolproxy requires a token: send it as 'X-Toolproxy-Token: <token>' or as the API key",
                "toolproxy_unauthorized",
            )
        if not forward_auth:
            flow.up_headers = {k: v for k, v in flow.up_headers.items() if k.lower() != "authorization"}
