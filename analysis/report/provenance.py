"""What produced a run's numbers: the model that served it, the stack and launch, what was sent.

A fidelity is a fact about a harness, a model, a stack and its launch together, and the harness's
own label names none of them reliably (a benchmark sends its own model name; llama-server serves
the one file it loaded whatever name it is sent). So each run gets a provenance read from the
recording itself: the model served (the stack's own description from the fingerprint, else the
reply's `model`), the one requested when that differs, the harness's when a study sent another,
the stack and version, whether the stack's tool parser delivered calls (as `tool_calls`) or left
them in text, the chat template's hash and whether it renders tools (llama.cpp's
`chat_template_caps`, Ollama's template), the sampling parameters the harness sent, prompt-cache
hits, the toolproxy and analyzer versions, and one "why this number" line naming the layer that
shaped it. A run recorded against `toolproxy playback` (every reply carries its
X-Toolproxy-Playback header) has its recording's provenance, marked as played: no stack ran, and
the calls it got are the recording's, parsed by whatever parsed them then.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import orjson

from toolproxy import __version__
from toolproxy.analysis.classify.outcomes import NON_RESPONSE_OWNER, SERVING, UNKNOWN, USER
from toolproxy.analysis.measure.summary import RunSummary, summarize
from toolproxy.analysis.store.connection import StoreError, bodies_in_sql
from toolproxy.analysis.store.state import stored_version
from toolproxy.playback.fixture import REPLY_HEADER
from toolproxy.stacks.catalog import LABELS, LLAMACPP_PYTHON
from toolproxy.stacks.templates import check_ollama_template

# Conditions under which toolproxy, not the stack, turns the model's text into calls.
REWRITING = ("text", "constrained", "template")
SAMPLING = ("temperature", "top_p", "top_k", "seed", "max_tokens", "max_completion_tokens", "num_predict")

# Per upstream, its latest fingerprint that got the stack's model list (a probe under load can time
# out on it), else its latest.
_FINGERPRINT_SQL = """
select upstream, arg_max(record, recorded_at) filter (where json_array_length(record, '$.extra.models') > 0),
       arg_max(record, recorded_at)
from fingerprints group by upstream
"""
_RUN_SQL = """
select run, mode(upstream), any_value(json_extract_string(record, '$.harness_model')),
       count(*) filter (where cached_tokens > 0), count(*),
       arg_min(segment, started_at), arg_min(segment_offset, started_at),
       arg_max(segment, started_at) filter (where status = 200), arg_max(segment_offset, started_at) filter (where
           status = 200)
from exchanges where is_attempt and run in (select unnest($runs::varchar[])) group by run
"""
# Calls the harness got as tool_calls, and calls left in text only (a condition's calls are found in
# the text and handed over as tool_calls: counted once, as delivered).
_CALLS_SQL = """
select e.run, count(*) filter (where c.format = 'tool_calls'),
       count(*) filter (where c.surface = 'text' and c.format <> 'tool_calls')
from calls c join exchanges e on e.id = c.exchange_id
where e.run in (select unnest($runs::varchar[])) group by e.run
"""


@dataclass(frozen=True)
class Provenance:
    run: str
    condition: str | None
    stack: str | None
    stack_version: str | None
    served_model: str | None
    served_from: str | None  # where the served model's name was read
    requested_model: str | None
    harness_model: str | None  # what the harness named, when the study sent another
    tool_calls: int  # calls the harness got as structured calls
    text_calls: int  # calls found only in the reply text
    template_hash: str | None
    template_source: str | None
    renders_tools: bool | None
    template_note: str | None
    sampling: dict = field(default_factory=dict)
    cache_hits: int = 0
    attempts: int = 0
    toolproxy_version: str = __version__
    analyzer_version: int | None = None
    why: str = ""
    played_from: str | None = None  # the recorded run a playback answered this one from

    @property
    def served_differs(self) -> bool:
        return bool(
            self.served_model
            and self.requested_model
            and _stem(self.requested_model) not in _stem(self.served_model)
            and _stem(self.served_model) not in _stem(self.requested_model)
        )

    def as_dict(self) -> dict:
        """The JSON form: every field, plus the two readings of them a consumer should not redo."""
        return {**dataclasses.asdict(self), "tool_parser": self.parser(), "served_differs": self.served_differs}

    @classmethod
    def from_dict(cls, doc: dict) -> Provenance:
        """Back from as_dict (a report's JSON), ignoring the readings and any key a later version adds."""
        return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})

    def parser(self) -> str:
        if self.condition in REWRITING:
            return f"toolproxy's, under the {self.condition} condition (the stack saw no tools)"
        if self.tool_calls and not self.text_calls:
            return "active (calls arrived as tool_calls)"
        if self.text_calls and not self.tool_calls:
            return "none seen (calls arrived only as text)"
        if self.tool_calls:
            return f"partly ({self.tool_calls} as tool_calls, {self.text_calls} only as text)"
        return "not seen (no call to parse)"

    def lines(self, bold: str = "**") -> list[str]:
        """The list entry (markdown, or plain text with bold=""): the facts, then the "why this number" line."""
        return [f"- {bold}{self.run}{bold}: {self.facts()}", f"  Why this number: {self.why}"]

    def facts(self) -> str:
        stack = LABELS.get(self.stack or "", self.stack or "an unidentified stack")
        model = self.served_model or "unknown"
        if self.served_from:
            model += f" ({self.served_from})"
        if self.served_differs:
            model += f"; requested {self.requested_model}"
        if self.harness_model:
            model += f"; the harness named {self.harness_model}"
        template = "not exposed"
        if self.template_hash:
            template = f"sha256 {self.template_hash} ({self.template_source})"
            if self.renders_tools is not None:
                template += "; renders tools" if self.renders_tools else "; renders NO tools"
            if self.template_note:
                template += f"; {self.template_note}"
        sent = ", ".join(f"{k}={v}" for k, v in self.sampling.items()) or "none (the stack's defaults)"
        return (
            (f"played back from {self.played_from}'s recording, whose facts these are: " if self.played_from else "")
            + f"served {model}; stack {stack}{' ' + self.stack_version if self.stack_version else ''}; "
            f"tool parser {self.parser()}; chat template {template}; sampling sent {sent}; prompt cache hit on "
            f"{self.cache_hits} of {self.attempts} attempts; toolproxy {self.toolproxy_version}, analyzer "
            f"v{self.analyzer_version}."
        )


def _stem(name: str) -> str:
    """A model name without its path, file extension and case: a GGUF path and a tag compare."""
    base = name.rsplit("/", 1)[-1].lower()
    return re.sub(r"\.gguf$", "", base)


def _json(text: str | None) -> dict:
    try:
        value = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _reply_model(body: str | None) -> str | None:
    """The `model` a reply names: a JSON body's, or the first SSE or NDJSON event's that has one."""
    if not body:
        return None
    whole = _json(body)
    if isinstance(whole.get("model"), str):
        return whole["model"]
    for line in body.splitlines()[:50]:
        event = _json(line.removeprefix("data: ").strip())
        if isinstance(event.get("model"), str):
            return event["model"]
    return None


def _served(fp: dict, reply_model: str | None) -> tuple[str | None, str | None]:
    details = fp.get("details") or {}
    if isinstance(details.get("model_path"), str):
        return details["model_path"].rsplit("/", 1)[-1], "the stack's model_path"
    if reply_model:
        return reply_model, "the reply's model field"
    return None, None


def _template(fp: dict) -> tuple[str | None, str | None, bool | None, str | None]:
    template = fp.get("chat_template")
    if not isinstance(template, str) or not template:
        return None, None, None, None
    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    caps = (fp.get("details") or {}).get("chat_template_caps") or {}
    renders = caps.get("supports_tools") if isinstance(caps.get("supports_tools"), bool) else None
    if renders is None and isinstance(fp.get("capabilities"), list):
        renders = "tools" in fp["capabilities"]
    note = None
    if fp.get("stack") == "ollama":
        finding = check_ollama_template(template, fp.get("version"))
        note = finding.summary if finding is not None and not finding.ok else None
    return digest, fp.get("chat_template_source"), renders, note


def _why(s: RunSummary, p: Provenance) -> str:
    if s.turns == 0:
        return "nothing was classified in this run."
    if s.rejected:
        cause = "; ".join(f"{k}: {v}" for k, v in s.non_response_causes.items()) or ", ".join(s.non_response_kinds)
        owners = {NON_RESPONSE_OWNER.get(k, UNKNOWN) for k, n in s.non_response_kinds.items() if n}
        if owners == {USER}:
            return f"every turn was cut by the user's interrupt before any output arrived ({cause})."
        if owners != {SERVING}:
            return f"no turn got the model's output ({cause}); not all of it the serving layer's doing."
        return (
            f"every turn refused or failed by the serving layer before any output arrived ({cause}); the model "
            "never ran."
        )
    reasons = []
    if p.served_differs:
        reasons.append(
            f"the stack served {p.served_model}, not the requested {p.requested_model}: these are its numbers"
        )
    native = (s.condition or "native") in ("native", "hint")
    if p.renders_tools is False and native:
        reasons.append("the chat template in use renders no tools: they were dropped from the prompt")
    if p.stack == LLAMACPP_PYTHON.name and native and not p.tool_calls:
        reasons.append("llama-cpp-python's default chat handler drops tools unless tool_choice names one")
    lost = s.lost_in_serving
    if lost:
        reasons.append(
            f"calls left in text: no tool parser extracted them on this launch ({lost:.0%} of the due calls "
            "were valid but never reached the harness as calls)"
        )
    if s.condition in REWRITING and p.tool_calls:
        reasons.append(f"calls parsed and delivered by toolproxy's {s.condition} condition, not by the stack")
    if sum(s.non_response_kinds.values()):
        reasons.append(f"{sum(s.non_response_kinds.values())} of {s.turns} turns were non-responses")
    if not reasons:
        if s.delivered_fidelity.pooled is None:
            return "no turn was due a call."
        return (
            "the stack delivered the model's calls as tool_calls: the number is the model's"
            if p.tool_calls
            else "the serving layer did its part: the model made no valid call"
        )
    return "; ".join(reasons) + "."


# Per run, the playback header of its first few answered attempts that carry one.
_PLAYED_SQL = f"""
select run, response_headers::varchar from exchanges
where is_attempt and run in (select unnest($runs::varchar[]))
  and lower(response_headers::varchar) like '%{REPLY_HEADER.lower()}%'
qualify row_number() over (partition by run order by started_at) <= 5
"""


def played_from(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict[str, str]:
    """The runs that a playback answered, each with the recorded run that answered it: read from the
    header every played reply carries (the recorded exchange's id)."""
    found: dict[str, str] = {}
    for run, headers in con.execute(_PLAYED_SQL, {"runs": runs}).fetchall():
        if run in found:
            continue
        for pair in orjson.loads(headers) or []:
            if isinstance(pair, list) and len(pair) == 2 and str(pair[0]).lower() == REPLY_HEADER.lower():
                source = con.execute("select run from exchanges where id = ?", [pair[1]]).fetchone()
                if source and source[0] and source[0] != run:
                    found[run] = source[0]
    return found


def provenance(con: duckdb.DuckDBPyConnection, data_dir: Path, runs: list[RunSummary]) -> dict[str, Provenance]:
    """Each run's provenance, from the store and, for the sampling sent and the reply's model, the
    bodies of one exchange per run read back from its segment. A played run's is its recording's
    (summarised here, after every other use of this connection's scored turns)."""
    out = _provenance(con, data_dir, runs)
    played = played_from(con, list(out))
    if not played:
        return out
    sources = _provenance(con, data_dir, summarize(con, sorted(set(played.values())), "", resamples=1).runs)
    for run, source in played.items():
        if source in sources:
            recorded = sources[source]
            out[run] = dataclasses.replace(
                recorded,
                run=run,
                played_from=source,
                why=f"a playback of {source}'s recording: no stack ran, the replies are the ones it recorded, "
                f"so the number is what its provenance says: {recorded.why}",
            )
    return out


def _provenance(con: duckdb.DuckDBPyConnection, data_dir: Path, runs: list[RunSummary]) -> dict[str, Provenance]:
    names = [s.run for s in runs]
    fingerprints = {
        up: _json(with_model or any_fp).get("extra") or {}
        for up, with_model, any_fp in con.execute(_FINGERPRINT_SQL).fetchall()
    }
    facts = {r[0]: r[1:] for r in con.execute(_RUN_SQL, {"runs": names}).fetchall()}
    calls = {r[0]: r[1:] for r in con.execute(_CALLS_SQL, {"runs": names}).fetchall()}
    analyzer = stored_version(con)
    bodies = {}
    try:
        with bodies_in_sql(con, data_dir):
            for run, (_, _, _, _, seg_first, off_first, seg_ok, off_ok) in facts.items():
                first = con.execute("select bodies(?, ?)", [seg_first, off_first]).fetchone()[0] or {}
                last = con.execute("select bodies(?, ?)", [seg_ok, off_ok]).fetchone()[0] if seg_ok else {}
                bodies[run] = (first.get("request_body"), (last or {}).get("response_body"))
    except StoreError:
        pass  # a segment moved away: provenance without what only the bodies say
    out = {}
    for s in runs:
        upstream, harness_model, hits, attempts = (facts.get(s.run) or (None, None, 0, 0))[:4]
        fp = fingerprints.get(upstream) or {}
        request, reply = bodies.get(s.run, (None, None))
        sent = _json(request)
        served, source = _served(fp, _reply_model(reply))
        digest, template_source, renders, note = _template(fp)
        if digest and s.rejected and {k for k, n in s.non_response_kinds.items() if n} == {"refused"}:
            # llama-server --no-jinja reports the GGUF's template in /props and refuses every request with tools
            # before rendering it; a run that timed out or failed later may well have rendered it.
            note = "the stack reports it, but refused every turn: it rendered none of them"
        tool_calls, text_calls = calls.get(s.run, (0, 0))
        p = Provenance(
            # llama.cpp's build with its commit: a source build is numbered b1, only the commit says which one.
            run=s.run,
            condition=s.condition,
            stack=s.stack,
            stack_version=fp.get("build") or s.stack_version,
            served_model=served,
            served_from=source,
            requested_model=s.model,
            harness_model=harness_model if harness_model != s.model else None,
            tool_calls=int(tool_calls),
            text_calls=int(text_calls),
            template_hash=digest,
            template_source=template_source,
            renders_tools=renders,
            template_note=note,
            sampling={k: sent[k] for k in SAMPLING if k in sent},
            cache_hits=int(hits or 0),
            attempts=int(attempts or 0),
            analyzer_version=analyzer,
        )
        out[s.run] = Provenance(**{**p.__dict__, "why": _why(s, p)})
    return out
