"""Live counts of exchanges for /_toolproxy/stats: by status class, by error, in flight, resent."""

from __future__ import annotations

from collections import Counter

from toolproxy.proxy.flow import Addon, Flow


class Counters(Addon):
    def __init__(self) -> None:
        self.total = 0
        self.in_flight = 0
        self.by_class: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        # Requests sent upstream a second time (forward._send: a kept-alive connection closed under them).
        self.resent = 0

    def request_headers(self, flow: Flow) -> None:
        self.in_flight += 1

    def response_end(self, flow: Flow) -> None:
        self.in_flight -= 1
        self.total += 1
        rec = flow.rec
        status = rec.client_status if rec.client_status is not None else rec.status
        self.by_class[f"{status // 100}xx" if status else "none"] += 1

    def error(self, flow: Flow) -> None:
        self.response_end(flow)
        self.errors[flow.rec.error_kind] += 1

    def stats(self) -> dict:
        """Its entries are the stats' top level (they came first and clients read them there)."""
        return self.report()

    def report(self) -> dict:
        return {
            "exchanges": self.total,
            "in_flight": self.in_flight,
            "by_status_class": dict(self.by_class),
            "errors": dict(self.errors),
            "resent": self.resent,
        }
