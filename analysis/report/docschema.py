"""The JSON report's shape (`report --format json`) as a JSON Schema, derived from its types.

Each run entry is typed from RunSummary's own fields (with the Rate of every metric) and the
return annotations of the properties jsondoc adds, by pydantic, so the schema follows the code.
`python -m toolproxy.analysis.report.docschema` prints it; docs/report.schema.json is that output,
and the tests check that it is current and that a real report validates against it. Every object
is closed (`additionalProperties: false`): a key the report gains must be added to the types.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, create_model

from toolproxy.analysis.measure.summary import RunSummary
from toolproxy.analysis.report.jsondoc import DERIVED
from toolproxy.analysis.report.provenance import Provenance

_PROVENANCE_DOC = (
    "What produced the run's numbers, read from the recording: the model served and requested, the stack, "
    "whose parser delivered the calls, the chat template, the sampling sent, cache hits, versions, and "
    "`why`, the layer that shaped the number."
)


def _fields(cls: type, derived: dict[str, Any]) -> dict[str, Any]:
    """A dataclass's fields by their annotations, plus what its JSON form derives (name -> type)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], ...) for f in dataclasses.fields(cls)} | {k: (t, ...) for k, t in derived.items()}


def _provenance_entry() -> type[BaseModel]:
    fields = _fields(Provenance, {"tool_parser": str, "served_differs": bool})
    return create_model("Provenance", __config__=ConfigDict(extra="forbid"), __doc__=_PROVENANCE_DOC, **fields)


def _run_entry() -> type[BaseModel]:
    derived = {name: typing.get_type_hints(getattr(RunSummary, name).fget)["return"] for name in DERIVED}
    fields = _fields(RunSummary, derived | {"provenance": _provenance_entry() | None})
    return create_model("Run", __config__=ConfigDict(extra="forbid"), __doc__=RunSummary.__doc__, **fields)


class Intervals(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pooled: Literal["wilson"]
    confidence: float


class Bootstrap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resamples: int
    seed: int
    confidence: float
    unit: Literal["episode"]
    min_episodes: int


def _document() -> type[BaseModel]:
    return create_model(
        "Report",
        __config__=ConfigDict(extra="forbid"),
        __doc__="What `toolproxy report --format json` prints: fractions, not percents; null when undefined.",
        toolproxy_version=(str, ...),
        generated_at=(str, ...),
        source=(str, ...),
        analyzer_version=(int | None, ...),
        analyzer_version_current=(int, ...),
        expect_rules=(list[str], ...),
        intervals=(Intervals, ...),
        bootstrap=(Bootstrap, ...),
        runs=(list[_run_entry()], ...),
    )


def _close(node: Any) -> None:
    """additionalProperties: false on every object schema (stdlib dataclasses do not say it)."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


def report_schema() -> dict:
    schema = TypeAdapter(_document()).json_schema()
    _close(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def render() -> str:
    return orjson.dumps(report_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"


if __name__ == "__main__":
    print(render(), end="")
