"""Which serving stack answers behind an upstream URL, which version, and what it says about a model.

Two halves, kept apart so the knowledge can be table-tested against each stack's exact bodies:
`identify` is a pure function from observed responses (status, headers, body per probe) to a
Fingerprint; `probe` does the cheap, read-only HTTP requests that produce those observations.

Every probe is an endpoint the stack documents for itself, listed with the answer that marks it in
the stack's catalog entry (`toolproxy.stacks.catalog`; docs/stacks.md#how-toolproxy-tells-them-apart):
Ollama `GET /` (its banner), `GET /api/version`, `POST /api/show`; llama.cpp `GET /props`
(build_info, chat_template, chat_template_caps) and `Server: llama.cpp`; vLLM `GET /version`;
SGLang `GET /get_server_info` (newer: `/server_info`); LM Studio `GET /api/v1/models`
(`capabilities.trained_for_tool_use`) and `GET /api/v0/models`; and `GET /v1/models` everywhere
(`owned_by` names llama.cpp, vLLM and SGLang). A stack that answers none of these with its
markers but serves `/v1/models` is "openai" (compatible, unidentified); one that answers nothing
recognisable is "unknown"; one that cannot be reached is "unreachable". None of it is fatal.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from toolproxy import __version__
from toolproxy.record.model import Record, new_id
from toolproxy.stacks import markers
from toolproxy.stacks.catalog import (
    CATALOG,
    LABELS,
    LLAMACPP,
    LLAMACPP_PYTHON,
    LMSTUDIO,
    OLLAMA,
    OPENAI,
    OPENAPI_TITLE,
    SGLANG,
    UNKNOWN,
    UNREACHABLE,
    VLLM,
)
from toolproxy.term.connection_errors import explain
from toolproxy.wire import error_text

ROOT, OLLAMA_VERSION = (p.endpoint for p in OLLAMA.probes)
OLLAMA_SHOW = OLLAMA.model_probe.endpoint
(LLAMACPP_PROPS,) = (p.endpoint for p in LLAMACPP.probes)
(VLLM_VERSION,) = (p.endpoint for p in VLLM.probes)
SGLANG_INFO, SGLANG_INFO_NEW = (p.endpoint for p in SGLANG.probes)
LMSTUDIO_V1, LMSTUDIO_V0 = (p.endpoint for p in LMSTUDIO.probes)
(MODELS,) = (p.endpoint for p in OPENAI.probes)
(OPENAPI,) = (p.endpoint for p in LLAMACPP_PYTHON.probes)

GET_PROBES = tuple(p.endpoint for stack in CATALOG for p in stack.probes)
# A Server header only one stack sends names it (vLLM and SGLang both answer as uvicorn).
_HEADER_COUNTS = Counter(s.server_header for s in CATALOG if s.server_header)
SERVER_HEADERS = {s.server_header: s.name for s in CATALOG if _HEADER_COUNTS[s.server_header] == 1}

_BUILD = re.compile(r"^(b\d+)(?:-[0-9a-f]+)?$")
_MAX_BODY = 4 * 1024 * 1024  # /api/show carries the license and modelfile: tens of KB, not MBs
_MAX_MODELS = 50
# Says in the stack's logs what these requests are (and lets test fakes file them apart).
USER_AGENT_PREFIX = "toolproxy-fingerprint/"
USER_AGENT = USER_AGENT_PREFIX + __version__


@dataclass(frozen=True, slots=True)
class Observed:
    """What one probe got: a status and body, or the transport error instead."""

    status: int | None
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    error: str | None = None  # in words (connection_errors.explain)
    detail: str | None = None  # the system's own text for that error

    def json(self) -> Any:
        """The body as JSON when the probe succeeded, else None (an HTML 404 page is not data)."""
        if self.status != 200 or not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


@dataclass(slots=True)
class Fingerprint:
    upstream: str
    stack: str  # one of catalog.STACKS, catalog.UNKNOWN or catalog.UNREACHABLE
    version: str | None = None
    build: str | None = None
    model: str | None = None
    model_listed: bool | None = None  # None: the stack does not list models, or serves any name
    models: list[str] = field(default_factory=list)
    capabilities: list[str] | None = None  # None: the stack does not advertise them
    chat_template: str | None = None
    chat_template_source: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    probes: dict[str, Any] = field(default_factory=dict)  # probe -> status, or the error text
    error: str | None = None
    error_detail: str | None = None  # the system's own text behind `error`, for a second line

    @property
    def label(self) -> str:
        name = LABELS.get(self.stack, self.stack)
        return f"{name} {self.version}" if self.version else name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _answer(obs: Mapping[str, Observed], probe: str) -> Any:
    """The JSON one probe got, or None when it was not made or got no usable answer."""
    o = obs.get(probe)
    return o.json() if o is not None else None


def evidence_by_stack(obs: Mapping[str, Observed]) -> dict[str, list[str]]:
    """Every stack the probes' responses point at, with the evidence for each, in the order found."""
    votes: dict[str, list[str]] = {}

    def vote(stack: str, why: str) -> None:
        votes.setdefault(stack, []).append(why)

    root = obs.get(ROOT)
    if root is not None and root.status == 200 and root.body.strip() == OLLAMA.banner.encode():
        vote(OLLAMA.name, OLLAMA.probes[0].evidence)
    if isinstance(_dict(_answer(obs, OLLAMA_VERSION)).get("version"), str):
        vote(OLLAMA.name, OLLAMA.probes[1].evidence)
    props = _dict(_answer(obs, LLAMACPP_PROPS))
    if "build_info" in props or ("default_generation_settings" in props and "chat_template" in props):
        vote(LLAMACPP.name, LLAMACPP.probes[0].evidence)
    for sglang_probe in SGLANG.probes:
        info = _dict(_answer(obs, sglang_probe.endpoint))
        if "version" in info and ("model_path" in info or "tp_size" in info or "server_args" in info):
            vote(SGLANG.name, sglang_probe.evidence)
            break
    v1 = _dict(_answer(obs, LMSTUDIO_V1))
    if any(
        "loaded_instances" in m or "trained_for_tool_use" in _dict(m.get("capabilities"))
        for m in _list(v1.get("models"))
        if isinstance(m, dict)
    ):
        vote(LMSTUDIO.name, LMSTUDIO.probes[0].evidence)
    v0 = _dict(_answer(obs, LMSTUDIO_V0))
    if any("compatibility_type" in m for m in _list(v0.get("data")) if isinstance(m, dict)):
        vote(LMSTUDIO.name, LMSTUDIO.probes[1].evidence)
    if _dict(_dict(_answer(obs, OPENAPI)).get("info")).get("title") == OPENAPI_TITLE:
        vote(LLAMACPP_PYTHON.name, LLAMACPP_PYTHON.probes[0].evidence)
    mark = markers.detect(_answer(obs, MODELS))
    if mark is not None:
        vote(mark.stack, f"GET /v1/models: {mark.evidence}")
    for header, stack in SERVER_HEADERS.items():
        if any(o.headers.get("server") == header for o in obs.values()):
            vote(stack, f"answers with Server: {header}")
    if not votes and isinstance(_dict(_answer(obs, VLLM_VERSION)).get("version"), str):
        # Weak on its own (many servers have a /version); only when nothing more specific spoke.
        vote(VLLM.name, VLLM.probes[0].evidence)
    return votes


def detect_stack(obs: Mapping[str, Observed]) -> tuple[str, list[str]]:
    """(stack, evidence) from the probes' responses; the stack with the most evidence wins."""
    votes = evidence_by_stack(obs)
    if not votes:
        models = _answer(obs, MODELS)
        if isinstance(_dict(models).get("data"), list):
            return OPENAI.name, [OPENAI.probes[0].evidence]
        return UNKNOWN, []
    stack = max(votes, key=lambda s: len(votes[s]))
    return stack, votes[stack]


def _model_ids(obs: Mapping[str, Observed]) -> list[str]:
    data = _list(_dict(_answer(obs, MODELS)).get("data"))
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _ollama_name(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def identify(upstream: str, obs: Mapping[str, Observed], model: str | None = None) -> Fingerprint:
    """Everything the observed responses say about the stack and, when given, the model."""
    fp = Fingerprint(upstream=upstream, stack=UNKNOWN, model=model)
    fp.probes = {k: (o.status if o.status is not None else o.error) for k, o in obs.items()}
    if obs and all(o.status is None for o in obs.values()):
        fp.stack = UNREACHABLE
        first = next(iter(obs.values()))
        fp.error, fp.error_detail = first.error, first.detail
        return fp
    fp.stack, fp.evidence = detect_stack(obs)
    ids = _model_ids(obs)
    fp.models = ids[:_MAX_MODELS]
    if model is not None and ids:
        fp.model_listed = model in ids
    _EXTRACT.get(fp.stack, lambda fp, obs: None)(fp, obs)
    return fp


def _ollama(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    fp.version = _dict(_answer(obs, OLLAMA_VERSION)).get("version")
    if fp.model is not None and fp.models:
        fp.model_listed = _ollama_name(fp.model) in {_ollama_name(m) for m in fp.models}
    show_obs = obs.get(OLLAMA_SHOW)
    show = _dict(_answer(obs, OLLAMA_SHOW))
    if show:
        caps = show.get("capabilities")
        fp.capabilities = [c for c in caps if isinstance(c, str)] if isinstance(caps, list) else None
        if isinstance(show.get("template"), str) and show["template"]:
            fp.chat_template, fp.chat_template_source = show["template"], "Ollama POST /api/show template"
        details = _dict(show.get("details"))
        fp.details = {
            k: details[k] for k in ("family", "parameter_size", "quantization_level", "format") if k in details
        }
    elif show_obs is not None and show_obs.status is not None:
        fp.details["show_error"] = error_text(show_obs.body)
        if show_obs.status == 404:
            fp.model_listed = False


def _llamacpp(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    props = _dict(_answer(obs, LLAMACPP_PROPS))
    build = props.get("build_info")
    if isinstance(build, str) and build:
        fp.build = build
        m = _BUILD.match(build)
        fp.version = m.group(1) if m else build
    template = props.get("chat_template_tool_use") or props.get("chat_template")
    if isinstance(template, str) and template:
        key = "chat_template_tool_use" if props.get("chat_template_tool_use") else "chat_template"
        fp.chat_template, fp.chat_template_source = template, f"llama.cpp GET /props {key}"
    caps = _dict(props.get("chat_template_caps"))
    if caps:
        fp.capabilities = ["completion"] + (
            ["tools"] if caps.get("supports_tool_calls") or caps.get("supports_tools") else []
        )
        if _dict(props.get("modalities")).get("vision"):
            fp.capabilities.append("vision")
        fp.details["chat_template_caps"] = caps
    for key in ("model_path", "total_slots"):
        if key in props:
            fp.details[key] = props[key]
    n_ctx = _dict(props.get("default_generation_settings")).get("n_ctx")
    if n_ctx is not None:
        fp.details["n_ctx"] = n_ctx
    # llama-server (outside router mode) answers whatever model name it is sent.
    fp.model_listed = None


def _vllm(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    fp.version = _dict(_answer(obs, VLLM_VERSION)).get("version")
    for m in _list(_dict(_answer(obs, MODELS)).get("data")):
        if isinstance(m, dict) and m.get("id") == fp.model and "max_model_len" in m:
            fp.details["max_model_len"] = m["max_model_len"]


def _sglang(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    info = _dict(_answer(obs, SGLANG_INFO)) or _dict(_answer(obs, SGLANG_INFO_NEW))
    fp.version = info.get("version") if isinstance(info.get("version"), str) else None
    args = _dict(info.get("server_args")) or info
    # The one launch flag that decides whether calls come back as tool_calls or as text.
    for key in ("tool_call_parser", "model_path", "chat_template"):
        if key in args:
            fp.details[key] = args[key]


def _lmstudio(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    for m in _list(_dict(_answer(obs, LMSTUDIO_V1)).get("models")):
        if isinstance(m, dict) and fp.model is not None and fp.model in (m.get("key"), m.get("id")):
            caps = _dict(m.get("capabilities"))
            fp.capabilities = ["completion"] + (["tools"] if caps.get("trained_for_tool_use") else [])
            if caps.get("vision"):
                fp.capabilities.append("vision")


def _llamacpp_python(fp: Fingerprint, obs: Mapping[str, Observed]) -> None:
    version = _dict(_dict(_answer(obs, OPENAPI)).get("info")).get("version")
    fp.version = version if isinstance(version, str) else None
    # It answers whatever model name it is sent, under that name: its list names the file it loaded.
    fp.model_listed = None
    if fp.models:
        fp.details["model_path"] = fp.models[0]


_EXTRACT = {
    LLAMACPP_PYTHON.name: _llamacpp_python,
    OLLAMA.name: _ollama,
    LLAMACPP.name: _llamacpp,
    VLLM.name: _vllm,
    SGLANG.name: _sglang,
    LMSTUDIO.name: _lmstudio,
}


async def _fetch(
    session: aiohttp.ClientSession,
    base: str,
    probe: str,
    headers: Mapping[str, str],
    timeout: float,
    json_body: Any = None,
) -> Observed:
    method, path = probe.split(" ", 1)
    headers = {**headers, "User-Agent": USER_AGENT}
    if json_body is not None:
        headers["Content-Type"] = "application/json"
    try:
        async with asyncio.timeout(timeout):
            async with session.request(
                method, base + path, headers=dict(headers), json=json_body, allow_redirects=False
            ) as resp:
                body = await resp.content.read(_MAX_BODY)
                return Observed(resp.status, body, {k.lower(): v for k, v in resp.headers.items()})
    except TimeoutError as exc:
        return Observed(None, error=f"{probe}: no answer within {timeout:g}s. {explain(exc, base).advice}")
    except aiohttp.ClientConnectorError as exc:
        problem = explain(exc)
        return Observed(None, error=f"cannot connect to {base}: {problem.sentence()}", detail=problem.detail)
    except aiohttp.ClientError as exc:
        problem = explain(exc, base)
        return Observed(None, error=f"{probe}: {problem.sentence()}", detail=problem.detail)


async def probe(
    session: aiohttp.ClientSession,
    upstream: str,
    model: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> Fingerprint:
    """Fingerprint an upstream with read-only requests; never raises for what the upstream does."""
    base = upstream.rstrip("/")
    headers = headers or {}
    results = await asyncio.gather(*(_fetch(session, base, p, headers, timeout) for p in GET_PROBES))
    obs = dict(zip(GET_PROBES, results))
    stack, _ = detect_stack(obs) if any(o.status is not None for o in results) else (UNREACHABLE, [])
    if stack == OLLAMA.name and model is not None:
        obs[OLLAMA_SHOW] = await _fetch(session, base, OLLAMA_SHOW, headers, timeout, {"model": model})
    return identify(upstream, obs, model)


def fingerprint_record(fp: Fingerprint, run: str | None, started_at: float) -> Record:
    """The record that carries a fingerprint to the analyzer, through the same writer as exchanges."""
    now = time.time()
    return Record(
        id=new_id(),
        started_at=started_at,
        ended_at=now,
        duration_ms=(now - started_at) * 1000.0,
        kind="fingerprint",
        run=run,
        upstream=fp.upstream,
        extra=fp.to_dict(),
        error_kind="connect" if fp.stack == UNREACHABLE else None,
        error_message=fp.error if fp.stack == UNREACHABLE else None,
    )
