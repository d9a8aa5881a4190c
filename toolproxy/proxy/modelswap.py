"""The model a request asks the stack for, set by a tag instead of by the harness.

A study crosses models without touching the harness: the requests of each of its runs carry an
`upstream_model=NAME` tag, and this addon puts NAME in the body's `model` field (in the path, for
Gemini, which names it there) before a condition rewrites the request and before it goes
upstream. The record keeps both names: the harness's in `request_body` as it was received, the one
sent in `extra.model_sent` and in `upstream_request.body` (or `.path`). Only tagged model calls
are parsed; every other request pays one dict lookup, so untagged traffic keeps its byte-for-byte
path.
"""

from __future__ import annotations

import orjson

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.proxy.headers import Redactor
from toolproxy.record.model import MODEL_SENT, encode_body
from toolproxy.wire.endpoints import GEMINI, family_of
from toolproxy.wire.gemini import with_model

TAG = "upstream_model"
NOT_SENT = "model_not_sent"  # why the tag's model could not be put in the body


class ModelSwap(Addon):
    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def request(self, flow: Flow) -> None:
        rec = flow.rec
        model = rec.tags.get(TAG)
        if model is None or rec.method != "POST" or family_of(rec.path) is None:
            return
        if family_of(rec.path) == GEMINI:  # Gemini names the model in its path, never in the body
            rec.extra[MODEL_SENT] = model
            flow.up_path = with_model(flow.up_path, model)
            rec.upstream_request = {"path": flow.up_path, "query": self.redactor.query(flow.up_query), "headers": []}
            rec.upstream_request["body"], rec.upstream_request["body_encoding"] = encode_body(flow.body)
            return
        try:
            doc = orjson.loads(flow.body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            rec.extra[NOT_SENT] = "the request body is not a JSON object"
            return
        rec.extra[MODEL_SENT] = model
        if doc.get("model") == model:
            return
        doc["model"] = model
        flow.body = orjson.dumps(doc)
        rec.upstream_request = {"path": flow.up_path, "query": self.redactor.query(flow.up_query), "headers": []}
        rec.upstream_request["body"], rec.upstream_request["body_encoding"] = encode_body(flow.body)
