"""Clients must present the proxy's token when one is set (`--auth-token`)."""

from __future__ import annotations

import hmac

from toolproxy.proxy.flow import Addon, Flow

# Where each SDK sends its API key, which a client may set to the token: OpenAI's and most others
# (Authorization: Bearer), Anthropic's (x-api-key), Azure OpenAI's (api-key), Gemini's (x-goog-api-key).
KEY_HEADERS = ("Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key")


def _same(given: str, token: str) -> bool:
    # Compared as bytes: a value with a byte that is not UTF-8 (a surrogate escape here) is a
    # wrong token (401), not an encoding error (500).
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


def presented_token(headers, token: str) -> tuple[bool, str | None]:
    """(authorised, the header that carried the token as an API key, which is not forwarded)."""
    given = headers.get("X-Toolproxy-Token")
    if given is not None:
        return _same(given, token), None
    for name in KEY_HEADERS:
        value = headers.get(name)
        if value is not None and name == "Authorization":
            value = value[7:] if value[:7].lower() == "bearer " else None
        if value is not None and _same(value.strip(), token):
            return True, name
    return False, None


class Auth(Addon):
    """Refuses a request without the token; a token sent as the API key is not passed upstream."""

    def __init__(self, token: str) -> None:
        self.token = token

    def request_headers(self, flow: Flow) -> None:
        presented, carrier = presented_token(flow.request.headers, self.token)
        if not presented:
            flow.refuse(
                401,
                "unauthorized",
                "this toolproxy requires a token: send it as 'X-Toolproxy-Token: <token>' or as the API key",
                "toolproxy_unauthorized",
            )
        if carrier is not None:
            carrier = carrier.lower()
            flow.up_headers = {k: v for k, v in flow.up_headers.items() if k.lower() != carrier}
