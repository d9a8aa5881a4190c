"""`toolproxy replay`: a recorded run's turns sent again through a condition, against real servers.

The recording is made by a real harness (the openai SDK) through `toolproxy run`; the replays
run the CLI as a subprocess against fake upstreams that answer as the real stacks do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from proxyprocess import together
from test_study import _responder  # a call for the city asked about, then an answer once the tool replied

from toolproxy import emulators as fakes
from toolproxy.drive.replay import RecordedTurn, _unbalanced, build_request, retry_delay, strip_redacted_query
from toolproxy.record.segments import read_records

# Four tasks, the last one streamed; the harness acts only on structured tool_calls.
HARNESS = textwrap.dedent("""
    import os
    from openai import OpenAI
    client = OpenAI()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}]
    for city in ("Paris", "Lima", "Oslo", "Quito"):
        messages = [{"role": "user", "content": f"Weather in {city}?"}]
        stream = city == "Quito"
        for _ in range(3):
            kw = dict(model=os.environ["MODEL"], messages=messages, tools=tools)
            if stream:
                calls, text = [], ""
                for ev in client.chat.completions.create(stream=True, **kw):
                    d = ev.choices[0].delta if ev.choices else None
                    text += (d.content or "") if d else ""
                    calls += (d.tool_calls or []) if d else []
                if not calls:
                    break
                messages.append({"role": "assistant", "content": text, "tool_calls": [
                    {"id": calls[0].id, "type": "function", "function": {"name": calls[0].function.name,
                     "arguments": "".join(c.function.arguments or "" for c in calls)}}]})
                messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21C"})
                continue
            msg = client.chat.completions.create(**kw).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id, "content": "sunny, 21C"})
""")


def _toolproxy(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args],
        text=True,
        capture_output=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A native recording on a parser-less SGLang fake: every call stays in the reply's text.

    The harness sends a real key; the recording must hold only its redacted form.
    """
    fake = fakes.FakeStack("sglang", responder=_responder)
    with fake.in_thread():
        root = tmp_path_factory.mktemp("replay")
        harness = root / "agent.py"
        harness.write_text(HARNESS)
        data = root / "data"
        done = _toolproxy(
            "run",
            "--upstream",
            fake.url,
            "--data",
            str(data),
            "--run",
            "orig",
            "--no-fingerprint",
            "--",
            sys.executable,
            str(harness),
            env=_clean_env(MODEL=fake.model, OPENAI_API_KEY="sk-harness-secret"),
        )
        assert done.returncode == 0, done.stderr
        assert "4 turns" in done.stderr
        yield fake, data, root


def _copy(data, root, name):
    import shutil

    dest = root / name
    shutil.copytree(data, dest)
    return dest


@pytest.fixture(scope="module")
def analyzed(recorded):
    """The recording analysed once, by the CLI. A replay analyses its data dir first: tests that
    copy this one skip re-deriving the same turns (test_text_replay replays a fresh recording)."""
    _, data, root = recorded
    dest = _copy(data, root, "analyzed")
    done = _toolproxy("analyze", "--data", str(dest))
    assert done.returncode == 0, done.stderr
    return dest


def _replay(data, upstream, *args, env=None):
    return _toolproxy(
        "replay",
        "--from",
        "orig",
        "--data",
        str(data),
        "--upstream",
        upstream,
        "--no-fingerprint",
        *args,
        env=env or _clean_env(),
    )


def _flat(text: str) -> str:
    """Output with its line wrapping undone."""
    return " ".join(text.split())


def _exchanges(data, run):
    return [r for r in read_records(data) if r.get("kind", "exchange") == "exchange" and r["run"] == run]


def test_text_replay_delivers_the_calls_native_left_in_text(recorded, fake_stack):
    _, data, root = recorded
    data = _copy(data, root, "text")
    fake = fake_stack("sglang", responder=_responder)
    done = _replay(data, fake.url, "--condition", "text", env=_clean_env(UP_KEY="sk-upstream"))
    assert done.returncode == 0, done.stderr
    assert "4 turns selected, 0 already replayed, 4 to send" in done.stderr
    assert "open-loop" in done.stderr and "open-loop" in _flat(done.stdout)
    # every original turn had its call left in text (delivered 0 of 4); under text all 4 are delivered
    assert "paired turns: 4" in _flat(done.stdout)
    row = [line.split() for line in done.stdout.splitlines() if line.startswith("all")][0]
    assert row[1:6] == ["4", "0", "0", "4", "0"]  # paired, both pass, A only, B only, both fail
    assert "0.1250" in _flat(done.stdout)  # exact McNemar, 0 vs 4 discordant turns

    orig = {r["id"]: r for r in _exchanges(data, "orig")}
    new = _exchanges(data, "orig@replay-text")
    assert len(new) == 4 and all(r["condition"] == "text" and r["status"] == 200 for r in new)
    assert {r["tags"]["replay_of_run"] for r in new} == {"orig"}
    assert sorted(r["tags"]["replay_of_turn_index"] for r in new) == ["0", "0", "0", "0"]
    assert len({r["item"] for r in new}) == 4 and all(r["episode"] == "replay-" + r["item"] for r in new)
    # the request went out as the harness sent it: same body bytes, the stream as a stream
    assert sorted(r["request_body"] for r in new) == sorted(r["request_body"] for r in orig.values())
    streamed = [r for r in new if b'"stream":true' in r["request_body"].encode()]
    assert (
        len(streamed) == 1
        and "text/event-stream" in dict((k.lower(), v) for k, v in streamed[0]["response_headers"])["content-type"]
    )
    compared, md, rep = together(  # read-only commands: side by side
        lambda: _toolproxy("compare", "orig", "orig@replay-text", "--data", str(data), "--format", "json").stdout,
        lambda: _toolproxy("report", "--data", str(data), "--run", "orig@replay-text", "--format", "markdown").stdout,
        lambda: _toolproxy("report", "--data", str(data), "--format", "json").stdout,
    )
    # the turn ids pair with compare's JSON view too
    js = json.loads(compared)
    assert js["replay"] is True and js["overall"]["b_only"] == 4
    # the replay run's own report says what it is
    assert "a replay of orig's turns, open-loop" in _flat(md)
    rep = json.loads(rep)
    assert {r["run"]: r["replay_of"] for r in rep["runs"]} == {"orig": None, "orig@replay-text": "orig"}


def test_secrets_are_never_replayed_and_the_key_comes_from_the_environment(recorded, analyzed, fake_stack):
    _, _, root = recorded
    recorded_auth = {
        dict((k.lower(), v) for k, v in r["request_headers"]).get("authorization") for r in _exchanges(analyzed, "orig")
    }
    assert all(a.startswith("redacted:") for a in recorded_auth)
    # Without and with a key, side by side: each replay on its own copy, to its own upstream.
    bare, keyed = fake_stack("sglang", responder=_responder), fake_stack("sglang", responder=_responder)
    nokey, withkey = together(
        lambda: _replay(_copy(analyzed, root, "nokey"), bare.url, "--run", "nokey", "--limit", "1"),
        lambda: _replay(
            _copy(analyzed, root, "withkey"),
            keyed.url,
            "--run",
            "withkey",
            "--limit",
            "1",
            "--upstream-key-env",
            "UP_KEY",
            env=_clean_env(UP_KEY="sk-upstream"),
        ),
    )
    assert nokey.returncode == 0, nokey.stderr
    assert [s.headers.get("Authorization") for s in bare.seen] == [None]
    assert withkey.returncode == 0, withkey.stderr
    assert [s.headers.get("Authorization") for s in keyed.seen] == ["Bearer sk-upstream"]
    assert not any("redacted" in v for s in bare.seen + keyed.seen for v in s.headers.values())


def test_a_refusing_stack_is_reported_as_non_responses_not_losses(recorded, analyzed, fake_stack):
    _, _, root = recorded
    data = _copy(analyzed, root, "refuse")
    fake = fake_stack("no_jinja", responder=_responder)  # llama.cpp --no-jinja: 500 on any tools request
    done = _replay(data, fake.url, "--run", "nojinja")
    assert done.returncode == 0, done.stderr
    assert "paired turns: 0" in _flat(done.stdout)
    assert "no response in B: refused 4" in _flat(done.stdout)
    report = json.loads(_toolproxy("report", "--data", str(data), "--run", "nojinja", "--format", "json").stdout)
    assert report["runs"][0]["outcomes"]["non_response"] == 4
    # a refusal is an answer: rerunning does not send the turns again
    again = _replay(data, fake.url, "--run", "nojinja")
    assert "4 already replayed, 0 to send" in again.stderr


def test_where_and_limit_select_turns_and_a_bad_predicate_is_a_clear_error(recorded, analyzed, fake_stack):
    _, _, root = recorded
    fake = fake_stack("sglang", responder=_responder)
    idle = fake_stack("sglang", responder=_responder)  # what must send nothing talks to this one
    bad = [
        ("outcom = 'x'", "outcom"),
        ("1=1) ; drop table turns; --", "one condition"),
        ("(((", "not valid SQL"),
        ("true) union select 1 from (select 1", "one condition"),
    ]
    # Every replay on its own copy of the recording, side by side (each analyses its data dir).
    dirs = [_copy(analyzed, root, f"where{i}") for i in range(len(bad) + 3)]
    done, none, unknown, *outs = together(
        lambda: _replay(
            dirs[0], fake.url, "--run", "w", "--where", "surface = 'text' and role = 'call'", "--limit", "2"
        ),
        lambda: _replay(dirs[1], idle.url, "--run", "w2", "--where", "outcome = 'non_response'"),
        lambda: _toolproxy("replay", "--from", "nope", "--data", str(dirs[2]), "--upstream", idle.url),
        *[
            lambda d=d, where=where: _replay(d, idle.url, "--run", "w3", "--where", where)
            for d, (where, _) in zip(dirs[3:], bad)
        ],
    )
    assert done.returncode == 0, done.stderr
    assert "2 turns selected" in done.stderr and len(fake.seen) == 2
    assert none.returncode == 0 and "0 turns selected" in none.stderr
    for (where, says), out in zip(bad, outs):
        assert out.returncode != 0 and "Traceback" not in out.stderr and says in out.stderr, (where, out.stderr)
    dropping = 3 + next(i for i, (where, _) in enumerate(bad) if "drop table" in where)
    assert _toolproxy("sql", "--data", str(dirs[dropping]), "select count(*) from turns").returncode == 0  # not dropped
    assert unknown.returncode != 0 and "'nope' has no turns" in unknown.stderr and "orig" in unknown.stderr
    assert idle.seen == []


def test_busy_upstream_is_retried_after_its_retry_after(recorded, analyzed, fake_stack):
    _, _, root = recorded
    data = _copy(analyzed, root, "busy")
    fake = fake_stack("sglang", responder=_responder)
    fake.inject(fakes.Fault(status=429, body=b'{"error":{"message":"rate limited"}}', headers=(("Retry-After", "1"),)))
    start = time.monotonic()
    done = _replay(data, fake.url, "--run", "busy", "--limit", "1")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start >= 1.0
    assert [s.path for s in fake.seen] == ["/v1/chat/completions"] * 2
    assert "1 busy retries" in done.stderr and "paired turns: 1" in _flat(done.stdout)


def test_interrupted_replay_resumes_where_it_stopped(recorded, analyzed, fake_stack):
    _, _, root = recorded
    data = _copy(analyzed, root, "resume")
    fake = fake_stack("sglang", responder=_responder)
    fake.inject(fakes.stall(before=30, times=None))
    cmd = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "replay",
        "--from",
        "orig",
        "--data",
        str(data),
        "--upstream",
        fake.url,
        "--no-fingerprint",
        "--run",
        "res",
        "--condition",
        "text",
    ]
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_clean_env())
    deadline = time.monotonic() + 60
    while not fake.seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.seen, "the replay never reached the upstream"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    cut = _exchanges(data, "res")
    assert len(cut) == 1 and cut[0]["error_kind"] is not None  # the cut turn is recorded, not lost
    fake.faults.clear()
    done = subprocess.run(cmd, text=True, capture_output=True, timeout=120, env=_clean_env())
    assert done.returncode == 0, done.stderr
    assert "4 turns selected, 0 already replayed, 4 to send" in done.stderr  # the cut turn had no answer
    assert "paired turns: 4" in _flat(done.stdout)
    again = subprocess.run(cmd, text=True, capture_output=True, timeout=120, env=_clean_env())
    assert "4 already replayed, 0 to send" in again.stderr and "paired turns: 4" in _flat(again.stdout)


TURN = RecordedTurn(
    turn_id="t1",
    run="orig",
    episode="e1",
    item="it1",
    turn_index=2,
    expect="none",
    method="POST",
    path="/v1/chat/completions",
    query="key=redacted:ab12cd34&x=1",
    headers=[
        ["Authorization", "redacted:0011aabb"],
        ["Content-Type", "application/json"],
        ["Content-Length", "12"],
        ["X-Toolproxy-Run", "orig"],
        ["Host", "h"],
        ["User-Agent", "sdk/1"],
    ],
    body=b'{"model":"a","messages":[]}',
    tags={"category": "simple", "expect": "call"},
)


def test_build_request_keeps_the_bytes_and_drops_secrets_and_tags():
    req = build_request(TURN, "new")
    assert req.body == TURN.body
    assert req.headers == [("Content-Type", "application/json"), ("User-Agent", "sdk/1")]
    assert req.target.startswith("/t/run=new/") and req.target.endswith("/v1/chat/completions?x=1")
    for part in (
        "episode=replay-t1",
        "item=t1",
        "replay_of_run=orig",
        "replay_of_episode=e1",
        "replay_of_item=it1",
        "replay_of_turn=t1",
        "replay_of_turn_index=2",
        "category=simple",
        "expect=none",
    ):
        assert f"/{part}/" in req.target, part
    assert json.loads(build_request(TURN, "new", model="b").body)["model"] == "b"
    odd = RecordedTurn(**{**TURN.__dict__, "body": b"\xff not json"})
    assert build_request(odd, "new", model="b").body == b"\xff not json"


@pytest.mark.parametrize(
    "query, kept",
    [
        ("", ""),
        ("a=1", "a=1"),
        ("key=redacted:00&a=1", "a=1"),
        ("api_key=redacted:00", ""),
    ],
)
def test_strip_redacted_query(query, kept):
    assert strip_redacted_query(query) == kept


@pytest.mark.parametrize(
    "value, attempt, wait",
    [
        ("3", 0, 3.0),
        ("0", 4, 0.0),
        ("9999", 0, 120.0),
        ("", 0, 1.0),
        ("", 3, 8.0),
        ("soon", 2, 4.0),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 0, 10.0),
    ],
)
def test_retry_delay(value, attempt, wait):
    now = 1445412480.0  # 07:28:00 that day
    assert retry_delay({"Retry-After": value} if value else {}, attempt, now=now) == wait


@pytest.mark.parametrize(
    "where, bad",
    [
        ("outcome = 'x'", False),
        ("(a) and (b)", False),
        ("x = ')'", False),
        ("a) or (b", True),
        ("((a)", True),
    ],
)
def test_unbalanced(where, bad):
    assert _unbalanced(where) is bad


def test_progress_line_on_a_terminal_only(recorded, analyzed, fake_stack):
    """Replay draws replayed/total, the rate and the time left on a terminal, and nothing in a pipe."""
    from ptyrun import REDRAW, on_a_terminal

    _, _, root = recorded
    fake = fake_stack("sglang", responder=_responder)
    cmd = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "replay",
        "--from",
        "orig",
        "--upstream",
        fake.url,
        "--no-fingerprint",
    ]
    tty_dir, piped_dir = _copy(analyzed, root, "tty"), _copy(analyzed, root, "piped")
    (rc, stdout, tty), piped = together(  # the terminal and the pipe side by side
        lambda: on_a_terminal([*cmd, "--data", str(tty_dir)], env=_clean_env()),
        lambda: _toolproxy(*cmd[3:], "--data", str(piped_dir), env=_clean_env()),
    )
    assert rc == 0, tty
    assert re.search(
        rb"\r\x1b\[2K  replayed 1/4 \(1 answered, 0 without answer, 0 busy retries\), [\d.]+ turns/min, "
        rb"about \S+ left",
        tty,
    ), tty
    assert REDRAW + b"  replayed 4/4" in tty and REDRAW not in stdout
    assert piped.returncode == 0 and "\r" not in piped.stderr and "\x1b" not in piped.stderr, piped.stderr
    # In a pipe only the summary: one line, once the replay is done.
    assert "replayed 1/4" not in piped.stderr and re.search(r"\nreplayed 4/4 .*, done in \S+\n", piped.stderr), (
        piped.stderr
    )


def test_a_recording_whose_segments_moved_away_is_reported_as_such_not_as_a_bad_where(recorded, analyzed, fake_stack):
    _, _, root = recorded
    data = _copy(analyzed, root, "moved")
    for segment in (data / "segments").iterdir():
        segment.rename(root / f"moved-{segment.name}")
    idle = fake_stack("sglang", responder=_responder)
    out = _replay(data, idle.url, "--run", "m", "--where", "true")
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "cannot read the bodies of an exchange" in out.stderr and "--where" not in out.stderr, out.stderr
    assert idle.seen == []


def test_with_stream_flips_only_the_stream_field():
    from toolproxy.drive.replay import ReplayRequest, with_stream

    chat = ReplayRequest(
        "POST",
        "/t/run=x/v1/chat/completions",
        [],
        b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}',
    )
    assert json.loads(with_stream(chat, False).body) == {"model": "m", "stream": False, "messages": []}
    assert with_stream(chat, True) is chat  # already streamed: the recorded bytes go out
    ollama = ReplayRequest("POST", "/api/chat?x=1", [], b'{"model":"m"}')  # Ollama streams by default
    assert with_stream(ollama, True) is ollama and json.loads(with_stream(ollama, False).body)["stream"] is False
    odd = ReplayRequest("POST", "/v1/chat/completions", [], b"\xffnot json")
    assert with_stream(odd, False) is odd and with_stream(ReplayRequest("POST", "/", [], b"[1]"), False).body == b"[1]"


def test_replay_stream_off_finds_the_calls_a_stack_loses_only_when_streaming(tmp_path):
    """A streamed run on a stack whose streaming path drops tool calls looks like a model that
    never calls; the same turns replayed with --stream off get their calls, and compare says so."""
    from proxyprocess import ProxyProcess

    fake = fakes.FakeStack(
        "vllm",
        tool_parser="hermes",
        responder=lambda req: fakes.call("get_weather", {"city": "Oslo"}, content="Let me check."),
    )
    fake.inject(fakes.drops_streamed_calls())
    data = tmp_path / "data"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    with fake.in_thread():
        p = ProxyProcess(fake.url, data, ("--durability", "sync", "--no-fingerprint", "--quiet"))
        try:
            for i in range(3):
                body = json.dumps(
                    {
                        "model": fake.model,
                        "stream": True,
                        "tools": tools,
                        "messages": [{"role": "user", "content": f"Weather in city {i}?"}],
                    }
                ).encode()
                req = urllib.request.Request(
                    f"{p.url}/t/run=orig/episode={i}/item=q{i}/expect=call/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=30) as r:
                    streamed = r.read()
                assert b"tool_calls" not in streamed and b'"finish_reason":"stop"' in streamed  # the call is lost
        finally:
            assert p.stop() == 0
        done = _replay(data, fake.url, "--stream", "off")
    assert done.returncode == 0, done.stderr
    assert "orig -> orig@replay-native-stream-off" in done.stderr
    new = _exchanges(data, "orig@replay-native-stream-off")
    assert len(new) == 3 and all(json.loads(r["request_body"])["stream"] is False for r in new)
    assert all(json.loads(r["response_body"])["choices"][0]["message"]["tool_calls"] for r in new)
    row = [line.split() for line in done.stdout.splitlines() if line.startswith("all")][0]
    assert row[1:6] == ["3", "0", "0", "3", "0"]  # every turn: a call only when not streamed
