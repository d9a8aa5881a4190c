"""docs/report.schema.json: current with the code, and a real `report --format json` validates against it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from toolproxy import emulators as fakes
from toolproxy.analysis.report.docschema import render

SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "report.schema.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_the_published_schema_is_the_one_the_code_gives():
    assert SCHEMA.read_text() == render(), (
        "regenerate: python -m toolproxy.analysis.report.docschema > docs/report.schema.json"
    )


def _post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_real_report_validates_and_a_stray_key_does_not(fake_stack, proxy, tmp_path):
    calling = fake_stack("llamacpp", responder=lambda req: fakes.call("get_weather", {"city": "Paris"}))
    refusing = fake_stack("no_jinja")
    data = tmp_path / "data"
    for fake, run in ((calling, "calls"), (refusing, "refused")):
        p = proxy(fake.url, "--quiet", data=data)
        for ep in range(3):
            body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
            _post(f"{p.url}/t/run={run}/episode={ep}/v1/chat/completions", body)
        p.stop()
    cli = [sys.executable, "-m", "toolproxy.cli"]
    assert subprocess.run([*cli, "analyze", "--data", str(data)], capture_output=True, timeout=300).returncode == 0
    out = subprocess.run(
        [*cli, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {r["run"] for r in doc["runs"]} == {"calls", "refused"}
    assert any(r["rejected"] for r in doc["runs"])  # null rates are in there too
    origins = {r["run"]: r["provenance"] for r in doc["runs"]}  # every run says what produced it
    assert origins["calls"]["tool_parser"] == "active (calls arrived as tool_calls)"
    assert origins["refused"]["why"].startswith("every turn refused") and origins["refused"]["stack"] == "llamacpp"
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    for where in (doc["runs"][0]["provenance"], doc["runs"][0]["call_fidelity"]):
        where["extra"] = 1  # a key the schema does not name
        with pytest.raises(jsonschema.ValidationError, match="'extra' was unexpected"):
            jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        del where["extra"]
