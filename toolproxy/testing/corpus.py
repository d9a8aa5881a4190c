"""Synthetic recordings for tests and benchmarks: data dirs and Record lists shaped like real traffic.

`generate` writes the `agents` data dir: what real recordings have: multi-turn agent episodes
whose message lists grow turn by turn, a ~2 KB tools array resent every turn, several stacks with
their own wire shapes (Ollama /v1 and native NDJSON, vLLM SSE fragments and its default 400,
SGLang calls in text, llama.cpp timings), streams and non-streams, retries after 500s, timeouts,
hallucinated names, invalid arguments, prose, and one untagged run that needs prefix-chaining
reconstruction. `generate_small` is single requests with short bodies (one small tool or none),
the shape of a chat front end's traffic. Records are the proxy's own Record dataclass serialised
exactly as the segment writer does.

`generate_long` writes long tagged agent episodes (20-50 turns, records of several KB) in one run,
`generate_untagged` the same without tags.
`episode` / `interleaved` / `small_records` build Record lists for the storage benchmark and the
dedup tests: agent episodes as harnesses send them (the whole history resent every turn, growing
by `growth` bytes a turn), turn t of every episode before turn t+1 of any, and small records.

Test doubles, not production code: nothing in the proxy or the analyzer imports this module.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.stacks.catalog import OLLAMA, TOOL_REFUSAL, VLLM

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc * 3,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": list(props)[:1],
                "additionalProperties": False,
            },
        },
    }
    for name, desc, props in [
        (
            "get_weather",
            "Current weather for a city, in metric units. ",
            {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        ),
        (
            "search_web",
            "Search the web and return the top results. ",
            {"query": {"type": "string"}, "limit": {"type": "integer"}},
        ),
        (
            "read_file",
            "Read a text file from the workspace. ",
            {"path": {"type": "string"}, "max_bytes": {"type": "integer"}},
        ),
        (
            "write_file",
            "Write a text file in the workspace. ",
            {"path": {"type": "string"}, "content": {"type": "string"}},
        ),
        (
            "run_shell",
            "Run a shell command in the sandbox. ",
            {"command": {"type": "string"}, "timeout": {"type": "number"}},
        ),
        ("calculator", "Evaluate an arithmetic expression. ", {"expression": {"type": "string"}}),
    ]
]
TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
RUN_SETUPS = {
    "ollama-qwen-native": ("ollama", "native"),
    "ollama-gemma-refused": ("ollama_refuse", "native"),
    "vllm-default": ("vllm_refuse", "native"),
    "vllm-hermes": ("vllm", "native"),
    "sglang-noparser": ("sglang", "native"),
    "llamacpp-native": ("llamacpp", "native"),
    "ollama-api-chat": ("ollama_native", "native"),
    "(untagged)": ("vllm", "native"),
}


def _args_for(name: str, rnd: random.Random) -> dict:
    return {
        "get_weather": {"city": rnd.choice(["Paris", "Oslo", "Lima", "Pune"]), "unit": "c"},
        "search_web": {"query": f"topic {rnd.randint(1, 999)}", "limit": 5},
        "read_file": {"path": f"src/mod{rnd.randint(1, 50)}.py"},
        "write_file": {"path": "out.txt", "content": "x" * rnd.randint(10, 400)},
        "run_shell": {"command": "pytest -q", "timeout": 30.0},
        "calculator": {"expression": f"{rnd.randint(1, 99)}*{rnd.randint(1, 99)}"},
    }[name]


def _choose_reply(rnd: random.Random, last: bool) -> tuple[str, str | None, dict | None, str]:
    """(kind, name, arguments, text) for the model's reply in this turn."""
    if last:
        return "prose", None, None, "All done. " + "The result is described here. " * rnd.randint(2, 20)
    r = rnd.random()
    name = rnd.choice(TOOL_NAMES)
    if r < 0.80:
        return "call", name, _args_for(name, rnd), ""
    if r < 0.88:
        return "call", "delete_everything", {"really": True}, ""
    if r < 0.95:
        return "call", name, {"bogus": 1}, ""
    return "prose", None, None, "I think I should look that up first. " * rnd.randint(1, 5)


def _sse(chunks: list[dict], done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _openai_reply(
    stack: str, model: str, kind: str, name, args, text, stream: bool, rnd: random.Random
) -> tuple[bytes, str]:
    cid = f"chatcmpl-{rnd.getrandbits(48):x}"
    base = {"id": cid, "object": "chat.completion", "created": 1764000000, "model": model}
    if stack == "ollama":
        base["system_fingerprint"] = OLLAMA.system_fingerprint
    if stack == "llamacpp":
        base["system_fingerprint"] = "b6512-a1b2c3d4"
    if stack == "sglang":
        base["metadata"] = {"weight_version": "default"}
    in_text = stack == "sglang" and kind == "call"
    tool_calls = []
    if kind == "call" and not in_text:
        tool_calls = [
            {
                "id": f"call_{rnd.getrandbits(32):x}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
        ]
    if in_text:
        text = "<tool_call>\n" + orjson.dumps({"name": name, "arguments": args}).decode() + "\n</tool_call>"
    finish = "tool_calls" if tool_calls else "stop"
    usage = {"prompt_tokens": rnd.randint(300, 6000), "completion_tokens": rnd.randint(10, 400), "total_tokens": 0}
    extra_choice = {"matched_stop": 151645} if stack == "sglang" else ({"stop_reason": None} if stack == "vllm" else {})
    if not stream:
        msg = {"role": "assistant", "content": text or None}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        body = dict(
            base, choices=[dict({"index": 0, "message": msg, "finish_reason": finish}, **extra_choice)], usage=usage
        )
        if stack == "llamacpp":
            body["timings"] = {"prompt_n": 12, "cache_n": 300, "predicted_n": 40}
        return orjson.dumps(body), "application/json"
    base["object"] = "chat.completion.chunk"
    chunks = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    if text:
        words = text.split(" ")
        for i in range(0, len(words), 3):
            piece = " ".join(words[i : i + 3]) + " "
            chunks.append(dict(base, choices=[{"index": 0, "delta": {"content": piece}, "finish_reason": None}]))
    for tc in tool_calls:
        if stack == "ollama":
            chunks.append(
                dict(base, choices=[{"index": 0, "delta": {"tool_calls": [dict(tc, index=0)]}, "finish_reason": None}])
            )
        else:
            chunks.append(
                dict(
                    base,
                    choices=[
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": tc["id"],
                                        "type": "function",
                                        "function": {"name": tc["function"]["name"], "arguments": ""},
                                    }
                                ]
                            },
                            "finish_reason": None,
                        }
                    ],
                )
            )
            a = tc["function"]["arguments"]
            for i in range(0, len(a), 8):
                chunks.append(
                    dict(
                        base,
                        choices=[
                            {
                                "index": 0,
                                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": a[i : i + 8]}}]},
                                "finish_reason": None,
                            }
                        ],
                    )
                )
    chunks.append(dict(base, choices=[dict({"index": 0, "delta": {}, "finish_reason": finish}, **extra_choice)]))
    chunks.append(dict(base, choices=[], usage=usage))
    return _sse(chunks), "text/event-stream"


def _ollama_native(model: str, kind: str, name, args, text, stream: bool, rnd: random.Random) -> tuple[bytes, str]:
    msgs = []
    if text:
        words = text.split(" ")
        msgs = [{"role": "assistant", "content": " ".join(words[i : i + 3]) + " "} for i in range(0, len(words), 3)]
    if kind == "call":
        msgs.append(
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": args}}]}
        )
    final = {
        "model": model,
        "created_at": "2026-11-29T12:00:00Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "total_duration": 123456,
        "prompt_eval_count": rnd.randint(300, 5000),
        "eval_count": rnd.randint(10, 300),
    }
    if not stream:
        merged = {"role": "assistant", "content": "".join(m["content"] for m in msgs)}
        calls = [tc for m in msgs for tc in m.get("tool_calls", [])]
        if calls:
            merged["tool_calls"] = calls
        return orjson.dumps(dict(final, message=merged)), "application/json"
    lines = [
        orjson.dumps({"model": model, "created_at": "2026-11-29T12:00:00Z", "message": m, "done": False}) for m in msgs
    ]
    lines.append(orjson.dumps(final))
    return b"\n".join(lines) + b"\n", "application/x-ndjson"


def _write_answered(
    f,
    rec: Record,
    t: float,
    status: int,
    ctype: str,
    body: bytes,
    ttfb_ms: float,
    duration_ms: float,
    headers: list | None = None,
) -> None:
    """Complete a record with the upstream's answer and write it as the segment writer does."""
    rec.status = rec.client_status = status
    rec.response_headers = [["content-type", ctype], *(headers or [])]
    rec.response_body, rec.response_body_encoding = encode_body(body)
    rec.response_complete = True
    rec.ttfb_ms, rec.duration_ms = ttfb_ms, duration_ms
    rec.ended_at = t + duration_ms / 1000
    f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))


def generate(data_dir: Path, n_exchanges: int, seed: int = 7, segment_records: int = 20000) -> int:
    rnd = random.Random(seed)
    seg_dir = data_dir / SEGMENT_DIR
    seg_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    seg_no = 0
    f = None
    t = 1764000000.0
    runs = list(RUN_SETUPS)
    episode_no = 0
    while written < n_exchanges:
        if f is None or written // segment_records >= seg_no:
            if f is not None:
                f.close()
            seg_no += 1
            f = open(seg_dir / f"20261129T120000-1-{seg_no:04d}.jsonl", "wb")
        run = runs[episode_no % len(runs)]
        stack, condition = RUN_SETUPS[run]
        episode_no += 1
        model = {"ollama_refuse": "gemma3:4b", "ollama": "qwen3:8b", "ollama_native": "qwen3:8b"}.get(
            stack, "Qwen/Qwen3-8B"
        )
        path = "/api/chat" if stack == "ollama_native" else "/v1/chat/completions"
        stream = rnd.random() < 0.5
        n_turns = 1 if stack in ("ollama_refuse", "vllm_refuse") else rnd.choice([1, 2, 3, 4, 5, 6, 8, 12])
        messages = [
            {"role": "system", "content": "You are a careful agent. Use tools when they help. " * 8},
            {
                "role": "user",
                "content": f"Task {rnd.randint(1, 400)}: "
                + "please investigate the repository and report. " * rnd.randint(1, 6),
            },
        ]
        item = f"{rnd.choice(['simple', 'multiple', 'parallel'])}_{rnd.randint(0, 199)}"
        tagged = run != "(untagged)"
        for turn in range(n_turns):
            kind, name, args, text = _choose_reply(rnd, turn == n_turns - 1)
            attempts = 1 + (rnd.random() < 0.04) * rnd.randint(1, 3)
            fail_all = rnd.random() < 0.02
            req_obj = {"model": model, "messages": messages, "tools": TOOLS, "stream": stream}
            req = orjson.dumps(req_obj)
            for a in range(attempts):
                t += rnd.random() * 0.5
                rec = Record(
                    id=new_id(),
                    started_at=t,
                    upstream="http://127.0.0.1:8000",
                    method="POST",
                    path=path,
                    client_path=(f"/t/run={run}/episode={episode_no}/item={item}" if tagged else "") + path,
                    run=run if tagged else None,
                    episode=str(episode_no) if tagged else None,
                    item=item if tagged else None,
                    condition=condition,
                )
                rec.request_headers = [
                    ["Host", "127.0.0.1:8787"],
                    ["Content-Type", "application/json"],
                    ["Authorization", "redacted:1a2b3c4d"],
                ]
                rec.request_body, rec.request_body_encoding = encode_body(req)
                rec.request_body_size = len(req)
                failing = (a < attempts - 1) or fail_all
                if stack == "vllm_refuse":
                    refusal = VLLM.failures[TOOL_REFUSAL]
                    body = orjson.dumps(
                        {
                            "error": {
                                "message": refusal.text(),
                                "type": "BadRequestError",
                                "param": None,
                                "code": refusal.status,
                            }
                        }
                    )
                    status, ctype = refusal.status, "application/json"
                elif stack == "ollama_refuse":
                    refusal = OLLAMA.failures[TOOL_REFUSAL]
                    body = orjson.dumps(
                        {
                            "error": {
                                "message": refusal.text(model=f"registry.ollama.ai/library/{model}"),
                                "type": "invalid_request_error",
                                "param": None,
                                "code": None,
                            }
                        }
                    )
                    status, ctype = refusal.status, "application/json"
                elif failing and rnd.random() < 0.3:
                    rec.set_error(
                        "timeout", "upstream http://127.0.0.1:8000 sent no response within 600s (--ttfb-timeout)"
                    )
                    rec.client_status = 504
                    rec.client_body, rec.client_body_encoding = encode_body(
                        b'{"error":{"message":"timeout","type":"toolproxy_error","param":null,"code":"upstream_timeout"}}'
                    )
                    rec.ended_at, rec.duration_ms = t + 600, 600000.0
                    f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
                    written += 1
                    t = rec.ended_at  # a harness asks again once its attempt has failed
                    continue
                elif failing:
                    body, status, ctype = (
                        b'{"error":{"message":"CUDA out of memory","type":"InternalServerError","code":500}}',
                        500,
                        "application/json",
                    )
                elif stack == "ollama_native":
                    body, ctype = _ollama_native(model, kind, name, args, text, stream, rnd)
                    status = 200
                else:
                    body, ctype = _openai_reply(stack, model, kind, name, args, text, stream, rnd)
                    status = 200
                ttfb = rnd.uniform(50, 3000)
                _write_answered(
                    f,
                    rec,
                    t,
                    status,
                    ctype,
                    body,
                    ttfb,
                    ttfb + rnd.uniform(10, 9000),
                    [["date", "Sat, 29 Nov 2026 12:00:00 GMT"]],
                )
                written += 1
                if failing:
                    t = rec.ended_at
            if stack in ("ollama_refuse", "vllm_refuse") or fail_all:
                break
            if kind == "call":
                call_id = f"call_{turn}"
                reply_msg = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": orjson.dumps(args).decode()},
                        }
                    ],
                }
                if stack == "sglang":
                    reply_msg = {
                        "role": "assistant",
                        "content": "<tool_call>\n"
                        + orjson.dumps({"name": name, "arguments": args}).decode()
                        + "\n</tool_call>",
                    }
                messages = messages + [
                    reply_msg,
                    {"role": "tool", "tool_call_id": call_id, "content": "result: " + "data " * rnd.randint(5, 80)},
                ]
            else:
                messages = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
    if f is not None:
        f.close()
    return written


def generate_small(data_dir: Path, n_exchanges: int, seed: int = 11, segment_records: int = 20000) -> int:
    """Single-turn exchanges with short bodies: a question, at most one small tool, a short reply."""
    rnd = random.Random(seed)
    seg_dir = data_dir / SEGMENT_DIR
    seg_dir.mkdir(parents=True, exist_ok=True)
    tool = TOOLS[5]
    t = 1764000000.0
    f = None
    for i in range(n_exchanges):
        if i % segment_records == 0:
            if f is not None:
                f.close()
            f = open(seg_dir / f"20261129T130000-1-{i // segment_records + 1:04d}.jsonl", "wb")
        t += rnd.random() * 0.05
        run = f"small-{i % 4}"
        offered = rnd.random() < 0.5
        stream = rnd.random() < 0.3
        req_obj = {
            "model": "qwen3:8b",
            "messages": [{"role": "user", "content": f"What is {rnd.randint(1, 99)}*{rnd.randint(1, 99)}?"}],
            "stream": stream,
        }
        if offered:
            req_obj["tools"] = [tool]
        req = orjson.dumps(req_obj)
        rec = Record(
            id=new_id(),
            started_at=t,
            upstream="http://127.0.0.1:11434",
            method="POST",
            path="/v1/chat/completions",
            client_path=f"/t/run={run}/v1/chat/completions",
            run=run,
            condition="native",
        )
        rec.request_headers = [["Content-Type", "application/json"]]
        rec.request_body, rec.request_body_encoding = encode_body(req)
        rec.request_body_size = len(req)
        r = rnd.random()
        if r < 0.03:
            body, status, ctype = (
                b'{"error":{"message":"model is loading","type":"server_error","code":503}}',
                503,
                "application/json",
            )
        else:
            if offered and r < 0.6:
                kind, name, args, text = (
                    "call",
                    "calculator",
                    {"expression": f"{rnd.randint(1, 99)}*{rnd.randint(1, 99)}"},
                    "",
                )
            else:
                kind, name, args, text = "prose", None, None, "The answer is " + str(rnd.randint(1, 9999)) + "."
            body, ctype = _openai_reply("ollama", "qwen3:8b", kind, name, args, text, stream, rnd)
            status = 200
        ttfb = rnd.uniform(20, 400)
        _write_answered(f, rec, t, status, ctype, body, ttfb, ttfb + rnd.uniform(5, 900))
    if f is not None:
        f.close()
    return n_exchanges


WORDS = (
    "the a of to in is that for it as with was on be by this are from at or an have not which but all were when we "
    "there can has more if will one about up out their so what other into its time only could new some these them "
    "file line function return value error test module class import path config request response result data list "
    "string number field table query index build run check update found missing expected passed failed warning"
).split()
MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"


def _text(rnd: random.Random, n_bytes: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_bytes:
        word = (
            rnd.choice(WORDS)
            if rnd.random() < 0.9
            else f"{rnd.choice(WORDS)}_{rnd.randint(0, 9999)}.py:{rnd.randint(1, 999)}"
        )
        out.append(word)
        size += len(word) + 1
        if rnd.random() < 0.08:
            out.append("\n")
    return " ".join(out)[:n_bytes]


def episode(rnd: random.Random, n: int, turns: int, growth: int, tagged: bool = True) -> list[Record]:
    """One agent episode, `turns` exchanges; each request's history is `growth` bytes longer.
    Untagged, its records name no run or episode (analyze chains them by their messages)."""
    messages = [
        {"role": "system", "content": "You are a coding agent working in a repository. " + _text(rnd, 1200)},
        {"role": "user", "content": f"Task {n}: " + _text(rnd, 400)},
    ]
    records = []
    for turn in range(turns):
        req = orjson.dumps(
            {
                "model": MODEL,
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "auto",
                "temperature": 0.2,
                "stream": False,
            }
        )
        name = rnd.choice(TOOL_NAMES)
        args = _args_for(name, rnd)
        body, ctype = _openai_reply("vllm", MODEL, "call", name, args, "", False, rnd)
        rec = Record(
            id=new_id(),
            started_at=1764000000.0 + turn,
            upstream="http://127.0.0.1:8000",
            method="POST",
            path="/v1/chat/completions",
            client_path=(f"/t/run=bench/episode={n}" if tagged else "") + "/v1/chat/completions",
            run="bench" if tagged else None,
            episode=str(n) if tagged else None,
            status=200,
            client_status=200,
            response_complete=True,
        )
        rec.request_headers = [
            ["Host", "127.0.0.1:8787"],
            ["Content-Type", "application/json"],
            ["Authorization", "redacted:1a2b3c4d"],
            ["User-Agent", "OpenAI/Python 1.99.0"],
            ["Content-Length", str(len(req))],
        ]
        rec.request_body, rec.request_body_encoding = encode_body(req)
        rec.request_body_size = len(req)
        rec.response_headers = [
            ["content-type", ctype],
            ["date", "Sat, 29 Nov 2026 12:00:00 GMT"],
            ["content-length", str(len(body))],
        ]
        rec.response_body, rec.response_body_encoding = encode_body(body)
        rec.ttfb_ms = rec.duration_ms = 900.0 + turn
        rec.ended_at = rec.started_at + 1
        records.append(rec)
        call = {
            "id": f"call_{n}_{turn}",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(args).decode()},
        }
        before = len(orjson.dumps(messages))
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": ""},
        ]
        messages[-1]["content"] = _text(rnd, max(0, growth - (len(orjson.dumps(messages)) - before)))
    return records


def generate_long(
    data_dir: Path,
    n_exchanges: int,
    seed: int = 13,
    segment_records: int = 20000,
    concurrent: int = 64,
    tagged: bool = True,
    days: int = 0,
) -> int:
    """Long-running production agent traffic, whose records are several times the `agents` mix's:
    episodes of 20-50 turns in one run, each request resending a ~1.6 KB system prompt and task, ~2 KB of tools and its
    history so far (records of 4-12 KB), `concurrent` episodes interleaved at a time, stamped in the
    order they are written. `tagged`: the episodes carry their tags, else nothing does (one run whose
    episodes analyze reconstructs). `days`: the records are spread over that many days, each day's
    in a run of its own (`serve --run prod-%Y-%m-%d`), so conversations that cross midnight are split."""
    rnd = random.Random(seed)
    seg_dir = data_dir / SEGMENT_DIR
    seg_dir.mkdir(parents=True, exist_ok=True)
    written, n, t = 0, 0, 1764000000.0
    f = None
    while written < n_exchanges:
        group = []
        for _ in range(concurrent):
            group.append(episode(rnd, n, rnd.randint(20, 50), 150, tagged))
            n += 1
        for rec in interleaved(group)[: n_exchanges - written]:
            if written % segment_records == 0:
                if f is not None:
                    f.close()
                f = open(seg_dir / f"20261129T140000-1-{written // segment_records + 1:04d}.jsonl", "wb")
            t += rnd.random() * 0.05
            rec.started_at, rec.ended_at = t, t + 1
            if days:
                rec.run = f"prod-2026-11-{written * days // n_exchanges + 1:02d}"
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
            written += 1
    if f is not None:
        f.close()
    return written


def generate_untagged(
    data_dir: Path, n_exchanges: int, seed: int = 17, segment_records: int = 20000, concurrent: int = 64
) -> int:
    """generate_long's traffic with no tags at all, as a proxy nobody configured records it."""
    return generate_long(data_dir, n_exchanges, seed, segment_records, concurrent, tagged=False)


def generate_daily(data_dir: Path, n_exchanges: int, seed: int = 17, segment_records: int = 20000) -> int:
    """generate_untagged's traffic over 30 days, as `serve --run prod-%Y-%m-%d` records it."""
    return generate_long(data_dir, n_exchanges, seed, segment_records, tagged=False, days=30)


def interleaved(episodes: list[list[Record]]) -> list[Record]:
    """Turn t of every episode before turn t+1 of any: concurrent agents."""
    return [ep[t] for t in range(max(map(len, episodes))) for ep in episodes if t < len(ep)]


def small_records(n: int) -> list[Record]:
    rnd = random.Random(3)
    out = []
    for i in range(n):
        rec = Record(id=new_id(), started_at=1764000000.0 + i, method="POST", path="/v1/chat/completions", status=200)
        rec.request_body, rec.request_body_encoding = encode_body(
            orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": _text(rnd, 600)}]})
        )
        rec.response_body, rec.response_body_encoding = encode_body(b'{"choices":[{"message":{"content":"ok"}}]}')
        out.append(rec)
    return out
