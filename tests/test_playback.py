"""`toolproxy playback`: recordings made through a real `toolproxy serve` in front of emulated stacks,
served back by a real playback server to real HTTP clients and the real openai and anthropic SDKs,
with no model server running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from proxyprocess import ProxyProcess

from toolproxy import emulators as fakes
from toolproxy.playback.fixture import load_fixture
from toolproxy.playback.match import Matcher, MatchError, Miss, first_difference, normalise, parse_rules
from toolproxy.playback.server import PlaybackOptions, start_playback
from toolproxy.record.pacing import MAX_MARKS, PieceTimes
from toolproxy.record.segments import read_records

RUN = "nightly"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]


def _chat(content: str, stream: bool, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "tools": TOOLS, "stream": stream, **extra}


# (name, path, body): every protocol the proxy serves, streamed and not.
PROTOCOLS = [
    ("chat", "/v1/chat/completions", _chat("Weather in Paris?", False)),
    ("chat-stream", "/v1/chat/completions", _chat("Weather in Paris?", True)),
    (
        "responses",
        "/v1/responses",
        {
            "model": "m",
            "input": "Weather in Lima?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
        },
    ),
    ("responses-stream", "/v1/responses", {"model": "m", "input": "Weather in Lima?", "stream": True}),
    (
        "messages",
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Oslo?"}], "tools": ANTHROPIC_TOOLS},
    ),
    (
        "messages-stream",
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Oslo?"}]},
    ),
]
OLLAMA = [
    (
        "ollama-chat",
        "/api/chat",
        {"model": "qwen3:8b", "messages": [{"role": "user", "content": "Quito?"}], "stream": False},
    ),
    ("ollama-chat-stream", "/api/chat", {"model": "qwen3:8b", "messages": [{"role": "user", "content": "Quito?"}]}),
    ("ollama-generate", "/api/generate", {"model": "qwen3:8b", "prompt": "Say hi", "stream": False}),
    ("ollama-generate-stream", "/api/generate", {"model": "qwen3:8b", "prompt": "Say hi"}),
]
REPEATED = _chat("Tell me a joke", False)


def _post(url: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except http_errors() as exc:  # a recorded cut: what arrived before it
        return 200, getattr(exc, "partial", b"")


def http_errors():
    import http.client

    return (http.client.IncompleteRead,)


class Recording:
    """The module's recording: what each emulated upstream sent for each request, by name."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.sent: dict[str, tuple[int, bytes]] = {}


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Recording:
    """One run recorded through `toolproxy serve` (sync durability: on disk when answered): every
    protocol against llama-server's and Ollama's emulators, a refusal, a mid-stream close, a
    request asked twice with two different replies, and two episodes asking the same thing."""
    rec = Recording(tmp_path_factory.mktemp("playback") / "data")
    args = ("--durability", "sync", "--no-fingerprint", "--quiet", "--run", RUN)
    llama = fakes.FakeStack("llamacpp")
    with llama.in_thread():
        p = ProxyProcess(llama.url, rec.data, args)
        try:
            for name, path, body in PROTOCOLS:
                llama.enqueue(
                    fakes.call("get_weather", {"city": "Paris"})
                    if "stream" not in name
                    else fakes.text("It is sunny and 21C in the city today.")
                )
                _post(p.url + path, body)
                rec.sent[name] = (llama.seen[-1].status, llama.seen[-1].sent)
            llama.enqueue(fakes.text("first joke"), fakes.text("second joke"))
            for n in ("repeat-1", "repeat-2"):
                _post(p.url + "/v1/chat/completions", REPEATED)
                rec.sent[n] = (llama.seen[-1].status, llama.seen[-1].sent)
            llama.fail(status=400, message="tools param requires --jinja flag")
            _post(p.url + "/v1/chat/completions", _chat("refused", False))
            rec.sent["refusal"] = (llama.seen[-1].status, llama.seen[-1].sent)
            llama.inject(fakes.close_mid_stream(after=2))
            llama.enqueue(fakes.text("this stream is cut short after two events"))
            _post(p.url + "/v1/chat/completions", _chat("cut", True))
            rec.sent["cut"] = (llama.seen[-1].status, llama.seen[-1].sent)
            for episode in ("1", "2"):
                llama.enqueue(fakes.text(f"answer of episode {episode}"))
                _post(p.url + f"/t/episode={episode}/v1/chat/completions", _chat("same question", False))
                rec.sent[f"episode-{episode}"] = (llama.seen[-1].status, llama.seen[-1].sent)
            llama.inject(fakes.stall(between=0.05))
            llama.enqueue(fakes.text("one two three four five six"))
            _post(p.url + "/v1/chat/completions", _chat("paced", True))
            rec.sent["paced"] = (llama.seen[-1].status, llama.seen[-1].sent)
        finally:
            assert p.stop() == 0
    ollama = fakes.FakeStack("ollama")
    with ollama.in_thread():
        p = ProxyProcess(ollama.url, rec.data, args)
        try:
            for name, path, body in OLLAMA:
                _post(p.url + path, body)
                rec.sent[name] = (ollama.seen[-1].status, ollama.seen[-1].sent)
        finally:
            assert p.stop() == 0
    return rec


@contextlib.asynccontextmanager
async def playing(rec: Recording, rules=(), **options):
    """A playback server of the module's recording on this loop, stopped at the end."""
    running = await start_playback(
        load_fixture(rec.data, RUN), parse_rules(rules), PlaybackOptions(run=RUN, data_dir=rec.data, **options)
    )
    try:
        yield running
    finally:
        await running.stop()


async def _ask(session: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None):
    async with session.post(url, json=body, headers=headers) as r:
        return r.status, await r.read(), r.headers


# ------------------------------------------------------------------ hits


async def test_each_protocol_streamed_and_not_is_played_back_byte_for_byte(recording):
    """What the upstream sent when recording is what the harness gets, status and every byte,
    for chat completions, Responses, Messages and Ollama's chat and generate, streams included."""
    recorded = {x.id: dict((k.lower(), v) for k, v in x.headers) for x in load_fixture(recording.data, RUN).exchanges}
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            for name, path, body in PROTOCOLS + OLLAMA:
                status, got, headers = await _ask(s, running.url + path, body)
                assert (status, got) == recording.sent[name], name
                assert headers["Content-Type"] == recorded[headers["X-Toolproxy-Playback"]]["content-type"], name
        assert running.stats.played == len(PROTOCOLS + OLLAMA) and running.stats.missed == 0


async def test_identical_requests_get_the_recorded_replies_in_turn_then_a_miss(recording):
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            first = await _ask(s, running.url + "/v1/chat/completions", REPEATED)
            second = await _ask(s, running.url + "/v1/chat/completions", REPEATED)
            third = await _ask(s, running.url + "/v1/chat/completions", REPEATED)
        assert first[:2] == recording.sent["repeat-1"] and b"first joke" in first[1]
        assert second[:2] == recording.sent["repeat-2"] and b"second joke" in second[1]
        assert third[0] == 404 and third[2]["X-Toolproxy-Playback"] == "miss"
        assert "all 2 recorded replies to this request were already played" in json.loads(third[1])["error"]["message"]


async def test_volatile_fields_are_ignored_and_the_tag_prefix_is_taken_off(recording):
    """The harness's ids, `user`, metadata and stream options differ between runs; tags and
    headers say who asks, not what: none of them stops a match."""
    body = {
        **PROTOCOLS[1][2],
        "user": "u-42",
        "metadata": {"ts": time.time()},
        "stream_options": {"include_usage": True},
    }
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            status, got, _ = await _ask(
                s,
                running.url + "/t/run=ci/item=q1/v1/chat/completions",
                body,
                {"Authorization": "Bearer sk-other", "X-Toolproxy-Tag-Shard": "3"},
            )
        assert (status, got) == recording.sent["chat-stream"]


async def test_a_long_history_is_read_whole(recording):
    """Agent histories run to megabytes: a body past aiohttp's 1 MiB default is matched, not refused."""
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            status, got, _ = await _ask(s, running.url + "/v1/chat/completions", _chat("x" * (3 << 20), False))
        assert status == 404 and b"playback_miss" in got


async def test_episodes_are_answered_from_their_own_exchanges(recording):
    """By the path prefix (also with the /v1 misplaced before it, as serve takes it) or a header."""
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            two = await _ask(s, running.url + "/t/episode=2/v1/chat/completions", _chat("same question", False))
            one = await _ask(s, running.url + "/v1/t/episode=1/chat/completions", _chat("same question", False))
            again = await _ask(
                s, running.url + "/v1/chat/completions", _chat("same question", False), {"X-Toolproxy-Episode": "2"}
            )
        assert two[:2] == recording.sent["episode-2"] and one[:2] == recording.sent["episode-1"]
        assert again[0] == 404 and "recorded replies to this request were already played" in again[1].decode()
    async with playing(recording, ["episodes=off"]) as pooled:
        async with aiohttp.ClientSession() as s:
            first = await _ask(s, pooled.url + "/t/episode=2/v1/chat/completions", _chat("same question", False))
        assert first[:2] == recording.sent["episode-1"]  # in recorded order across episodes


# ------------------------------------------------------------------ failures as recorded


async def test_a_page_by_another_name_is_refused_as_by_serve(recording):
    """DNS rebinding: a page whose name points at 127.0.0.1 must not read recorded replies."""
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            status, got, _ = await _ask(s, running.url + PROTOCOLS[0][1], PROTOCOLS[0][2], {"Host": "evil.example"})
        assert status == 403 and b"evil.example" in got and running.stats.played == 0


async def test_a_recorded_refusal_is_the_same_status_and_body(recording):
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            status, got, _ = await _ask(s, running.url + "/v1/chat/completions", _chat("refused", False))
        assert (status, got) == recording.sent["refusal"] and status == 400


async def test_a_recorded_mid_stream_close_closes_mid_stream(recording):
    status, sent = recording.sent["cut"]
    assert sent and b"[DONE]" not in sent
    got = b""
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            async with s.post(running.url + "/v1/chat/completions", json=_chat("cut", True)) as r:
                assert r.status == status
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for piece in r.content.iter_any():
                        got += piece
        assert got == sent


# ------------------------------------------------------------------ pace


async def test_recorded_pace_sends_the_stream_in_pieces_with_the_recorded_gaps(recording):
    [paced] = [x for x in load_fixture(recording.data, RUN).exchanges if b'"paced"' in x.request_body]
    assert len(paced.pieces) > 3 and paced.pieces[-1][0] == len(paced.body)
    gaps = paced.pieces[-1][1] - paced.pieces[0][1]
    assert gaps >= 0.05 * 1000 * (len(paced.pieces) - 2)  # the stall between events is in the marks
    pieces = []
    async with playing(recording, pace="recorded") as running:
        async with aiohttp.ClientSession() as s:
            t0 = time.perf_counter()
            async with s.post(running.url + "/v1/chat/completions", json=_chat("paced", True)) as r:
                async for piece in r.content.iter_any():
                    pieces.append(piece)
            took = (time.perf_counter() - t0) * 1000
        assert b"".join(pieces) == recording.sent["paced"][1]
        assert len(pieces) > 1 and took >= gaps * 0.9


def test_piece_marks_stay_bounded_and_exact_at_the_end():
    times = PieceTimes(time.perf_counter())
    for _ in range(10_000):
        times.add(7)
    marks = times.final()
    assert len(marks) <= MAX_MARKS and marks[-1][0] == 70_000
    assert [m[0] for m in marks] == sorted(m[0] for m in marks)
    one = PieceTimes(time.perf_counter())
    one.add(100)
    assert one.final() is None  # a body in one piece keeps no marks


# ------------------------------------------------------------------ misses


async def test_a_miss_fails_naming_the_closest_request_and_the_first_difference(recording):
    async with playing(recording) as running:
        async with aiohttp.ClientSession() as s:
            status, got, headers = await _ask(
                s, running.url + "/v1/chat/completions", _chat("Weather in Pariss?", False)
            )
            never = await _ask(s, running.url + "/v1/embeddings", {"input": "x"})
            messages = await _ask(s, running.url + "/v1/messages", {**PROTOCOLS[4][2], "max_tokens": 1})
            ollama = await _ask(s, running.url + "/api/chat", {**OLLAMA[0][2], "model": "other"})
        [closest] = [
            x
            for x in load_fixture(recording.data, RUN).exchanges
            if x.request_body and json.loads(x.request_body) == PROTOCOLS[0][2]
        ]
        message = json.loads(got)["error"]["message"]
        assert status == 404 and headers["X-Toolproxy-Playback"] == "miss"
        assert closest.id in message
        assert 'messages[0].content: recorded "Weather in Paris?", here "Weather in Pariss?"' in message
        assert never[0] == 404 and "POST /v1/embeddings was never recorded" in json.loads(never[1])["error"]["message"]
        # each protocol's clients get the error in the shape they read, as from serve
        assert (
            json.loads(messages[1])["type"] == "error" and "closest is" in json.loads(messages[1])["error"]["message"]
        )
        assert "max_tokens: recorded 64, here 1" in json.loads(messages[1])["error"]["message"]
        assert 'model: recorded "qwen3:8b", here "other"' in json.loads(ollama[1])["error"]
        assert running.stats.missed == 4


async def test_a_miss_is_forwarded_to_the_upstream_and_not_recorded(recording):
    before = len(read_records(recording.data, "exchange"))
    async with fakes.run_fake("llamacpp") as fake:
        fake.enqueue(fakes.text("live answer"))
        async with playing(recording, on_miss="forward", upstream=fake.url) as running:
            async with aiohttp.ClientSession() as s:
                status, got, _ = await _ask(
                    s,
                    running.url + "/t/episode=9/v1/chat/completions",
                    _chat("new", False),
                    {"X-Toolproxy-Run": "other"},
                )
                hit = await _ask(s, running.url + "/v1/chat/completions", PROTOCOLS[0][2])
        assert (status, got) == (200, fake.seen[-1].sent) and b"live answer" in got
        assert fake.seen[-1].path == "/v1/chat/completions" and "X-Toolproxy-Run" not in fake.seen[-1].headers
        assert hit[:2] == recording.sent["chat"] and len(fake.seen) == 1
    assert len(read_records(recording.data, "exchange")) == before


class PlaybackProcess:
    """`toolproxy playback` as a child process; its address read from the line it prints."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolproxy.cli", "playback", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.start_line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+?);", line)
        if m is None:
            self.proc.kill()
            raise RuntimeError(f"playback did not start: {line}{self.proc.stderr.read()}")
        self.url = m.group(1)

    def stop(self) -> tuple[int, str]:
        self.proc.terminate()
        out, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, err


def test_a_miss_in_record_mode_joins_the_run_and_plays_back_next_time(recording, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(recording.data, data)
    with fakes.FakeStack("llamacpp").in_thread() as url:
        pb = PlaybackProcess("--from", RUN, "--data", str(data), "--on-miss", "record", "--upstream", url)
        try:
            status, first = _post(pb.url + "/t/item=q9/v1/chat/completions", _chat("never asked", False))
        finally:
            code, err = pb.stop()
    assert status == 200 and code == 0, err
    assert "played 0 of" in err and "1 misses (1 relayed upstream)" in err
    [new] = [r for r in read_records(data, "exchange") if "never asked" in (r["request_body"] or "")]
    assert new["run"] == RUN and new["item"] == "q9"
    pb = PlaybackProcess("--from", RUN, "--data", str(data))  # no upstream now: the fixture has grown
    try:
        assert _post(pb.url + "/v1/chat/completions", _chat("never asked", False)) == (200, first)
    finally:
        pb.stop()


def test_the_command_prints_each_miss_and_refuses_bad_options_clearly(recording):
    pb = PlaybackProcess("--from", RUN, "--data", str(recording.data))
    try:
        status, _ = _post(pb.url + "/v1/chat/completions", _chat("\x1b[31mred", False))
    finally:
        code, err = pb.stop()
    assert status == 404 and code == 0
    assert "no recorded exchange matches" in err and "\x1b" not in err
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "playback",
            "--from",
            RUN,
            "--data",
            str(recording.data),
            "--match",
            "ignore",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "playback", "--from", "nope", "--data", str(recording.data)],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 1 and f"runs there: {RUN}" in unknown.stderr and "Traceback" not in unknown.stderr
    public = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "playback",
            "--from",
            RUN,
            "--data",
            str(recording.data),
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
    )
    assert public.returncode == 2 and "loopback address only" in public.stderr
    forward = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "playback",
            "--from",
            RUN,
            "--data",
            str(recording.data),
            "--on-miss",
            "forward",
        ],
        capture_output=True,
        text=True,
    )
    assert forward.returncode == 2 and "needs --upstream" in forward.stderr


# ------------------------------------------------------------------ the SDKs, no model server


SDK_AGENT = """
import json, os, sys
import anthropic
from openai import OpenAI

client = OpenAI(max_retries=0)
tools = %(tools)s
out = []
for stream in (False, True):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for _ in range(3):
        if stream:
            calls, text = {}, ""
            for ev in client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True):
                d = ev.choices[0].delta if ev.choices else None
                text += (d.content or "") if d else ""
                for c in (d.tool_calls or []) if d else []:
                    slot = calls.setdefault(c.index, {"id": c.id, "name": c.function.name, "arguments": ""})
                    slot["arguments"] += c.function.arguments or ""
            calls = list(calls.values())
        else:
            msg = client.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
            text = msg.content or ""
            calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in msg.tool_calls or []]
        out.append({"text": text, "calls": [(c["name"], c["arguments"]) for c in calls]})
        if not calls:
            break
        messages.append({"role": "assistant", "content": text, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21C"} for c in calls]
claude = anthropic.Anthropic(max_retries=0)
reply = claude.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "Oslo?"}],
                               tools=%(anthropic_tools)s)
out.append([b.type for b in reply.content])
with claude.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "Lima?"}]) as s:
    out.append(s.get_final_text())
json.dump(out, sys.stdout)
"""


def _responder(req):
    """A call for the city until a tool result is in the history, then an answer."""
    if any(m.get("role") == "tool" for m in req.messages):
        return fakes.text("It is sunny, 21C.")
    return fakes.call("get_weather", {"city": "Paris"})


def test_the_openai_and_anthropic_sdks_run_against_a_playback_with_no_model_server(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(SDK_AGENT % {"tools": repr(TOOLS), "anthropic_tools": repr(ANTHROPIC_TOOLS)})
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}

    def agent_against(url: str) -> list:
        done = subprocess.run(
            [sys.executable, str(agent)],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **env,
                "OPENAI_BASE_URL": url + "/v1",
                "OPENAI_API_KEY": "sk-test",
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": "sk-ant-test",
            },
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    fake = fakes.FakeStack("llamacpp", responder=_responder)
    with fake.in_thread():
        p = ProxyProcess(fake.url, data, ("--durability", "sync", "--no-fingerprint", "--quiet", "--run", RUN))
        try:
            recorded = agent_against(p.url)
        finally:
            assert p.stop() == 0
    assert recorded[0]["calls"] == [["get_weather", '{"city":"Paris"}']] and recorded[1]["text"]
    assert recorded[2]["calls"] and recorded[-2] == ["tool_use"] and recorded[-1]
    pb = PlaybackProcess("--from", RUN, "--data", str(data))  # the fake is gone: only the recording answers
    try:
        assert agent_against(pb.url) == recorded
    finally:
        code, err = pb.stop()
    assert code == 0 and "0 misses" in err


# ------------------------------------------------------------------ matching rules


def test_matching_rules_drop_mask_keep_and_refuse_what_they_cannot_use():
    body = json.dumps(
        {
            "model": "m",
            "user": "u1",
            "temperature": 0.2,
            "messages": [
                {"role": "system", "content": "Today is 2026-12-02 16:05."},
                {"role": "user", "content": "hi", "name": "ann"},
            ],
        }
    ).encode()
    assert normalise(body, parse_rules([])) == {k: v for k, v in json.loads(body).items() if k != "user"}
    rules = parse_rules(
        ["ignore=temperature", "ignore=messages.*.name", "mask=\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d", "keep=user"]
    )
    assert normalise(body, rules) == {
        "model": "m",
        "user": "u1",
        "messages": [{"role": "system", "content": "Today is <masked>."}, {"role": "user", "content": "hi"}],
    }
    assert normalise(b"\xff\xfe", rules) == "fffe" and normalise(b"not json", rules) == "not json"
    for bad in ("ignore", "mask=(", "body=maybe", "colour=red"):
        with pytest.raises(MatchError):
            parse_rules([bad])
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "a[1].b: recorded 2, here 3"
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == "a: recorded 1 items, here 2"
    assert first_difference({"a": 1}, {"a": 1.0}) == "a: recorded 1, here 1.0"


def test_a_body_that_is_not_json_matches_by_its_bytes_and_body_off_by_path_alone(recording):
    exchanges = load_fixture(recording.data, RUN).exchanges
    by_path = Matcher(exchanges, parse_rules(["body=off"]))
    first = by_path.take("POST", "/api/generate", "", b"\x00garbage", None)
    assert not isinstance(first, Miss) and first.path == "/api/generate"
    strict = Matcher(exchanges, parse_rules([]))
    assert isinstance(strict.take("POST", "/api/generate", "", b"\x00garbage", None), Miss)
    deep = b'{"messages": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}"
    nested = Matcher([replace(exchanges[0], request_body=deep)], parse_rules([]))
    miss = nested.take(exchanges[0].method, exchanges[0].path, "", deep.replace(b"1", b"2"), None)
    assert isinstance(miss, Miss) and "nested too deep to say where" in miss.message()  # never a RecursionError
    assert normalise(deep, parse_rules(["mask=x"]))
    again = Matcher(exchanges, parse_rules(["reuse=on"]))
    body = json.dumps(REPEATED).encode()
    replies = [again.take("POST", "/v1/chat/completions", "", body, None) for _ in range(4)]
    assert [b"second joke" in x.body for x in replies] == [False, True, True, True]


# ------------------------------------------------------------------ run --playback

TAGGED_AGENT = """
import os
from openai import OpenAI

tools = %(tools)s
for i, city in enumerate(("Paris", "Lima")):
    client = OpenAI(base_url=os.environ["TOOLPROXY_BASE_URL"] + f"/episode={i}/item=q{i}/v1", max_retries=0)
    messages = [{"role": "user", "content": f"Weather in {city}?"}]
    for _ in range(3):
        msg = client.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            print(msg.content)
            break
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "sunny, 21C"} for c in msg.tool_calls]
"""


def test_run_playback_is_an_offline_agent_test_recorded_as_a_run_of_its_own(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(TAGGED_AGENT % {"tools": repr(TOOLS)})
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "TOOLPROXY_"))}

    def toolproxy(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "toolproxy.cli", *args], capture_output=True, text=True, timeout=120, env=env
        )

    with fakes.FakeStack("llamacpp", responder=_responder).in_thread() as url:
        first = toolproxy(
            "run",
            "--upstream",
            url,
            "--data",
            str(data),
            "--run",
            RUN,
            "--no-fingerprint",
            "--no-analyze",
            "--",
            sys.executable,
            str(agent),
        )
    assert first.returncode == 0, first.stderr
    again = toolproxy("run", "--playback", RUN, "--data", str(data), "--", sys.executable, str(agent))
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout == "It is sunny, 21C.\nIt is sunny, 21C.\n"
    assert f"playback of {RUN}: played 4 of 4 recorded exchanges, 0 misses" in again.stderr
    assert f"toolproxy compare {RUN} {RUN}@playback --data {data}" in again.stderr
    shown = [line.split() for line in again.stderr.splitlines() if line.startswith("all ")]
    assert shown and shown[0][1:6] == ["2", "2", "0", "0", "0"]  # run printed the comparison itself
    original = [r for r in read_records(data, "exchange") if r["run"] == RUN]
    replayed = [r for r in read_records(data, "exchange") if r["run"] == f"{RUN}@playback"]
    assert [(r["item"], r["request_body"], r["response_body"]) for r in replayed] == [
        (r["item"], r["request_body"], r["response_body"]) for r in original
    ]
    compared = toolproxy("compare", RUN, f"{RUN}@playback", "--data", str(data))
    assert compared.returncode == 0, compared.stderr
    row = [line.split() for line in compared.stdout.splitlines() if line.startswith("all")][0]
    assert row[1:6] == ["2", "2", "0", "0", "0"]  # both items paired, the same outcome

    miss = toolproxy(
        "run",
        "--playback",
        RUN,
        "--data",
        str(data),
        "--run",
        "changed",
        "--",
        sys.executable,
        "-c",
        "import os, urllib.request as u; u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + "
        "'/chat/completions', data=b'{\"model\": \"other\"}', headers={'Content-Type': 'application/json'}))",
    )
    assert miss.returncode == 1 and "no recorded exchange matches this request" in miss.stderr
    assert 'model: recorded "m", here "other"' in miss.stderr
    neither = toolproxy("run", "--data", str(data), "--", sys.executable, "-c", "pass")
    assert neither.returncode == 2 and "give --upstream URL (the model server), or --playback RUN" in neither.stderr


# ------------------------------------------------------------------ held to serve's standard


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/_toolproxy/playback", timeout=10) as r:
        return json.loads(r.read())


async def _raw(url: str, data: bytes) -> bytes:
    """What the server answers to these bytes, on a connection of their own, until it closes it."""
    from yarl import URL

    u = URL(url)
    reader, writer = await asyncio.open_connection(u.host, u.port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_a_request_the_parser_rejects_is_one_redacted_line_as_under_serve(recording):
    """aiohttp refuses a control byte in a header or in the query before any handler runs; its
    message quotes the raw line, key included. playback logged it with a traceback."""
    pb = PlaybackProcess("--from", RUN, "--data", str(recording.data))
    try:
        header = await _raw(
            pb.url,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Bearer sk-SECRET-HEADER-1\x01x\r\nContent-Length: 2\r\n\r\n{}",
        )
        query = await _raw(pb.url, b"GET /v1/models?api_key=sk-SECRET-QUERY-2\x01x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        stats = _stats(pb.url)
    finally:
        code, err = pb.stop()
    assert header.startswith(b"HTTP/1.") and b" 400 " in header.split(b"\r\n")[0] and b"SECRET" not in header
    assert query.startswith(b"HTTP/1.") and b" 400 " in query.split(b"\r\n")[0] and b"SECRET" not in query
    assert code == 0 and "Traceback" not in err and "Error handling request" not in err
    assert "SECRET" not in err and "\x01" not in err
    refused = [line for line in err.splitlines() if "refused a malformed request" in line]
    assert len(refused) == 2 and "Authorization: redacted:" in refused[0] and "api_key=redacted:" in refused[1]
    assert stats["refused"] == {"parser_rejected": 2}


class Bystander:
    """A server that answers every request (whatever its target) 200, and keeps each one's line."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.runner: web.ServerRunner | None = None

    async def start(self, port: int) -> None:
        async def answer(request: web.BaseRequest) -> web.Response:
            self.seen.append(f"{request.method} {request.raw_path}")
            return web.Response(text="the bystander answered")

        self.runner = web.ServerRunner(web.Server(answer))
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, "127.0.0.1", port).start()
        except OSError:
            await self.runner.cleanup()
            raise

    async def stop(self) -> None:
        await self.runner.cleanup()


async def _neighbours() -> tuple[fakes.FakeStack, Bystander]:
    """An upstream on port U and another server on port U*10+2: what `CONNECT 2` appended to the
    upstream's URL named (the request line that reached a second server in the issue)."""
    import random

    for _ in range(200):
        port = random.randint(1024, 6553)
        upstream, other = fakes.FakeStack("llamacpp"), Bystander()
        try:
            await upstream.start("127.0.0.1", port)
        except OSError:
            continue
        try:
            await other.start(port * 10 + 2)
        except OSError:
            await upstream.stop()
            continue
        return upstream, other
    pytest.skip("no free pair of ports U, U*10+2 on 127.0.0.1")


async def test_a_target_that_is_not_a_path_is_refused_as_serve_refuses_it(recording, tmp_path):
    """`CONNECT 2` joined to the upstream's URL (`http://127.0.0.1:U` + `2`) named another
    server; `CONNECT host:port` another host. serve and playback refuse both, the same way."""
    upstream, other = await _neighbours()
    try:
        port = int(upstream.url.rsplit(":", 1)[1])
        pb = PlaybackProcess(
            "--from", RUN, "--data", str(recording.data), "--on-miss", "forward", "--upstream", upstream.url
        )
        serve = ProxyProcess(upstream.url, tmp_path / "serve", ("--quiet", "--no-fingerprint"))
        answers = {}
        try:
            for url in (pb.url, serve.url):
                for target in (b"2", f"127.0.0.1:{port * 10 + 2}".encode(), b"*"):
                    method = b"OPTIONS" if target == b"*" else b"CONNECT"
                    answers[url, target] = await _raw(
                        url,
                        method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\n"
                        b"Content-Length: 0\r\nConnection: close\r\n\r\n",
                    )
            stats = _stats(pb.url)
        finally:
            pb.stop()
            serve.stop()
    finally:
        await upstream.stop()
        await other.stop()
    assert other.seen == [] and upstream.seen == []
    for (url, target), answer in answers.items():
        assert answer.startswith(b"HTTP/1.1 400") and b'"code":"not_a_forward_proxy"' in answer, (url, target, answer)
    assert stats["refused"] == {"not_a_forward_proxy": 3} and stats["relayed"] == 0


def _hostile_recording(recording: Recording, data: Path) -> dict[str, str]:
    """The module's recording, plus a segment of lines made from its exchanges: ones analyze
    sets aside, and ones playback cannot send as recorded. {case: the chat message it is asked by}."""
    import shutil

    shutil.copytree(recording.data, data)
    plain = next(
        r for r in read_records(data, "exchange") if json.loads(r["request_body"] or "null") == PROTOCOLS[0][2]
    )
    cases = {
        "bad-body": {"request_body": 12345},  # analyze: bad_type
        "bad-status": {"status": True},  # analyze: bad_type
        "headers-dict": {"response_headers": {"Content-Type": "application/json"}},
        "crlf": {"response_headers": [["Content-Type", "application/json"], ["X-Evil", "a\r\nSet-Cookie: x=1"]]},
        "status-0": {"status": 0},
        "status-negative": {"status": -5},
        "marks": {"extra": {"piece_ms": [["a", 1], [5]]}},
        "extra-list": {"extra": [1, 2]},  # kept as JSON by analyze, and nothing playback sends
        "slow": {"ttfb_ms": 1e12, "duration_ms": 5.0},  # --pace recorded waits at most the recorded duration
    }
    lines = [b"{not json"]
    for n, (case, change) in enumerate(cases.items()):
        rec = {**plain, "id": f"{n + 1:032x}", "request_body": json.dumps(_chat(case, False)), **change}
        lines.append(json.dumps(rec).encode())
    (data / "segments" / "29990101T000000-1-0001-hostile.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return {case: case for case in cases}


async def test_lines_analyze_sets_aside_or_playback_cannot_send_are_set_aside_and_counted(recording, tmp_path):
    """One bad line stopped playback at start with a traceback; a recorded header with CR LF was a
    500, a status 0 went out as `HTTP/1.1 0`, bad piece marks a traceback, a ttfb of 1e12 ms no answer."""
    data = tmp_path / "data"
    cases = _hostile_recording(recording, data)
    pb = PlaybackProcess("--from", RUN, "--data", str(data), "--pace", "recorded")
    got = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            for case in cases:
                got[case] = await _ask(s, pb.url + "/v1/chat/completions", _chat(case, False))
            hit = await _ask(s, pb.url + PROTOCOLS[0][1], PROTOCOLS[0][2])
        stats = _stats(pb.url)
    finally:
        code, err = pb.stop()
    start = pb.start_line
    assert "set aside 8 lines (bad_type 2, corrupt 1, unplayable 5), listed on stderr" in start, start
    assert code == 0 and "Traceback" not in err and "\r" not in err, err
    for case in ("bad-body", "bad-status", "headers-dict", "crlf", "status-0", "status-negative", "marks"):
        status, _, headers = got[case]
        assert status == 404 and headers["X-Toolproxy-Playback"] == "miss", case  # never served
    for case in ("extra-list", "slow"):
        status, body, headers = got[case]
        assert (status, body) == recording.sent["chat"] and headers["X-Toolproxy-Playback"] != "miss", case
    assert hit[:2] == recording.sent["chat"]
    assert stats["set_aside"] == {"bad_type": 2, "corrupt": 1, "unplayable": 5}
    assert "29990101T000000-1-0001-hostile.jsonl @0: corrupt" in err
    assert '"request_body" is 12345 (a number), which does not fit a string; set aside' in err
    assert "status 0 is not the status of an HTTP reply (200-599); not played" in err
    assert "its response header 'X-Evil' is not one HTTP can carry" in err
    assert "set aside 8 lines (bad_type 2, corrupt 1, unplayable 5)" in err.splitlines()[-1]


async def test_record_mode_records_what_serve_records_and_keeps_every_tag(recording, tmp_path):
    """--on-miss record: a body over the limit was answered 413 by playback itself and neither
    recorded nor counted; a tag whose key starts with a digit, re-encoded into a path prefix, cut
    the prefix short and sent `/0=v/episode=7/v1/chat/completions` upstream."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(recording.data, data)
    fake = fakes.FakeStack("llamacpp")
    with fake.in_thread() as url:
        pb = PlaybackProcess("--from", RUN, "--data", str(data), "--on-miss", "record", "--upstream", url)
        big = b'{"messages": "' + b"x" * (65 << 20) + b'"}'

        async def chunked():
            for start in range(0, len(big), 1 << 20):
                yield big[start : start + (1 << 20)]

        try:
            async with aiohttp.ClientSession() as s:
                tagged = await _ask(
                    s,
                    pb.url + "/v1/chat/completions",
                    _chat("a new question", False),
                    {"X-Toolproxy-Tag-0": "v", "X-Toolproxy-Episode": "7", "X-Toolproxy-Run": "not-this"},
                )
                async with s.post(pb.url + "/v1/chat/completions", data=big) as r:
                    declared = r.status, await r.read()
                async with s.post(pb.url + "/t/item=q9/v1/chat/completions", data=chunked()) as r:
                    streamed = r.status, await r.read()
                misplaced = await _ask(s, pb.url + "/v1/t/item=q8/completion", {"prompt": "x"})
            stats = _stats(pb.url)
        finally:
            code, err = pb.stop()
    assert code == 0 and "Traceback" not in err, err
    assert tagged[0] == 200 and [s.path for s in fake.seen] == ["/v1/chat/completions"]
    assert not any(k.lower().startswith("x-toolproxy-") for k, _ in fake.seen[0].header_list)
    assert declared[0] == streamed[0] == 413 and b"request_too_large" in declared[1] + streamed[1]
    assert stats["refused"] == {"body_too_large": 2} and stats["missed"] == 1
    # recorded by serve's code, as serve records it, naming the address the client used
    assert (
        misplaced[0] == 404
        and f"use the base URL {pb.url}/t/item=q8/v1" in json.loads(misplaced[1])["error"]["message"]
    )
    assert [
        r["error_kind"] for r in read_records(data, "exchange") if r["client_path"] == "/v1/t/item=q8/completion"
    ] == ["misplaced_tags"]
    new = [
        r
        for r in read_records(data, "exchange")
        if r["id"] not in {x.id for x in load_fixture(recording.data, RUN).exchanges}
    ]
    [asked] = [r for r in new if r["error_kind"] is None]
    assert (asked["run"], asked["episode"], asked["tags"], asked["path"]) == (
        RUN,
        "7",
        {"0": "v"},
        "/v1/chat/completions",
    )
    too_large = sorted((r for r in new if r["error_kind"] == "body_too_large"), key=lambda r: r["item"] or "")
    assert [(r["run"], r["item"], r["client_status"]) for r in too_large] == [(RUN, None, 413), (RUN, "q9", 413)]
    assert too_large[0]["request_body_size"] == len(big)  # declared, as serve records it


async def test_a_client_trickling_its_headers_or_its_body_is_cut_off(recording, monkeypatch):
    """serve's timeouts for a request's head and for a pause in its body, shortened here."""
    from yarl import URL

    from toolproxy.playback import server as playback_server

    monkeypatch.setattr(playback_server, "CLIENT_HEADER_TIMEOUT", 0.5)
    monkeypatch.setattr(playback_server, "CLIENT_BODY_TIMEOUT", 0.5)
    async with playing(recording) as running:
        u = URL(running.url)
        reader, writer = await asyncio.open_connection(u.host, u.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
        sent = 0
        try:
            while not reader.at_eof() and sent < 300:  # a header byte every 0.1 s: 30 s if never cut off
                writer.write(b"X")
                await writer.drain()
                sent += 1
                try:
                    await asyncio.wait_for(reader.read(), 0.1)
                except TimeoutError:
                    pass
        except ConnectionError:
            pass
        finally:
            writer.close()
        assert sent < 300  # the connection was closed before the head was done
        answer = await _raw(
            running.url, b'POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{"a"'
        )
        assert answer.startswith(b"HTTP/1.1 408") and b"too slowly" in answer
        assert running.stats.refused == {"client_timeout": 1}


def _paced(ttfb, duration, pieces, body=b"x" * 30):
    from toolproxy.playback.fixture import RecordedExchange

    return RecordedExchange(
        id="i",
        order=0,
        method="POST",
        path="/",
        query="",
        episode=None,
        item=None,
        tags={},
        request_body=b"",
        status=200,
        headers=[],
        body=body,
        cut=False,
        ttfb_ms=ttfb,
        duration_ms=duration,
        pieces=pieces,
    )


@pytest.mark.parametrize(
    "ttfb,duration,pieces,expected",
    [
        (
            100.0,
            400.0,
            [(10, 150.0), (20, 250.0), (30, 400.0)],
            (0.1, [(10, 0.15), (20, 0.25), (30, 0.4)]),
        ),  # as recorded
        (None, None, [(10, 50.0)], (0.0, [(10, 0.05)])),
        (1e12, 5.0, [], (0.005, [])),  # never later than the recorded duration
        (1e12, None, [], (600.0, [])),  # nor than serve's --ttfb-timeout
        (1.0, 1e15, [(10, 2.0), (20, 1e12), (30, 1e12 + 1)], (0.001, [(10, 0.002), (20, 300.002), (30, 300.003)])),
        (
            -5.0,
            10.0,
            [(10, 8.0), (20, 3.0), (99, 9.0)],
            (0.0, [(10, 0.008), (20, 0.008), (30, 0.009)]),
        ),  # back in time: no wait
    ],
)
def test_recorded_pace_plays_the_recorded_waits_within_serves_bounds(ttfb, duration, pieces, expected):
    from toolproxy.playback.server import schedule

    first, got = schedule(_paced(ttfb, duration, pieces))
    assert first == pytest.approx(expected[0])
    assert [end for end, _ in got] == [end for end, _ in expected[1]]
    assert [at for _, at in got] == pytest.approx([at for _, at in expected[1]])
