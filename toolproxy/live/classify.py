"""One finished record classified by the analyzer's own per-record code
(analysis.classify.record.analyze_record: the same outcome, sub-kind and surface `analyze` will
store), as the live page shows it: a summary row, the detail a click opens (bodies cut at
BODY_CHARS), and the attempt its turns are derived from. Runs in the classifier process, where
the analyzer's modules load (imported here when first called, never in the proxy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from toolproxy.live.turns import Held

BODY_CHARS = 64 * 1024


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


def _text(raw: bytes | None, problem: str | None) -> str:
    if problem is not None:
        return f"({problem})"
    if raw is None:
        return ""
    text = raw[: BODY_CHARS * 4].decode("utf-8", "replace")
    return (
        text
        if len(text) <= BODY_CHARS
        else text[:BODY_CHARS] + f"\n... ({len(raw):,} bytes in all; `toolproxy show ID` after analyze has the rest)"
    )


def classify_record(rec: dict) -> tuple[dict, dict, Held | None]:
    """(summary row, detail, the attempt as the turns are derived from it, if it is one) of one
    finished record (as written), by the analyzer's code."""
    from toolproxy.analysis.classify.bodies import decode_body, header
    from toolproxy.analysis.classify.record import analyze_record
    from toolproxy.analysis.measure.runline import delivered_now
    from toolproxy.live.turns import held_of

    analyzed = analyze_record(rec, "", 0)
    row = analyzed.exchange
    g = rec.get
    status = g("client_status") if g("client_status") is not None else g("status")
    why = orjson.loads(row["record"]).get("classification_detail") if row["record"] else None
    summary = {
        "id": g("id"),
        "started_at": g("started_at"),
        "run": row["run"],
        "episode": g("episode"),
        "item": g("item"),
        "condition": row["condition"],
        "method": g("method"),
        "path": g("path"),
        "status": status,
        "duration_ms": g("duration_ms"),
        "error_kind": g("error_kind"),
        "model": row["model"],
        "outcome": row["outcome"],
        "sub_kind": row["sub_kind"],
        "surface": row["surface"],
        "n_calls": row["n_calls"],
        "delivered": delivered_now(row["outcome"], row["harness_saw_prose"]),
        "detail": why[:BODY_CHARS] if isinstance(why, str) else None,
        "side_request": row["side_request"],
        "ttfb_ms": g("ttfb_ms"),
        "ttft_ms": row["ttft_ms"],
    }
    if g("client_body") is not None:
        response = _text(*decode_body(g("client_body"), g("client_body_encoding")))
    else:
        response = _text(
            *decode_body(
                g("response_body"), g("response_body_encoding"), header(g("response_headers"), "content-encoding")
            )
        )
    detail = {
        **summary,
        "upstream": g("upstream"),
        "query": g("query"),
        "finish_reason": row["finish_reason"],
        "error_message": g("error_message"),
        "condition_note": g("condition_note"),
        "request_headers": g("request_headers") or [],
        "response_headers": g("response_headers") or [],
        "request_body": _text(
            *decode_body(
                g("request_body"), g("request_body_encoding"), header(g("request_headers"), "content-encoding")
            )
        ),
        "response_body": response,
        "content": (row["content"] or "")[:BODY_CHARS],
        "calls": [
            {
                "name": c["name"],
                "arguments": (c["arguments_raw"] or "")[:BODY_CHARS],
                "surface": c["surface"],
                "valid": c["valid"],
            }
            for c in analyzed.calls
        ],
    }
    return summary, detail, held_of(row)


def outcome_key(summary: dict) -> str | None:
    """outcome/surface for an exchange, non_response/sub-kind for a non-response (as the report splits them)."""
    from toolproxy.analysis.measure.runline import composition_key

    return composition_key(summary["outcome"], summary["sub_kind"], summary["surface"])
