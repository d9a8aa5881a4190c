"""--sample: the decision as tables, then a real proxy under an emulated agent loop of many
multi-turn episodes (tagged and untagged), analysed and reported by the CLI."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
import sys
from collections import Counter

import aiohttp
import pytest

from toolproxy.emulators import call, text
from toolproxy.record.model import Record, encode_body
from toolproxy.record.sampling import (
    BY_EPISODE,
    BY_NONE,
    BY_OPENING,
    SAMPLED_OUT,
    Sampler,
    episode_key,
    opening,
    parse_rate,
)
from toolproxy.record.segments import read_records

KEY = b"s" * 32
RATE = 0.5


@pytest.mark.parametrize(
    "value, rate", [("0.5", 0.5), ("1", 1.0), ("25%", 0.25), (" 0.1 ", 0.1), ("100%", 1.0), ("12.5%", 0.125)]
)
def test_rates(value, rate):
    assert parse_rate(value) == rate


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "above 0"),
        ("1.5", "at most 1"),
        ("-0.2", "above 0"),
        ("half", "is not a rate"),
        ("", "is not a rate"),
        ("150%", "at most 1"),
    ],
)
def test_not_rates(value, message):
    with pytest.raises(ValueError, match=message):
        parse_rate(value)


SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Find the weather in Paris."}
REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "18C"}


@pytest.mark.parametrize(
    "later",
    [
        [SYSTEM, USER, REPLY, RESULT],  # turn 2
        [
            SYSTEM,
            USER,
            REPLY,
            RESULT,
            {"role": "assistant", "content": "It is 18C."},
            {"role": "user", "content": "And Rome?"},
        ],
        # a harness resending its messages as content parts, with other whitespace
        [
            {"role": "system", "content": [{"type": "text", "text": "You are an agent. "}]},
            {"role": "user", "content": [{"type": "text", "text": "Find the weather in Paris."}]},
            REPLY,
            RESULT,
        ],
    ],
)
def test_every_turn_of_an_episode_has_the_first_requests_opening(later):
    assert (
        opening(later)
        == opening([SYSTEM, USER])
        == [["system", "You are an agent."], ["user", "Find the weather in Paris."]]
    )


def test_other_openings_differ():
    assert opening([SYSTEM, {"role": "user", "content": "Find the weather in Rome."}]) != opening([SYSTEM, USER])
    assert opening([USER]) != opening([SYSTEM, USER])


def _rec(path: str = "/v1/chat/completions", body: dict | None = None, **fields) -> Record:
    rec = Record(id="x", started_at=0.0, method=fields.pop("method", "POST"), path=path, **fields)
    if body is not None:
        rec.request_body, rec.request_body_encoding = encode_body(json.dumps(body).encode())
    return rec


def _key(rec: Record):
    from toolproxy.record.model import body_bytes

    return episode_key(rec, body_bytes(rec.request_body, rec.request_body_encoding))


CHAT = {"model": "m", "messages": [SYSTEM, USER]}
CHAT_LATER = {
    "model": "m",
    "messages": [SYSTEM, USER, REPLY, RESULT],
    "tools": [{"type": "function", "function": {"name": "weather"}}],
}
# The same conversation spoken as Anthropic Messages and as OpenAI Responses.
MESSAGES = {
    "model": "m",
    "max_tokens": 64,
    "system": "You are an agent.",
    "messages": [{"role": "user", "content": "Find the weather in Paris."}],
}
MESSAGES_LATER = {
    **MESSAGES,
    "messages": [
        *MESSAGES["messages"],
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C"}]},
    ],
}
RESPONSES = {"model": "m", "instructions": "You are an agent.", "input": "Find the weather in Paris."}
RESPONSES_LATER = {
    "model": "m",
    "instructions": "You are an agent.",
    "input": [
        {"role": "user", "content": "Find the weather in Paris."},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "18C"},
    ],
}


@pytest.mark.parametrize(
    "path, first, later",
    [
        ("/v1/chat/completions", CHAT, CHAT_LATER),
        ("/v1/messages", MESSAGES, MESSAGES_LATER),
        ("/v1/responses", RESPONSES, RESPONSES_LATER),
        ("/api/chat", CHAT, CHAT_LATER),
    ],
)
def test_untagged_turns_of_one_episode_share_a_key_in_every_protocol(path, first, later):
    by, material = _key(_rec(path, first))
    assert by == BY_OPENING and material is not None
    assert _key(_rec(path, later)) == (by, material)
    other = json.loads(json.dumps(first).replace("Paris", "Rome"))
    assert _key(_rec(path, other))[1] != material


@pytest.mark.parametrize(
    "rec, by",
    [
        (_rec(body=CHAT, episode="7"), BY_EPISODE),
        (_rec(body=CHAT), BY_OPENING),
        (_rec("/v1/models", method="GET"), BY_NONE),  # not a model call
        (_rec("/health", body=CHAT), BY_NONE),
        (_rec("/v1/responses", body={**RESPONSES, "previous_response_id": "resp_1"}), BY_NONE),  # opening on the server
    ],
)
def test_what_decides(rec, by):
    assert _key(rec)[0] == by


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        '"a string"',
        '{"messages": "not a list"}',
        '{"messages": [' + "[" * 400 + "]" * 400 + "]}",
        '{"messages": [{"role": 7, "content": {"x": 1}}]}',
    ],
)
def test_odd_bodies_are_kept_whole_or_decided_never_a_crash(body):
    rec = _rec()
    rec.request_body, rec.request_body_encoding = body, "utf8"
    out = Sampler(0.01, KEY).record(rec)
    assert (
        out.extra["sample"] in ({"rate": 1.0, "by": BY_NONE, "of": 0.01}, {"rate": 0.01, "by": BY_OPENING})
        or out.kind == SAMPLED_OUT
    )
    if body.startswith("{not") or body.startswith('"'):
        assert out.extra["sample"]["by"] == BY_NONE


def test_a_tag_decides_alike_in_every_run_and_a_sampled_out_record_is_a_stub():
    s = Sampler(RATE, KEY)
    decisions = {s.record(_rec(body=CHAT, episode=str(i), run=run)).kind for i in range(40) for run in ("a", "b")}
    assert decisions == {"exchange", SAMPLED_OUT}
    for i in range(40):
        a, b = (s.record(_rec(body=CHAT, episode=str(i), run=run)) for run in ("a", "b"))
        assert a.kind == b.kind  # runs over the same episodes keep the same ones: pairs survive
        if a.kind == SAMPLED_OUT:
            assert a.request_body is None and a.response_body is None and a.request_headers == []
            assert a.extra == {"sample": {"rate": RATE, "by": BY_EPISODE}} and a.path == "/v1/chat/completions"
        else:
            assert a.extra["sample"] == {"rate": RATE, "by": BY_EPISODE} and a.request_body is not None


def test_fingerprints_are_never_sampled():
    rec = Record(id="f", started_at=0.0, kind="fingerprint")
    assert Sampler(0.001, KEY).record(rec) is rec


# ---------------------------------------------------------------- a real proxy under an agent loop

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a thing up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]
EPISODES = 48


def _steps(task: int) -> int:
    return 1 + task % 4  # tool calls before the answer: episodes of 2 to 5 turns


def _task(messages: list) -> int:
    first = next(m for m in messages if m.get("role") == "user")
    return int(first["content"].split()[1].rstrip(":"))


def _respond(req):
    """The model: `steps` lookups, then an answer."""
    done = sum(1 for m in req.messages if m.get("role") == "tool")
    task = _task(req.messages)
    if done < _steps(task):
        return call("lookup", {"q": f"task {task} step {done}"})
    return text(f"Task {task} is done after {done} lookups.")


async def _episode(s: aiohttp.ClientSession, base: str, model: str, task: int, tagged: bool) -> int:
    """One agent episode, as a harness runs it: resend the whole history each turn. Returns turns."""
    prefix = f"/t/run=loop/episode=ep{task}" if tagged else "/t/run=loop"
    messages = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": f"Task {task}: look things up, then answer."},
    ]
    turns = 0
    while True:
        stream = task % 2 == 0
        for _ in range(3):  # a harness retries a failed request as it was: attempts of one turn
            async with s.post(
                f"{base}{prefix}/v1/chat/completions",
                json={"model": model, "messages": messages, "tools": TOOLS, "stream": stream},
            ) as r:
                raw = await r.read()
            if r.status != 500:
                break
        assert r.status == 200
        turns += 1
        if stream:
            events = [json.loads(x[6:]) for x in raw.decode().split("\n") if x.startswith("data: {")]
            content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            names = [
                tc["function"]["name"]
                for e in events
                if e["choices"]
                for tc in e["choices"][0]["delta"].get("tool_calls") or ()
                if tc.get("function", {}).get("name")
            ]
        else:
            msg = json.loads(raw)["choices"][0]["message"]
            content, names = msg.get("content") or "", [tc["function"]["name"] for tc in msg.get("tool_calls") or ()]
        if not names:
            assert content == f"Task {task} is done after {_steps(task)} lookups."  # forwarded unchanged
            return turns
        call_id = f"call_{task}_{turns}"
        messages = messages + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"q": f"task {task} step {turns - 1}"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": f"result {turns}"},
        ]


def _cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_a_sampled_proxy_keeps_whole_episodes_and_reports_estimated_totals(fake_stack, proxy, tmp_path):
    fake = fake_stack("vllm", tool_parser="hermes", responder=_respond)
    fake.fail(times=6, path="/v1/chat/completions")  # six attempts fail and are retried
    data = tmp_path / "data"
    data.mkdir()
    (data / "sample.key").write_bytes(KEY)  # a fixed key: the kept episodes are known in advance
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--sample", "50%", data=data)
    async with aiohttp.ClientSession() as s:
        turns = await asyncio.gather(
            *(_episode(s, p.url, fake.model, task, tagged=task % 3 != 0) for task in range(EPISODES))
        )
    expected = {task: n for task, n in enumerate(turns)}
    assert all(n == _steps(t) + 1 for t, n in expected.items())
    total = sum(turns) + 6

    records = p.wait_records(1)
    stubs = read_records(data, SAMPLED_OUT)
    for _ in range(100):
        if len(records) + len(stubs) >= total:
            break
        await asyncio.sleep(0.05)
        records, stubs = p.records(), read_records(data, SAMPLED_OUT)
    assert len(records) + len(stubs) == total  # every exchange stored or counted: none lost

    def task_of(rec: dict) -> int:
        if rec.get("episode"):
            return int(rec["episode"][2:])
        return _task(json.loads(rec["request_body"])["messages"])

    kept = Counter(task_of(r) for r in records if r["status"] == 200)
    assert sum(r["status"] == 500 for r in records + stubs) == 6
    # Every stored episode is complete: all its turns, none of them a stub.
    assert all(n == expected[t] for t, n in kept.items()), (kept, expected)
    stub_tags = Counter(r["episode"] for r in stubs if r.get("episode"))
    assert not any(f"ep{t}" in stub_tags for t in kept)
    assert sum(r["status"] == 200 for r in stubs) == sum(expected[t] for t in expected if t not in kept)
    share = len(kept) / EPISODES
    assert 0.3 <= share <= 0.7, share
    # The decision is the pure function of the key: a tagged episode by its tag, an untagged one by its opening.
    sampler = Sampler(RATE, KEY)
    for task in range(EPISODES):
        material = (
            f"episode\x00ep{task}".encode()
            if task % 3
            else episode_key(
                _rec(
                    body={
                        "messages": [
                            {"role": "system", "content": "You are a careful agent."},
                            {"role": "user", "content": f"Task {task}: look things up, then answer."},
                        ]
                    }
                ),
                json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "You are a careful agent."},
                            {"role": "user", "content": f"Task {task}: look things up, then answer."},
                        ]
                    }
                ).encode(),
            )[1]
        )
        assert sampler.keeps(material) == (task in kept), task
    assert {json.dumps(r["extra"]["sample"], sort_keys=True) for r in records + stubs} <= {
        json.dumps({"rate": RATE, "by": by}, sort_keys=True) for by in (BY_EPISODE, BY_OPENING)
    }
    assert all(r["request_body"] is None and r["response_body"] is None for r in stubs)
    assert p.stats()["sampling"] == {"sample_rate": RATE, "kept": len(records), "sampled_out": len(stubs)}
    p.stop()

    db = tmp_path / "a.duckdb"
    out = _cli("analyze", "--data", str(data), "--db", str(db), "--quiet")
    assert f"loop at 50% of episodes, {len(stubs)} exchanges forwarded and not stored" in out and "issues: none" in out
    doc = json.loads(_cli("report", "--data", str(data), "--db", str(db), "--format", "json"))
    (run,) = doc["runs"]
    kept_turns = sum(kept.values())
    assert run["episodes"] == len(kept) and run["turns"] == kept_turns  # each stored episode rebuilt whole
    assert run["sampling"] == {
        "rate_min": RATE,
        "rate_max": RATE,
        "estimated_turns": kept_turns / RATE,
        "estimated_episodes": len(kept) / RATE,
        "exchanges_not_stored": len(stubs),
    }
    line = (
        f"sampled at 50% of episodes: {kept_turns} turns in {len(kept)} episodes stored stand for an estimated "
        f"{kept_turns / RATE:,.0f} turns in {len(kept) / RATE:,.0f} episodes ({len(stubs)} exchanges"
    )
    for fmt in ("table", "markdown", "html"):
        out = _cli("report", "--data", str(data), "--db", str(db), "--format", fmt)
        assert line in " ".join(out.split()), fmt
    (row,) = csv.DictReader(io.StringIO(_cli("report", "--data", str(data), "--db", str(db), "--format", "csv")))
    assert float(row["sampling_rate_min"]) == RATE and float(row["sampling_estimated_episodes"]) == len(kept) / RATE
    episodes = json.loads(
        _cli(
            "sql",
            "--data",
            str(data),
            "--db",
            str(db),
            "--format",
            "json",
            "select n_turns from episodes order by n_turns",
        )
    )
    assert sorted(e["n_turns"] for e in episodes) == sorted(kept.values())


@pytest.mark.parametrize(
    "args, message",
    [
        (("--sample", "0"), "--sample '0': the share of episodes to keep must be above 0"),
        (("--sample", "half"), "--sample 'half' is not a rate"),
        (("--sample", "0.5", "--max-disk", "lots"), "--max-disk 'lots' is not a size"),
    ],
)
def test_bad_sample_flags_are_usage_errors(tmp_path, args, message):
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--data",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_damaged_sample_key_is_a_usage_error(tmp_path):
    (tmp_path / "sample.key").write_bytes(b"short")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--data",
            str(tmp_path),
            "--sample",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--sample: cannot use the key sample.key" in r.stderr and "Traceback" not in r.stderr
