"""The interface condition on the hot path: rewrite the request, transform the reply.

The stack the rewrite targets is fixed when the request arrives: `--stack`, or
else what fingerprinting has found by then. A fingerprint that lands mid-run changes the requests
after it, never the shared options or an exchange already in flight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip, bridge, load
from toolproxy.proxy.flow import Addon, Flow
from toolproxy.proxy.headers import Redactor
from toolproxy.record.model import encode_body


class ConditionAddon(Addon):
    def __init__(self, options: ConditionOptions, detected_stack: Callable[[], str | None], redactor: Redactor) -> None:
        self.options = options
        self.redactor = redactor
        self.detected_stack = detected_stack

    def request(self, flow: Flow) -> None:
        rec = flow.rec
        if self.options.bridge:
            # Gemini's token count has no conversation to rewrite: bridged under every condition.
            counted = bridge.count_plan(
                RequestView(flow.request.method, flow.up_path, flow.up_query, flow.up_headers, flow.body), self.options
            )
            if counted is not None:
                self._apply(flow, counted)
                return
        if rec.condition == "native":
            # Under native the only rewrite is --bridge's translation for a chat-only upstream.
            if not self.options.bridge:
                return
            planned = bridge.plan(
                RequestView(flow.request.method, flow.up_path, flow.up_query, flow.up_headers, flow.body), self.options
            )
            if isinstance(planned, Reject):
                rec.condition_note = f"rejected: {planned.message}"
                flow.refuse(planned.status, "condition_rejected", planned.message, "condition_rejected")
            if planned is not None:
                self._apply(flow, planned)
            return
        try:
            condition = load(rec.condition)
        except (ValueError, ImportError) as exc:
            rec.condition_note = f"skipped: {exc}"
            return
        options = self.options
        if options.stack is None:
            stack = self.detected_stack()
            if stack is not None:
                options = dataclasses.replace(options, stack=stack)
        rec.extra["dialect"] = options.stack  # the stack targeted: a stored key, kept under its old name
        request = flow.request
        outcome = condition.prepare(
            RequestView(request.method, flow.up_path, flow.up_query, flow.up_headers, flow.body), options
        )
        if isinstance(outcome, Skip):
            rec.condition_note = f"skipped: {outcome.reason}"
            return
        if isinstance(outcome, Reject):
            rec.condition_note = f"rejected: {outcome.message}"
            flow.refuse(outcome.status, "condition_rejected", outcome.message, "condition_rejected")
        self._apply(flow, outcome)

    def _apply(self, flow: Flow, plan: Plan) -> None:
        rec = flow.rec
        flow.body = plan.body
        flow.up_headers.update(plan.headers)
        flow.up_headers["Accept-Encoding"] = "identity"  # the transform must read the body
        flow.up_path, _, flow.up_query = plan.path.partition("?")
        rec.upstream_request = {
            "path": flow.up_path,
            "query": self.redactor.query(flow.up_query),
            "headers": self.redactor.headers(plan.headers.items()),
        }
        rec.upstream_request["body"], rec.upstream_request["body_encoding"] = encode_body(plan.body)
        transform = plan.transform
        if transform is None:
            return
        flow.client_chunks = []

        def stream(chunk: bytes) -> bytes:
            out = transform.feed(chunk) if chunk else transform.finish()
            if not chunk:
                rec.condition_note = getattr(transform, "note", None)
            if out:
                flow.client_chunks.append(out)
            return out

        flow.stream = stream
        flow.transform = transform

    def response_headers(self, flow: Flow, resp) -> None:
        if flow.transform is not None:
            flow.out_status, flow.out_headers = flow.transform.start(resp.status, resp.headers)
            flow.out_reason = None
