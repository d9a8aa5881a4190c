"""`toolproxy doctor`: which layer is at fault when a model "never calls tools", and what to change.

It walks the diagnosis in order (docs/doctor.md), because each layer hides the next: (1) did the serving layer
refuse or empty the request (then the model never ran); (2) was the request accepted but the call
left as text in `content` (no or a mismatched parser); (3) only then, did the model make no call
or an invalid one. Every probe goes through the real proxy (`checks.local`), so the evidence is
also on disk as ordinary records of run `doctor`, in a data directory of their own by default.

`judge` is pure (replies in, verdicts out) so each stack's verdict is testable from its exact
responses; `diagnose` does the probing; `render` says it in plain words.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from toolproxy.analysis.classify.attempt import empty_cause
from toolproxy.analysis.classify.outcomes import MODEL_STOPPED, STOP_STRING
from toolproxy.checks.local import LocalProxy, check_target, local_proxy
from toolproxy.checks.reply import ProbeReply, call_problems
from toolproxy.proxy.cli import key_from_env, upstream_key_option
from toolproxy.stacks.advice import FORMAT_LABELS, MODEL_FIX, explain_refusal, text_surface_fix
from toolproxy.stacks.catalog import LABELS
from toolproxy.stacks.fingerprint import Fingerprint
from toolproxy.stacks.templates import TemplateFinding, check_ollama_template, check_rendered_prompt
from toolproxy.term.connection_errors import with_detail
from toolproxy.term.printable import printable
from toolproxy.term.progress import Progress, duration
from toolproxy.wire.framing import SSEFramer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER_TOOL]
TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Use a tool when one can answer the question."},
    {"role": "user", "content": "What is the weather in Paris right now?"},
]
CONTROL_MESSAGES = [{"role": "user", "content": "Reply with the single word: ready"}]

EXIT_NATIVE_OK, EXIT_NOT_NATIVE, EXIT_USAGE = 0, 1, 2
# Beside serve's default toolproxy-data, not in it: `report` there shows the user's runs, not probes.
DOCTOR_DATA = "toolproxy-data/doctor"


def chat_body(model: str, messages: list, tools: list | None = None, max_tokens: int = 256) -> dict:
    """A greedy, non-streaming chat request: the same bytes every time it is sent."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": False,
    }
    if tools is not None:
        body["tools"] = tools
    return body


@dataclass(slots=True)
class Step:
    number: int
    title: str
    status: str  # pass | fail | skipped
    summary: str
    fix: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Verdict:
    steps: list[Step]
    native_ok: bool
    at_fault: str | None  # serving_layer | parser | model | None
    exit_code: int
    problem: str | None = None  # a usage/transport problem that stopped the diagnosis
    problem_detail: str | None = None  # the system's own text behind it (errno and all)


def _quote(text: str, limit: int = 300) -> str:
    """The stack's exact words as a JSON string: inner quotes escaped, whitespace runs folded."""
    text = " ".join(text.split())
    return orjson.dumps(text if len(text) <= limit else text[: limit - 3] + "...").decode()


def _stack_says(fp: Fingerprint) -> str:
    return fp.label if fp.stack not in ("unknown", "openai") else f"the server ({LABELS[fp.stack]})"


def _skipped(number: int, title: str, why: str) -> Step:
    return Step(number, title, "skipped", f"not reached: {why}")


def judge(fp: Fingerprint, control: ProbeReply, probe: ProbeReply, tools: list[dict] = TOOLS) -> Verdict:
    """The diagnosis, in order, from the replies to a request without tools and one with them."""
    who = _stack_says(fp)
    s1, s2, s3 = "Serving layer", "Call surface", "Model"
    if probe.transport_failed:
        return Verdict([], False, None, EXIT_USAGE, f"the upstream did not answer: {probe.error_text}")
    if probe.refused and control.refused and probe.status == 404 and control.status == 404:
        return Verdict(
            [],
            False,
            None,
            EXIT_USAGE,
            f"{who} does not know model {fp.model!r}: HTTP 404 {_quote(probe.error_text)}"
            + (f" (it lists: {', '.join(fp.models[:10])})" if fp.models else ""),
        )
    evidence = {"status": probe.status, "finish_reason": probe.finish_reason}
    if probe.refused:
        text = probe.error_text
        known = explain_refusal(fp.stack, text)
        summary = (
            f"REFUSED by the serving layer: {who} answered HTTP {probe.status} {_quote(text)} to a request with tools."
        )
        if known is not None:
            summary += f" {known.meaning}."
        if control.refused:
            summary += (
                f" A request without tools failed too (HTTP {control.status} {_quote(control.error_text)}): "
                "the server or the model is broken, not only tool calling."
            )
        elif not control.transport_failed:
            summary += " The same request without tools got HTTP 200: the model runs; only tools are refused."
        if fp.capabilities is not None and "tools" in fp.capabilities:
            summary += (
                f" It advertises [{', '.join(fp.capabilities)}] all the same: the launch refuses tools, not the model."
            )
        elif fp.capabilities is not None:
            summary += f" Its capabilities are [{', '.join(fp.capabilities)}]."
        evidence["error"] = text
        fix = known.fix if known is not None else text_surface_fix(fp.stack, None)
        return Verdict(
            [
                Step(1, s1, "fail", summary, fix, evidence),
                _skipped(2, s2, "the model never ran"),
                _skipped(3, s3, "the model never ran"),
            ],
            False,
            "serving_layer",
            EXIT_NOT_NATIVE,
        )
    cause = empty_cause(probe.message) if probe.empty else None
    if cause is not None and cause[0] in (MODEL_STOPPED, STOP_STRING):
        # Nothing was lost in the server: the model ended its turn before writing anything.
        evidence["completion_tokens"] = probe.message.completion_tokens
        return Verdict(
            [
                Step(
                    1,
                    s1,
                    "pass",
                    f"accepted: {who} answered HTTP {probe.status} to a request with tools.",
                    None,
                    evidence,
                ),
                Step(2, s2, "pass", "nothing was generated to extract: no call was left in text."),
                Step(
                    3,
                    s3,
                    "fail",
                    f"NO OUTPUT: {cause[1]} (the model's doing, not the server's).",
                    MODEL_FIX,
                    {"finish_reason": probe.finish_reason},
                ),
            ],
            False,
            "model",
            EXIT_NOT_NATIVE,
        )
    if cause is not None:
        summary = (
            f"EMPTIED by the serving layer: {who} accepted the request (HTTP {probe.status}) but returned "
            f"no content and no tool calls (finish_reason {probe.finish_reason!r})."
        )
        if cause[0] == "swallowed":
            summary += f" The model ran: {cause[1]}."
        if fp.stack == "ollama":
            summary += " Ollama's tool parser drops a call to a tool name that was not offered and returns nothing."
        if probe.finish_reason == "tool_calls":
            summary += " It says finish_reason 'tool_calls' yet lists none: a call was started but not extracted."
        fix = text_surface_fix(fp.stack, None)
        return Verdict(
            [
                Step(1, s1, "fail", summary, fix, evidence),
                _skipped(2, s2, "nothing came back"),
                _skipped(3, s3, "nothing came back"),
            ],
            False,
            "serving_layer",
            EXIT_NOT_NATIVE,
        )
    steps = [
        Step(1, s1, "pass", f"accepted: {who} answered HTTP {probe.status} to a request with tools.", None, evidence)
    ]
    if not probe.calls:
        found = probe.text_calls(tools)
        if found.calls:
            first = found.calls[0]
            problems = call_problems(first, tools)
            validity = (
                "and the call itself is valid"
                if not problems
                else f"though the call itself is not valid ({'; '.join(problems)})"
            )
            summary = (
                f"the call came back as TEXT: {who} returned no tool_calls, but `content` holds "
                f"{len(found.calls)} call(s) written as {FORMAT_LABELS.get(first.format, first.format)}: "
                f"{first.name}({first.raw_arguments}) {validity}. The stack accepted the tools but did not "
                "extract the call, so a harness sees prose."
            )
            steps.append(
                Step(
                    2,
                    s2,
                    "fail",
                    summary,
                    text_surface_fix(fp.stack, first.format),
                    {"format": first.format, "content": probe.content[:2000]},
                )
            )
            steps.append(_skipped(3, s3, "the call never reached the harness as a call"))
            return Verdict(steps, False, "parser", EXIT_NOT_NATIVE)
        note = " (finish_reason 'tool_calls' with no calls listed)" if probe.finish_reason == "tool_calls" else ""
        steps.append(Step(2, s2, "pass", f"no call in `content` either{note}: nothing was left unextracted."))
        if found.attempted:
            summary = f"the model tried to write a call but no format can be recovered from it: {_quote(probe.content)}"
        else:
            summary = f"NO CALL: the model answered in prose: {_quote(probe.content)}"
        steps.append(Step(3, s3, "fail", summary, MODEL_FIX, {"content": probe.content[:2000]}))
        return Verdict(steps, False, "model", EXIT_NOT_NATIVE)
    steps.append(Step(2, s2, "pass", f"the call came back as native tool_calls ({len(probe.calls)} call(s))."))
    problems = [(c, call_problems(c, tools)) for c in probe.calls]
    bad = [(c, p) for c, p in problems if p]
    calls_text = ", ".join(f"{c.name}({c.arguments_text()})" for c in probe.calls)
    if bad:
        c, p = bad[0]
        steps.append(
            Step(
                3,
                s3,
                "fail",
                f"INVALID CALL: the model called {calls_text}: {'; '.join(p)}",
                MODEL_FIX,
                {"calls": calls_text},
            )
        )
        return Verdict(steps, False, "model", EXIT_NOT_NATIVE)
    steps.append(Step(3, s3, "pass", f"valid call: {calls_text}. Tools work natively.", None, {"calls": calls_text}))
    return Verdict(steps, True, None, EXIT_NATIVE_OK)


def judge_repeats(replies: list[ProbeReply], stack: str) -> dict[str, Any]:
    """Do N identical greedy requests give N identical answers? And does the prompt cache move?"""
    answered = [r for r in replies if not r.transport_failed and not r.refused]
    outputs = [(r.content, tuple((c.name, c.arguments_text()) for c in r.calls)) for r in answered]
    distinct = len(set(outputs))
    cached = [r.cached_tokens for r in answered]
    result: dict[str, Any] = {
        "requests": len(replies),
        "answered": len(answered),
        "distinct_outputs": distinct,
        "cached_tokens": cached,
        "prompt_tokens": [r.prompt_tokens for r in answered],
    }
    if not answered:
        result["summary"] = "no request was answered, nothing to compare"
        return result
    if distinct == 1:
        summary = f"{len(answered)} identical greedy requests gave identical outputs"
    else:
        summary = (
            f"{len(answered)} identical greedy requests gave {distinct} different outputs: temperature 0 "
            "is not determinism on this stack, so single runs are samples"
        )
    known = [c for c in cached if c is not None]
    if not known:
        summary += "; the stack reports no cached-prompt-token count"
        if stack == "vllm":
            summary += " (vLLM reports it with --enable-prompt-tokens-details)"
        elif stack == "sglang":
            summary += " (SGLang reports it with --enable-cache-report)"
        elif stack == "ollama":
            summary += " (Ollama always caches prompts and cannot turn it off per request)"
        elif stack == "llama-cpp-python":
            summary += " (llama-cpp-python caches prompts only when launched with --cache, and never says so)"
    elif len(set(known)) > 1:
        summary += (
            f"; cached prompt tokens differ between identical requests ({', '.join(map(str, cached))}): "
            "the prompt cache is reused, which can change greedy outputs"
        )
        if stack == "llamacpp":
            summary += " (llama.cpp: send `cache_prompt: false` for reproducible runs)"
    else:
        summary += f"; cached prompt tokens: {', '.join(map(str, cached))}"
    result["summary"] = summary
    result["differ"] = distinct > 1
    return result


async def _template_finding(lp: LocalProxy, fp: Fingerprint, model: str) -> TemplateFinding | None:
    if fp.stack == "ollama" and fp.chat_template:
        return check_ollama_template(fp.chat_template, fp.version)
    if fp.stack == "llamacpp":
        probe = await lp.post(
            "/apply-template",
            {"model": model, "messages": TOOL_MESSAGES, "tools": TOOLS},
            run="doctor",
            item="apply-template",
        )
        prompt = None
        if probe.reply.status == 200:
            try:
                prompt = orjson.loads(probe.reply.body).get("prompt")
            except (orjson.JSONDecodeError, AttributeError):
                prompt = None
        if isinstance(prompt, str):
            return check_rendered_prompt(prompt, WEATHER_TOOL["function"]["name"])
        return TemplateFinding(
            False,
            f"llama.cpp could not render the tools with its template: HTTP "
            f"{probe.reply.status} {_quote(probe.reply.error_text)}",
        )
    return None


# The agent protocols besides chat: (name, path, a tiny streamed request, who needs it).
PROTOCOLS = (
    (
        "Responses",
        "/v1/responses",
        lambda m: {"model": m, "input": CONTROL_MESSAGES[0]["content"], "max_output_tokens": 16, "stream": True},
        "openai-agents, pydantic-ai's openai: models",
        "responses",
    ),
    (
        "Messages",
        "/v1/messages",
        lambda m: {"model": m, "messages": CONTROL_MESSAGES, "max_tokens": 16, "stream": True},
        "the anthropic SDK, Claude-Code-style clients",
        "messages",
    ),
)


def judge_protocol(name: str, reply: ProbeReply, clients: str, bridge: str) -> dict[str, Any]:
    """Whether the upstream serves an agent protocol, and what its users should know. Pure."""
    if reply.transport_failed:
        return {"served": None, "summary": f"could not be probed ({reply.error_text})"}
    if reply.status in (404, 405):
        return {
            "served": False,
            "summary": f"not served (HTTP {reply.status}); {clients} need "
            f"`toolproxy serve --bridge {bridge}` in front of this server",
        }
    if reply.refused:
        return {"served": None, "summary": f"answered HTTP {reply.status}: {_quote(reply.error_text)}"}
    note = ""
    if name == "Responses" and _lacks_output_index(reply.body):
        note = (
            "; its stream events carry no output_index, so the openai SDK's responses.stream() helper fails on them "
            "(iterating responses.create(stream=True) works)"
        )
    return {"served": True, "summary": "served" + note}


def _lacks_output_index(body: bytes) -> bool:
    framer = SSEFramer()
    events = framer.feed(body) + framer.close()
    for _, payload in events:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("type") in (
            "response.output_item.added",
            "response.output_text.delta",
        ):
            return "output_index" not in event
    return False


@dataclass(slots=True)
class Diagnosis:
    upstream: str
    model: str | None  # None until the server named the one it serves (no --model)
    fingerprint: dict[str, Any]
    verdict: Verdict
    repeat: dict[str, Any] | None = None
    template: dict[str, Any] | None = None
    protocols: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    model_from_server: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fingerprint"].pop("chat_template", None)
        d["exit_code"] = self.verdict.exit_code
        return d


async def diagnose(
    upstream: str,
    model: str,
    data_dir: Path,
    *,
    upstream_key: str | None = None,
    repeat: int = 3,
    timeout: float = 300.0,
) -> Diagnosis:
    diag = Diagnosis(upstream, model, {}, Verdict([], False, None, EXIT_USAGE))
    async for _ in diagnosis_stages(diag, data_dir, upstream_key=upstream_key, repeat=repeat, timeout=timeout):
        pass
    return diag


def _which_model(fp: Fingerprint) -> str:
    """What to pass as --model when the server does not serve exactly one."""
    if fp.models:
        return (
            f"{_stack_says(fp)} serves {len(fp.models)} models: pass --model, one of: "
            f"{', '.join(fp.models[:10])}{', ...' if len(fp.models) > 10 else ''}"
        )
    return (
        f"{_stack_says(fp)} lists no model (GET /v1/models): pass --model with the name its API expects "
        "(any name will do on a server that serves one model whatever it is asked for)"
    )


async def diagnosis_stages(
    diag: Diagnosis, data_dir: Path, *, upstream_key: str | None = None, repeat: int = 3, timeout: float = 300.0
) -> AsyncIterator[tuple[str, str | None]]:
    """Fill `diag` one probe at a time, yielding (the stage just filled, what is awaited next) after
    each, so the command can say each check as it completes: on a CPU model the whole walk takes
    a minute, and a silent minute looks hung."""
    upstream, model = diag.upstream, diag.model
    yield "start", "the stack's fingerprint"
    async with local_proxy(upstream, data_dir, "doctor", upstream_key=upstream_key, timeout=timeout) as lp:
        if model is None:
            served = await lp.fingerprint(None)
            if served.stack != "unreachable" and len(served.models) != 1:
                diag.fingerprint = served.to_dict()
                diag.verdict.problem = _which_model(served)
                yield "fingerprint", None
                yield "verdict", None
                return
            if served.models:
                diag.model = model = served.models[0]
                diag.model_from_server = True
        fp = await lp.fingerprint(model)
        diag.fingerprint = fp.to_dict()
        if fp.stack == "unreachable":
            diag.verdict.problem, diag.verdict.problem_detail = fp.error, fp.error_detail
            yield "verdict", None
            return
        if fp.model_listed is False:
            diag.warnings.append(
                f"model {model!r} is not in the server's model list ({', '.join(fp.models[:10]) or 'empty'})"
            )
        yield "fingerprint", "the request without tools, then the one with tools"
        control = await lp.post(
            "/v1/chat/completions", chat_body(model, CONTROL_MESSAGES, max_tokens=16), run="doctor", item="control"
        )
        body = chat_body(model, TOOL_MESSAGES, TOOLS)
        first = await lp.post("/v1/chat/completions", body, run="doctor", item="tools", episode="1")
        diag.verdict = judge(fp, control.reply, first.reply)
        if diag.verdict.exit_code == EXIT_USAGE:
            yield "verdict", None
            return
        yield "verdict", f"{repeat - 1} repeated request(s)" if repeat > 1 else "the tool rendering check"
        if repeat > 1:
            if first.reply.refused:
                body, replies = chat_body(model, CONTROL_MESSAGES, max_tokens=16), [control.reply]
            else:
                replies = [first.reply]
            for i in range(2, repeat + 1):
                replies.append(
                    (await lp.post("/v1/chat/completions", body, run="doctor", item="repeat", episode=str(i))).reply
                )
            diag.repeat = judge_repeats(replies, fp.stack)
            diag.repeat["request"] = (
                "the request with tools" if "tools" in body else "the request without tools, since tools are refused"
            )
            yield "repeat", "the tool rendering check"
        finding = await _template_finding(lp, fp, model)
        if finding is not None:
            diag.template = {**asdict(finding), "source": fp.chat_template_source}
        yield "template", f"the {PROTOCOLS[0][0]} protocol"
        diag.protocols = {}
        for i, (name, path, body_for, clients, bridge) in enumerate(PROTOCOLS):
            probe = await lp.post(path, body_for(model), run="doctor", item=bridge)
            diag.protocols[name] = {"path": path, **judge_protocol(name, probe.reply, clients, bridge)}
            yield f"protocol:{name}", f"the {PROTOCOLS[i + 1][0]} protocol" if i + 1 < len(PROTOCOLS) else None
    yield "done", None


_MARK = {"pass": "ok", "fail": "FAIL", "skipped": "--"}


def _capabilities_line(fp: dict[str, Any], v: Verdict) -> str:
    """What the stack advertises for the model, said after the probes: a launch that refuses
    tools (llama-server --no-jinja) still advertises the chat template's `tools`."""
    caps = fp["capabilities"]
    refused = bool(v.steps) and v.steps[0].status == "fail" and "error" in v.steps[0].evidence
    if caps is None:
        text = "not advertised"
    else:
        text = (
            ", ".join(
                f"{c} (advertised, but refused by this launch: see 1.)" if c == "tools" and refused else c for c in caps
            )
            or "none"
        )
    tmpl = fp["chat_template_source"] or "not exposed"
    return f"model capabilities: {text}; chat template: {tmpl}"


def render(diag: Diagnosis) -> str:
    """The whole diagnosis, as `doctor` prints it stage by stage."""
    stages = ["start"]
    if diag.fingerprint.get("stack") != "unreachable":
        stages.append("fingerprint")
    stages.append("verdict")
    if not diag.verdict.problem:
        stages += ["repeat", "template", *(f"protocol:{name}" for name in diag.protocols or {}), "done"]
    return "\n".join(line for stage in stages for line in render_stage(diag, stage))


def render_stage(diag: Diagnosis, stage: str) -> list[str]:
    """The lines one stage of `diagnosis_stages` adds; `render` is all of them in order."""
    fp, v = diag.fingerprint, diag.verdict
    if stage == "start":
        return [
            f"toolproxy doctor: {diag.upstream}"
            + (f", model {diag.model}" if diag.model and not diag.model_from_server else "")
        ]
    if stage == "fingerprint":
        ev = f" ({'; '.join(fp['evidence'])})" if fp["evidence"] else ""
        label = Fingerprint(**fp).label
        chosen = (
            [f"model: {diag.model}, the one the server serves (--model to ask for another)"]
            if diag.model_from_server
            else []
        )
        return [
            f"stack: {label}{' build ' + fp['build'] if fp['build'] and fp['build'] != fp['version'] else ''}{ev}",
            *chosen,
            *(f"warning: {w}" for w in diag.warnings),
        ]
    if stage == "verdict":
        lines = (
            [] if fp.get("stack", "unreachable") == "unreachable" or diag.model is None else [_capabilities_line(fp, v)]
        )
        if v.problem:
            return [*lines, with_detail(f"cannot diagnose: {v.problem}", v.problem_detail)]
        lines.append("")
        for step in v.steps:
            lines.append(f"{step.number}. {step.title}: [{_MARK[step.status]}] {step.summary}")
            if step.fix:
                lines.append(f"   Fix: {step.fix}")
        return lines
    if stage == "repeat":
        return [] if diag.repeat is None else [f"Repeat ({diag.repeat['request']}): {diag.repeat['summary']}."]
    if stage == "template":
        t = diag.template
        if t is None:
            return []
        return [
            f"Tool rendering ({t['source'] or 'template'}): {'ok' if t['ok'] else 'WARNING'}: {t['summary']}"
            + (f" [{t['evidence']}]" if t["evidence"] and not t["ok"] else "")
        ]
    if stage.startswith("protocol:"):
        name = stage.partition(":")[2]
        found = diag.protocols[name]
        return [f"Agent protocol {name} ({found['path']}): {found['summary']}"]
    if v.native_ok:
        return ["", "Verdict: tools work natively."]
    where = {
        "serving_layer": "the serving layer",
        "parser": "the serving layer's tool-call parsing",
        "model": "the model",
    }[v.at_fault]
    return ["", f"Verdict: tools do NOT work natively; at fault: {where}."]


@click.command()
@click.option(
    "--upstream",
    required=True,
    help="Model server root, e.g. http://127.0.0.1:11434 (Ollama), http://127.0.0.1:8080 (llama.cpp).",
)
@click.option(
    "--model", default=None, help="Model name as the server knows it (default: the one it serves, when it lists one)."
)
@upstream_key_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of prose.")
@click.option(
    "--data",
    "data_dir",
    default=DOCTOR_DATA,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the probes are recorded (run 'doctor'): a directory of their own by default, so they stay out "
    "of the report of your runs in toolproxy-data.",
)
@click.option(
    "--repeat",
    default=3,
    show_default=True,
    type=click.IntRange(0, 50),
    help="Identical greedy requests to compare (0 or 1: skip).",
)
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=float,
    help="Seconds to wait for one response (CPU models are slow).",
)
def doctor(upstream, model, upstream_key_env, as_json, data_dir, repeat, timeout):
    """Say which layer is at fault when tool calls do not work, and what to change.

    Exit status: 0 tools work natively, 1 they do not (the output names the layer), 2 usage or
    transport error (e.g. the server is down).
    """
    key = key_from_env(upstream_key_env, "--upstream-key-env")
    check_target(upstream, data_dir)
    diag = Diagnosis(upstream, model, {}, Verdict([], False, None, EXIT_USAGE))
    stages = diagnosis_stages(diag, data_dir, upstream_key=key, repeat=repeat, timeout=timeout)
    asyncio.run(_say_as_it_goes(diag, stages, None if as_json else sys.stdout))
    if as_json:
        click.echo(printable(orjson.dumps(diag.to_dict(), option=orjson.OPT_INDENT_2).decode(), lines=True))
    sys.exit(diag.verdict.exit_code)


async def _say_as_it_goes(diag: Diagnosis, stages: AsyncIterator[tuple[str, str | None]], out) -> None:
    """Print each stage's lines on `out` (None: print nothing, the JSON comes at the end) as it
    completes, and on a terminal what is awaited meanwhile and for how long."""
    progress = Progress("doctor")
    awaited, since = None, time.monotonic()

    async def tick() -> None:
        while True:
            if awaited:
                progress.show(f"doctor: waiting for {awaited} ({duration(time.monotonic() - since)})")
            await asyncio.sleep(1.0)

    ticker = asyncio.create_task(tick())
    try:
        async for stage, awaited in stages:  # noqa: B007 (tick() reads it)
            since = time.monotonic()
            progress.clear()
            if out is not None:
                for line in render_stage(diag, stage):
                    click.echo(printable(line, lines=True), file=out)
    finally:
        ticker.cancel()
        progress.clear()
