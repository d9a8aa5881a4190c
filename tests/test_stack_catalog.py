"""Each emulator sends exactly the marks the catalog lists and the detectors read, and no other stack's.

One emulator per catalogued stack runs on 127.0.0.1 (one per module); the real fingerprint probes
it, its failures are provoked the way a client provokes them, and what it sends is read back by
the markers and the advice. The last test checks the catalog is the only place in the source
tree where a stack's own sentences and constants are spelled.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import aiohttp
import orjson
import pytest

from toolproxy.emulators import FakeStack, broken_call
from toolproxy.stacks import catalog, markers
from toolproxy.stacks.advice import explain_refusal
from toolproxy.stacks.fingerprint import GET_PROBES, SERVER_HEADERS, Observed, evidence_by_stack, probe

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
NAMES = [s.name for s in catalog.CATALOG]

# How a client provokes each catalogued failure: emulator options, path, request body.
PROVOKE = {
    (catalog.OLLAMA.name, catalog.TOOL_REFUSAL): ({}, "/v1/chat/completions", {"model": "gemma3", "tools": TOOLS}),
    (catalog.OLLAMA.name, catalog.UNKNOWN_MODEL): ({}, "/api/chat", {"model": "nope:1b", "stream": False}),
    (catalog.OLLAMA.name, catalog.PARSE_FAILURE): (
        {},
        "/api/chat",
        {"model": "qwen2.5:7b", "tools": TOOLS, "stream": False},
    ),
    (catalog.LLAMACPP.name, catalog.TOOL_REFUSAL): (
        {"jinja": False},
        "/v1/chat/completions",
        {"model": "m", "tools": TOOLS},
    ),
    (catalog.LLAMACPP.name, catalog.TOOL_CHOICE_REFUSAL): (
        {"jinja": False},
        "/v1/chat/completions",
        {"model": "m", "tool_choice": "auto"},
    ),
    (catalog.LLAMACPP.name, catalog.PARSE_FAILURE): ({}, "/v1/chat/completions", {"model": "m", "tools": TOOLS}),
    (catalog.VLLM.name, catalog.TOOL_REFUSAL): ({}, "/v1/chat/completions", {"model": catalog.QWEN_HF, "tools": TOOLS}),
    (catalog.VLLM.name, catalog.UNKNOWN_MODEL): ({}, "/v1/chat/completions", {"model": "nope"}),
    (catalog.OPENAI.name, catalog.UNKNOWN_MODEL): ({}, "/v1/chat/completions", {"model": "nope"}),
    (catalog.LLAMACPP_PYTHON.name, catalog.INVALID_REQUEST): (
        {},
        "/v1/chat/completions",
        {"model": "m", "messages": "x"},
    ),
}
FAILURES = [(s.name, kind) for s in catalog.CATALOG for kind in s.failures]
BROKEN = '<tool_call>{"name": "get_weather", "arguments": {"city": '


def test_every_failure_has_a_way_to_provoke_it():
    assert sorted(PROVOKE) == sorted(FAILURES)


def test_one_list_of_names_and_every_stack_emulated():
    from toolproxy.emulators.base import EMULATORS

    assert catalog.STACKS == tuple(NAMES) and len(set(NAMES)) == len(NAMES)
    assert sorted(EMULATORS) == sorted(NAMES)
    assert set(catalog.LABELS) == {*NAMES, catalog.UNKNOWN, catalog.UNREACHABLE}


@pytest.fixture(scope="module")
def emulated():
    """name -> a running emulator with the stack's default launch options (one per stack per module)."""
    fakes: dict[str, FakeStack] = {}
    stack = []
    try:
        for name in NAMES:
            fake = FakeStack(name)
            stack.append(fake.in_thread())
            stack[-1].__enter__()
            fakes[name] = fake
        yield fakes
    finally:
        for cm in reversed(stack):
            cm.__exit__(None, None, None)


async def _observe(url: str) -> dict[str, Observed]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        out = {}
        for p in GET_PROBES:
            method, path = p.split(" ", 1)
            async with s.request(method, url + path) as r:
                out[p] = Observed(r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()})
        return out


@pytest.mark.parametrize("name", NAMES)
async def test_the_fingerprint_finds_each_emulator_by_its_catalogued_probes_only(emulated, name):
    entry = catalog.BY_NAME[name]
    fake = emulated[name]
    async with aiohttp.ClientSession() as s:
        fp = await probe(s, fake.url, fake.model)
    assert fp.stack == name
    assert fp.label.startswith(entry.label)
    observed = await _observe(fake.url)
    assert set(evidence_by_stack(observed)) <= {name}  # (c) no other stack's marks in any probe answer
    for p in entry.probes:  # (b) each probe the catalog lists for it, answered alone, marks it
        votes = evidence_by_stack({p.endpoint: observed[p.endpoint]})
        if name == catalog.OPENAI.name:
            assert votes == {}
        else:
            assert set(votes) == {name} and p.evidence in votes[name], (p, votes)
    if entry.server_header in SERVER_HEADERS:
        assert f"answers with Server: {entry.server_header}" in evidence_by_stack(observed)[name]
    if name == catalog.OPENAI.name:
        assert fp.evidence == [entry.probes[0].evidence]
    if entry.model_probe is not None:
        async with aiohttp.ClientSession() as s:
            async with s.post(fake.url + entry.model_probe.endpoint.split(" ", 1)[1], json={"model": fake.model}) as r:
                assert r.status == 200
                assert (await r.json(content_type=None))["template"] == entry.chat_template


@pytest.mark.parametrize("name", NAMES)
async def test_headers_versions_and_models_are_the_catalogued_ones(emulated, name):
    entry = catalog.BY_NAME[name]
    fake = emulated[name]
    async with aiohttp.ClientSession() as s:
        async with s.get(fake.url + "/v1/models") as r:
            header = r.headers.get("Server")
            listed = await r.json(content_type=None)
        async with s.post(fake.url + "/v1/chat/completions", json={"model": fake.model, "messages": MSGS}) as r:
            chat = await r.json(content_type=None)
        async with aiohttp.ClientSession() as s2:
            fp = await probe(s2, fake.url, fake.model)
    if entry.server_header is not None:
        assert header == entry.server_header
    else:
        assert header not in {s.server_header for s in catalog.CATALOG}
    assert [m["id"] for m in listed["data"]] == list(entry.models)
    assert {m["owned_by"] for m in listed["data"]} == {entry.owned_by}
    mark = markers.detect(listed)
    assert mark is None or mark.stack == name
    if entry.owned_by in entry.owner_marks:
        assert mark is not None and mark.stack == name
    if entry.system_fingerprint is not None:
        assert chat["system_fingerprint"] == entry.system_fingerprint
    chat_mark = markers.detect(chat)
    assert chat_mark is None or chat_mark.stack == name  # (c) a chat body names no other stack
    if name in (catalog.OLLAMA.name, catalog.LLAMACPP.name, catalog.VLLM.name, catalog.SGLANG.name):
        assert chat_mark is not None  # these stacks' chat bodies always carry a mark of their own
    if entry.version is not None and name != catalog.OPENAI.name:
        assert fp.version == entry.version.split("-")[0]
    if entry.banner is not None:
        async with aiohttp.ClientSession() as s:
            async with s.get(fake.url + "/") as r:
                assert (await r.text()) == entry.banner


@pytest.mark.parametrize("name,kind", FAILURES)
async def test_each_failure_is_sent_as_catalogued_and_recognised(name, kind):
    entry = catalog.BY_NAME[name]
    failure = entry.failures[kind]
    options, path, body = PROVOKE[name, kind]
    fake = FakeStack(name, **options)
    if kind == catalog.PARSE_FAILURE:
        fake.enqueue(broken_call(BROKEN))
    async with fake.running() as url:
        async with aiohttp.ClientSession() as s:
            async with s.post(url + path, json={"messages": MSGS, **body}) as r:
                status, raw = r.status, await r.read()
    obj = orjson.loads(raw)
    assert status == failure.status
    err = obj.get("error")
    message = err if isinstance(err, str) else (err or obj).get("message")
    literal = re.compile("^" + re.sub(r"\\\{\w+\\\}", ".*", re.escape(failure.message)) + "$", re.S)
    assert literal.match(message), (message, failure.message)
    assert failure.needle in message.lower()
    if kind in (catalog.TOOL_REFUSAL, catalog.PARSE_FAILURE):  # the failures doctor explains
        refusal = explain_refusal(name, message)
        assert refusal is not None and refusal.needle == failure.needle
    mark = markers.detect(obj)
    if failure.marks and (kind == catalog.TOOL_REFUSAL or isinstance(err, str)):
        assert mark is not None and mark.stack == name, (obj, mark)  # the markers read it as this stack
    assert mark is None or mark.stack == name  # (c) never another stack's
    others = [f for s in catalog.CATALOG if s.name != name for f in s.failures.values()]
    assert not any(f.needle in message.lower() for f in others if f.needle not in failure.needle)


# ---------------------------------------------------------------- spelled once


SOURCES = [p for d in ("toolproxy", "analysis", "examples") for p in (ROOT / d).rglob("*.py")]
CATALOG_FILE = ROOT / "toolproxy" / "stacks" / "catalog.py"


def _fragments(template: str) -> list[str]:
    """The literal runs of a message template long enough to be the stack's own words."""
    return [part for part in re.split(r"\{\w+\}", template) if len(part.strip()) >= 12]


def _spelled() -> dict[str, str]:
    """Each stack's own sentence or constant -> what it is. Launch flags (`--jinja`) are left out:
    advice and help texts name them on purpose."""
    marks: dict[str, str] = {}
    for s in catalog.CATALOG:
        for kind, f in s.failures.items():
            for part in _fragments(f.message):
                marks[part.strip()] = f"{s.name} {kind} message"
            if kind in (catalog.TOOL_REFUSAL, catalog.PARSE_FAILURE) and not f.needle.startswith("--"):
                marks[f.needle] = f"{s.name} {kind} needle"
        for value, what in (
            (s.banner, "banner"),
            (s.system_fingerprint, "system_fingerprint"),
            (s.version, "version"),
            (s.chat_template, "chat template"),
        ):
            if value:
                marks[value] = f"{s.name} {what}"
    return marks


def _strings(path: Path) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [t.string for t in tokens if t.type == tokenize.STRING]


def test_the_catalog_is_the_only_place_a_stacks_words_are_spelled():
    marks = _spelled()
    assert len(marks) >= 15  # the scan looks for something
    found = [
        (str(p.relative_to(ROOT)), what)
        for p in SOURCES
        if p != CATALOG_FILE
        for lit in _strings(p)
        for mark, what in marks.items()
        if mark.lower() in lit.lower()
    ]
    assert found == []


def test_the_stack_names_are_listed_once():
    """No literal tuple, list, set or dict in the source spells three or more stack names."""
    names = "|".join(re.escape(n) for n in NAMES)
    listing = re.compile(rf"""['"](?:{names})['"]\s*[:,][^\n]*['"](?:{names})['"][^\n]*['"](?:{names})['"]""")
    found = [str(p.relative_to(ROOT)) for p in SOURCES if p != CATALOG_FILE and listing.search(p.read_text())]
    assert found == []
