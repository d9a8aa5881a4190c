"""One exchange, readable: what the harness asked, what came back, and how it was classified."""

from __future__ import annotations

import textwrap

import orjson

from toolproxy.analysis.classify.outcomes import NON_RESPONSE, whose
from toolproxy.analysis.classify.record import harness_request
from toolproxy.analysis.classify.sides import KINDS
from toolproxy.analysis.report.details import task_tree
from toolproxy.record.segments import BODIES_AS_RECORDED, RecordError, RecordReader
from toolproxy.term.printable import printable
from toolproxy.wire import family_of

_FIELDS = """
id, kind, started_at, duration_ms, ttfb_ms, run, episode, item, condition, tags, upstream, method, path, query,
status, client_status, error_kind, error_message, is_attempt, streamed, model, prompt_tokens, completion_tokens,
cached_tokens, tool_set, upstream_request, condition_note, outcome, sub_kind, surface, finish_reason, content,
reasoning_content, upstream_content, harness_saw_prose, stack_marker, record, turn_id, segment, segment_offset,
request_headers, side_request, ttft_ms
"""


class _Block(str):
    """Lines of recorded text, already inert and indented; every other line of the output is one
    line, so whatever a field holds is shown on it (newlines and controls as escapes)."""


def _clip(text: str | None, limit: int = 1200) -> _Block:
    if text is None:
        return _Block("(none)")
    text = text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more chars]"
    return _Block(textwrap.indent(printable(text, lines=True), "    "))


def _content(value) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _upstream_text(e: dict, calls: list[tuple]) -> list[str]:
    """What the stack wrote, beside what the harness got, in the words of what the condition did
    with it: turned it into calls, passed it on as text, or left the reply alone (it rewrote the
    request only, as `hint` does)."""
    condition = e["condition"]
    if e["client_body"] is None:
        return [
            f"  (the {condition} condition rewrote only the request: the harness got this reply as the stack sent it)"
        ]
    made = [c for c in calls if c[4] == "tool_calls" and c[3] != "native"]
    if made:
        said = f"before the {condition} condition turned it into {len(made)} tool call{'s' if len(made) != 1 else ''}"
    else:
        said = f"the {condition} condition found no call in it and passed it on as text"
    return [f"  upstream's raw text ({said}):", _clip(e["upstream_content"])]


def _ms(value) -> str:
    return f"{value:.0f} ms" if value is not None else "-"


def _task_tree(con, episode_key: str) -> list[str]:
    """The task an episode belongs to, as a tree: its root, the subagents' episodes under the calls
    that started them, the episodes it went on with after a compaction (empty when it has none)."""
    found = con.execute("SELECT coalesce(task_key, episode_key) FROM episodes WHERE episode_key = ?", [episode_key])
    task = next(iter(found.fetchall()), (None,))[0]
    if task is None:
        return []
    rows = con.execute(
        "SELECT episode_key, parent_episode, parent_call, link, n_turns FROM episodes WHERE task_key = ?", [task]
    ).fetchall()
    if len(rows) < 2:
        return []
    out = [f"  task {task}:"]
    for node in task_tree(rows):
        mark = "  <- this exchange's" if node.episode == episode_key else ""
        out.append(f"  {'  ' * (node.depth + 1)}- {node.episode}: {node.how}, {node.turns} turn(s){mark}")
    return out


def _times(e: dict) -> str:
    """First byte and first token: keep-alive comments before a token are bytes, not tokens."""
    said = f"first byte: {_ms(e['ttfb_ms'])}  first token: {_ms(e['ttft_ms'])}"
    if e["ttft_ms"] is not None and e["ttfb_ms"] is not None and e["ttft_ms"] > e["ttfb_ms"] + 1:
        said += "  (the bytes before it were keep-alive comments, no token)"
    elif e["ttft_ms"] is None and e["ttfb_ms"] is not None and e["is_attempt"]:
        said += "  (no token came)"
    return said


def render(con, exchange_id: str, data_dir, *, raw: bool = False) -> str:
    """The exchange's analysis from the database, its bodies from its record under data_dir."""
    names = [f.strip() for f in _FIELDS.split(",")]
    row = con.execute(f"SELECT {', '.join(names)} FROM exchanges WHERE id = ?", [exchange_id]).fetchall()[0]
    e = dict(zip(names, row))
    out = []
    try:
        with RecordReader(data_dir) as reader:
            rec = reader.record(e["segment"], e["segment_offset"])
        e.update({name: rec.get(name) for name in BODIES_AS_RECORDED})
    except RecordError as exc:
        e.update(dict.fromkeys(BODIES_AS_RECORDED))
        out.append(f"bodies not readable: {exc}")
    tags = " ".join(f"{k}={e[k]}" for k in ("run", "episode", "item") if e[k])
    out.append(f"exchange {e['id']}  {tags}  condition={e['condition']}")
    status = e["status"] if e["status"] is not None else "---"
    client = f" (harness got {e['client_status']})" if e["client_status"] not in (None, e["status"]) else ""
    dur = f"{e['duration_ms']:.0f} ms" if e["duration_ms"] is not None else "-"
    out.append(
        f"{e['method']} {e['path']}{'?' + e['query'] if e['query'] else ''} -> {status}{client}  {dur}  "
        f"{'streamed' if e['streamed'] else 'not streamed'}  at {e['started_at']}  upstream {e['upstream']}"
    )
    out.append(_times(e))
    if e["side_request"]:
        what = KINDS.get(e["side_request"], e["side_request"])
        out.append(f"side request: {e['side_request']} ({what}), asked by the harness beside its task: no turn of it")
    if e["error_kind"]:
        out.append(f"error: {e['error_kind']}: {e['error_message']}")
    if e["model"] or e["prompt_tokens"] is not None:
        out.append(
            f"model: {e['model']}  tokens: prompt {e['prompt_tokens']}, completion {e['completion_tokens']}, "
            f"cached {e['cached_tokens']}  stack marker: {e['stack_marker'] or '-'}"
        )
    if e["condition_note"]:
        out.append(f"condition note: {e['condition_note']}")

    out += ["", "== request (as the harness sent it)"]
    rec = {
        "path": e["path"],
        "request_body": e["request_body"],
        "request_body_encoding": e["request_body_encoding"],
        "request_headers": orjson.loads(e["request_headers"]) if e["request_headers"] else [],
    }
    req, request = harness_request(rec, family_of(e["path"] or ""))
    messages = request.messages if request is not None else []
    if req is None:
        out.append(_clip(e["request_body"], 600) if e["request_body"] else "    (no body)")
    else:
        shown = messages[-4:]
        if len(messages) > len(shown):
            out.append(f"  ({len(messages) - len(shown)} earlier messages not shown)")
        for m in shown:
            if not isinstance(m, dict):
                continue
            out.append(f"  [{m.get('role')}]")
            if m.get("content"):
                out.append(_clip(_content(m["content"]), 600))
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function", {}) if isinstance(tc, dict) else {}
                out.append(f"    -> {fn.get('name')}({_content(fn.get('arguments'))})")
        if e["tool_set"]:
            tnames = next(
                iter(con.execute("SELECT names FROM tool_sets WHERE hash = ?", [e["tool_set"]]).fetchall()), None
            )
            out.append(f"  tools offered: {', '.join(tnames[0]) if tnames else '?'}  (tool set {e['tool_set'][:12]})")
        for k in ("tool_choice", "response_format", "stream"):
            if k in req:
                out.append(f"  {k}: {_content(req[k])}")
    if e["upstream_request"]:
        out.append(f"  (the {e['condition']} condition rewrote it before it went upstream; see --raw)")

    out += ["", "== response (as the harness got it)"]
    if e["reasoning_content"]:
        out.append("  reasoning:")
        out.append(_clip(e["reasoning_content"], 600))
    out.append("  content:")
    out.append(_clip(e["content"]))
    calls = con.execute(
        "SELECT idx, name, arguments_raw, surface, format, offered, validated, valid, schema_errors "
        "FROM calls WHERE exchange_id = ? ORDER BY idx",
        [e["id"]],
    ).fetchall()
    if e["finish_reason"]:
        out.append(f"  finish_reason: {e['finish_reason']}")
    if e["upstream_content"] is not None:
        out += _upstream_text(e, calls)

    out += ["", "== classification"]
    if e["is_attempt"]:
        meta = orjson.loads(e["record"]) if e["record"] else {}
        kind = f"{e['outcome']}" + (f"/{e['sub_kind']}" if e["sub_kind"] else "")
        out.append(
            f"  outcome: {kind}  surface: {e['surface'] or '-'}"
            + (
                "  HARNESS SAW PROSE: the call was in text, no tool parser extracted it"
                if e["harness_saw_prose"]
                else ""
            )
        )
        if meta.get("classification_detail"):
            owner = f" ({whose(e['sub_kind'])})" if e["outcome"] == NON_RESPONSE else ""
            out.append(f"  why{owner}: {meta['classification_detail']}")
        for idx, name, args, surface, fmt, offered, validated, valid, errors in calls:
            verdict = "valid" if valid else ("NOT OFFERED" if not offered else "INVALID")
            if valid and not validated:
                verdict = "not validated (tool schema unusable)"
            out.append(f"  call {idx}: {name}({args})  [{surface}/{fmt}] {verdict}")
            errs = orjson.loads(errors) if errors else []
            for err in errs[:5]:
                out.append(f"      - {err}")
        if e["turn_id"]:
            t = next(
                iter(
                    con.execute(
                        "SELECT episode_key, turn_index, outcome, sub_kind, n_attempts FROM turns WHERE turn_id = ?",
                        [e["turn_id"]],
                    ).fetchall()
                ),
                None,
            )
            if t:
                out.append(
                    f"  turn {t[1]} of episode {t[0]}: {t[2]}{'/' + t[3] if t[3] else ''} after {t[4]} attempt(s)"
                )
                out += _task_tree(con, t[0])
    else:
        out.append("  not a completion request: not classified")

    if raw:
        out += ["", "== raw request body"]
        out.append(_clip(e["request_body"], 20000))
        if e["upstream_request"]:
            out += ["", "== request sent upstream"]
            out.append(_clip(e["upstream_request"], 20000))
        out += ["", f"== raw response body ({e['response_body_encoding']})"]
        out.append(_clip(e["response_body"], 20000))
        if e["client_body"] is not None:
            out += ["", f"== body the harness got ({e['client_body_encoding']})"]
            out.append(_clip(e["client_body"], 20000))
    out += ["", f"recorded in {e['segment']} at byte {e['segment_offset']}"]
    return "\n".join(line if isinstance(line, _Block) else printable(line) for line in out)
