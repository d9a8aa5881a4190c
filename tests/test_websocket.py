"""WebSockets on a model route through a real `toolproxy serve`: Codex's captured Responses
WebSocket frames sent through the proxy to an upstream that accepts the upgrade (the emulated
OpenAI API's WebSocket mode, aiohttp's server), one that refuses it (the emulated llama-server
answers 405), and under a condition that rewrites (the upgrade not offered); the frame reader by
tables of cases."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import aiohttp
import pytest
from proxyprocess import ProxyProcess, start_all, stop_in_background
from test_protocols import sql, tp

from toolproxy.emulators import FakeStack, ModelRequest, call, text
from toolproxy.wire.websocket import BINARY, CLOSE, PING, TEXT, FrameReader, close_code, negotiated_deflate

FRAMES = Path(__file__).parent / "data" / "websocket" / "codex-0.171.0-client.jsonl"
CODEX = [line for line in FRAMES.read_text().splitlines() if line]


# -- frames, by tables of cases


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False, mask: bytes | None = None) -> bytes:
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    size = (
        bytes([n])
        if n < 126
        else bytes([126]) + n.to_bytes(2, "big")
        if n < 65536
        else bytes([127]) + n.to_bytes(8, "big")
    )
    if mask is None:
        return head + size + payload
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + bytes([size[0] | 0x80]) + size[1:] + mask + masked


def deflated(compressor, payload: bytes) -> bytes:
    data = compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


def test_frames_masked_fragmented_and_interleaved_with_control_frames():
    big = json.dumps({"type": "response.create", "input": "x" * 70000}).encode()
    wire = (
        frame(TEXT, b'{"type":', fin=False, mask=b"abcd")
        + frame(PING, b"p", mask=b"wxyz")
        + frame(0x0, b'"response.create"}', mask=b"1234")
        + frame(BINARY, b"\x00\xff")
        + frame(TEXT, big, mask=b"\x01\x02\x03\x04")
        + frame(CLOSE, (1000).to_bytes(2, "big") + b"bye", mask=b"abcd")
    )
    for step in (len(wire), 1, 7):
        reader = FrameReader()
        got = []
        for i in range(0, len(wire), step):
            got += reader.feed(wire[i : i + step])
        assert [(m.opcode, m.payload) for m in got] == [
            (PING, b"p"),
            (TEXT, b'{"type":"response.create"}'),
            (BINARY, b"\x00\xff"),
            (TEXT, big),
            (CLOSE, (1000).to_bytes(2, "big") + b"bye"),
        ]
        assert close_code(got[-1].payload) == (1000, "bye") and reader.broken is None


@pytest.mark.parametrize("takeover", [True, False])
def test_compressed_messages_with_and_without_context_takeover(takeover):
    messages = [b'{"type":"response.created"}', b'{"type":"response.created"}' * 3, b'{"type":"response.completed"}']
    compressor = zlib.compressobj(wbits=-15)
    wire = b""
    for m in messages:
        if not takeover:
            compressor = zlib.compressobj(wbits=-15)
        wire += frame(TEXT, deflated(compressor, m), rsv1=True)
    reader = FrameReader(deflate=True, no_context_takeover=not takeover)
    assert [m.payload for m in reader.feed(wire)] == messages


def test_a_message_above_the_limit_is_counted_not_kept():
    reader = FrameReader(limit=10)
    got = reader.feed(frame(TEXT, b"x" * 11) + frame(TEXT, b"ok"))
    assert [(m.payload, m.size) for m in got] == [(None, 13), (b"ok", 4)]


def test_what_a_server_agreed_to_compress():
    assert negotiated_deflate(None) is None
    d = negotiated_deflate("permessage-deflate; server_no_context_takeover; client_max_window_bits=15")
    assert d is not None and d.server_no_context_takeover and not d.client_no_context_takeover


# -- through a real proxy


def codex_model(req: ModelRequest):
    if req.messages and req.messages[-1].get("role") == "tool":
        return text("Created hello.txt containing hi.")
    return call("exec_command", {"cmd": "printf 'hi\\n' > hello.txt"})


@pytest.fixture(scope="module")
def openai_ws():
    stack = FakeStack("openai", responder=codex_model)
    with stack.in_thread():
        yield stack


@pytest.fixture(scope="module")
def llamacpp():
    stack = FakeStack("llamacpp", responder=codex_model)
    with stack.in_thread():
        yield stack


@pytest.fixture(scope="module")
def proxies(openai_ws, llamacpp, tmp_path_factory):
    started = {}
    for name, upstream, args in (
        ("accepts", openai_ws.url, ()),
        ("refuses", llamacpp.url, ()),
        ("text", openai_ws.url, ("--condition", "text")),
        ("small", openai_ws.url, ("--max-body", "2KiB")),
    ):
        started.update(start_all(upstream, {name: (tmp_path_factory.mktemp(name), ("--durability", "sync", *args))}))
    yield started
    stop_in_background(started.values())


HEADERS = {"openai-beta": "responses_websockets=2026-02-06", "Authorization": "Bearer sk-codex-secret"}


async def codex_session(url: str, messages: list[str], model: str, on_end=None) -> list[list[str]]:
    """Send Codex's messages on one WebSocket as Codex does (each after the previous response
    completed, its previous_response_id that response's id); the server's messages per request."""
    answers: list[list[str]] = []
    previous = None
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url + "/v1/responses", headers=HEADERS, compress=15) as ws:
            for message in messages:
                body = json.loads(message)
                body["model"] = model
                if "previous_response_id" in body:
                    body["previous_response_id"] = previous
                await ws.send_str(json.dumps(body))
                got = []
                while True:
                    msg = await ws.receive(timeout=30)
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    got.append(msg.data)
                    event = json.loads(msg.data)
                    if event["type"] in ("response.completed", "error"):
                        break
                if on_end is not None:
                    on_end()
                previous = event.get("response", {}).get("id")
                answers.append(got)
    return answers


def exchanges(p: ProxyProcess) -> list[dict]:
    return [r for r in p.records() if r.get("kind") == "exchange"]


def test_codex_frames_pass_through_and_each_response_is_an_exchange(proxies, openai_ws):
    p = proxies["accepts"]
    on_disk = []
    answers = asyncio.run(
        codex_session(p.url, CODEX, openai_ws.model, on_end=lambda: on_disk.append(len(exchanges(p))))
    )
    assert [a[-1] for a in answers] and all(json.loads(a[-1])["type"] == "response.completed" for a in answers)
    # --durability sync: each response's last message reached the client only once its record was on disk
    assert on_disk == [1, 2, 3]
    p.wait_records(4)
    recs = exchanges(p)
    connection = recs[-1]
    assert connection["status"] == 101 and connection["extra"]["websocket"]["upgrade"] == "accepted"
    assert connection["extra"]["websocket"]["exchanges"] == 3
    sent = [m.json() for m in openai_ws.seen if m.method == "WS"][-3:]
    for rec, answer, upstream_got in zip(recs[:3], answers, sent, strict=True):
        assert rec["extra"]["websocket"] == {"connection": connection["id"], "exchange": recs.index(rec)}
        assert rec["request_body"] == json.dumps(upstream_got)  # what the upstream got, byte for byte
        assert rec["response_body"] == "".join(m + "\n" for m in answer)  # what the client got
        assert rec["response_complete"] and rec["error_kind"] is None
        assert "sk-codex-secret" not in json.dumps(rec["request_headers"])
    r = tp("analyze", "--data", str(p.data))
    assert r.returncode == 0, r.stderr
    rows = sql(p.data, "SELECT is_attempt, outcome, status, side_request FROM exchanges ORDER BY started_at")
    assert [(row["is_attempt"], row["outcome"]) for row in rows] == [
        (False, None),  # the connection, opened first
        (False, None),  # the prewarm: a side request, no turn
        (True, "valid_call"),
        (True, "prose"),
    ]
    assert rows[1]["side_request"] == "prewarm" and {r["status"] for r in rows} == {101}


def test_an_upstream_that_refuses_the_upgrade_is_relayed_and_recorded_as_that(proxies):
    p = proxies["refuses"]

    async def connect():
        async with aiohttp.ClientSession() as session:
            await session.ws_connect(p.url + "/v1/responses", headers=HEADERS)

    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        asyncio.run(connect())
    assert caught.value.status == 405
    rec = p.wait_records(1)[-1]
    assert (rec["method"], rec["status"], rec["extra"]["websocket"]) == ("GET", 405, {"upgrade": "refused"})
    assert json.loads(rec["response_body"])["error"]["message"] == "Method Not Allowed"


def test_under_a_rewriting_condition_the_upgrade_is_not_offered(proxies, openai_ws):
    p = proxies["text"]
    before = len(openai_ws.seen)

    async def connect():
        async with aiohttp.ClientSession() as session:
            await session.ws_connect(p.url + "/v1/responses", headers=HEADERS)

    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        asyncio.run(connect())
    assert caught.value.status == 405  # the GET as the upstream answers it without an upgrade
    assert openai_ws.seen[before].method == "GET" and "Upgrade" not in openai_ws.seen[before].headers
    rec = p.wait_records(1)[-1]
    assert rec["extra"]["websocket"]["upgrade"] == "not offered"
    assert "text condition" in rec["extra"]["websocket"]["why"]


def test_a_message_above_max_body_ends_the_connection_and_is_recorded(proxies, openai_ws):
    p = proxies["small"]

    async def send_big():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(p.url + "/v1/responses", headers=HEADERS) as ws:
                await ws.send_str(
                    json.dumps({"type": "response.create", "model": openai_ws.model, "input": "x" * 4096})
                )
                return await ws.receive(timeout=30)

    msg = asyncio.run(send_big())
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    rec = p.wait_records(1)[-1]
    assert rec["error_kind"] == "body_too_large" and "--max-body" in rec["error_message"]


def test_the_connection_record_says_how_it_closed(proxies, openai_ws):
    p = proxies["accepts"]
    asyncio.run(codex_session(p.url, CODEX[:1], openai_ws.model))
    rec = p.wait_records(2)[-1]
    info = rec["extra"]["websocket"]
    assert info["client_close"]["code"] == 1000 and info["exchanges"] == 1
    assert rec["ttfb_ms"] is not None and rec["duration_ms"] >= rec["ttfb_ms"]


def test_a_recorded_websocket_exchange_replays_as_the_http_request_it_stands_for():
    from toolproxy.drive.replay import RecordedTurn, build_request
    from toolproxy.wire.websocket import create_as_post

    message = CODEX[1].encode()
    turn = RecordedTurn(
        "t1",
        "r",
        "e",
        None,
        0,
        None,
        "GET",
        "/v1/responses",
        None,
        [["Upgrade", "websocket"], ["Sec-WebSocket-Key", "abc"], ["openai-beta", "responses_websockets=x"]],
        message,
        {},
    )
    req = build_request(turn, "r2")
    sent = json.loads(req.body)
    assert req.method == "POST" and req.target.endswith("/v1/responses")
    assert sent == {**{k: v for k, v in json.loads(message).items() if k != "type"}, "stream": True}
    assert [k for k, _ in req.headers] == ["openai-beta"]
    assert create_as_post(b'{"type":"response.cancel"}') is None and create_as_post(b"not json") is None
