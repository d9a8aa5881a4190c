"""A stand-in for a coding agent under `toolproxy run`: it finds its endpoint exactly where the
agent does (the same variables, the same config files, the same checks) and sends one request in
the agent's protocol, the agent's own captured request where one is committed. It exits as the
agent would when what run set is not enough (Gemini CLI's 41 for a base URL without the API-key
auth), and prints what it sent to.

    python tests/agentstandin.py AGENT
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import urllib.request
from pathlib import Path

DATA = Path(__file__).parent / "data"
TOOL = {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}


def post(url: str, body: dict, headers: dict) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
    print(url)


def captured(path: str) -> dict:
    """The request body the agent sent in a committed capture, by the path it was sent to."""
    from toolproxy.record.segments import read_records

    for folder in sorted((DATA / "agents" / "emulated").glob("*/segments")):
        for rec in read_records(folder.parent):
            if rec.get("kind") == "exchange" and rec.get("client_path", "").endswith(path):
                return json.loads(rec["request_body"])
    raise SystemExit(f"no captured request to {path}")


def chat(base: str, model: str, key: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "create hello.txt"}], "tools": [TOOL]}
    post(base.rstrip("/") + "/chat/completions", body, {"Authorization": f"Bearer {key}"})


def main(agent: str) -> None:
    env = os.environ
    if agent == "claude-code":  # ANTHROPIC_BASE_URL + /v1/messages?beta=true, its model variables
        body = {"model": env["ANTHROPIC_MODEL"], "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
        post(env["ANTHROPIC_BASE_URL"] + "/v1/messages?beta=true", body, {"x-api-key": env["ANTHROPIC_API_KEY"]})
    elif agent == "codex":  # $CODEX_HOME/config.toml: the selected provider's base_url and env_key
        config = tomllib.loads((Path(env["CODEX_HOME"]) / "config.toml").read_text())
        provider = config["model_providers"][config["model_provider"]]
        assert provider["wire_api"] == "responses"
        lines = (DATA / "websocket" / "codex-0.171.0-client.jsonl").read_text().splitlines()
        body = {k: v for k, v in json.loads(lines[1]).items() if k not in ("type", "previous_response_id")}
        body["model"] = config["model"]
        post(provider["base_url"] + "/responses", body, {"Authorization": f"Bearer {env[provider['env_key']]}"})
    elif agent == "gemini-cli":  # GOOGLE_GEMINI_BASE_URL; without the API-key auth in settings: exit 41
        home = Path(env.get("GEMINI_CLI_HOME") or env["HOME"])
        settings = json.loads((home / ".gemini" / "settings.json").read_text())
        if settings.get("security", {}).get("auth", {}).get("selectedType") != "gemini-api-key":
            print("Invalid auth method selected.", file=sys.stderr)
            sys.exit(41)
        body = captured(":streamGenerateContent?alt=sse")
        url = env["GOOGLE_GEMINI_BASE_URL"] + "/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse"
        post(url, body, {"x-goog-api-key": env["GEMINI_API_KEY"]})
    elif agent == "qwen-code":  # OPENAI_*, and the openai auth in the system settings file
        settings = json.loads(Path(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
        assert settings["security"]["auth"]["selectedType"] == "openai"
        chat(env["OPENAI_BASE_URL"], env["OPENAI_MODEL"], env["OPENAI_API_KEY"])
    elif agent == "opencode":  # OPENCODE_CONFIG: `model` names provider/model, the provider its baseURL
        config = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())
        provider, model = config["model"].split("/", 1)
        options = config["provider"][provider]["options"]
        chat(options["baseURL"], model, options["apiKey"])
    elif agent == "aider":  # litellm's openai/ provider: OPENAI_API_BASE; the model from AIDER_MODEL
        chat(env["OPENAI_API_BASE"], env["AIDER_MODEL"].removeprefix("openai/"), env["OPENAI_API_KEY"])
    elif agent == "mini-swe-agent":  # litellm again, the model from MSWEA_MODEL_NAME
        chat(env["OPENAI_API_BASE"], env["MSWEA_MODEL_NAME"].removeprefix("openai/"), env["OPENAI_API_KEY"])
    else:
        raise SystemExit(f"unknown agent {agent}")


if __name__ == "__main__":
    main(sys.argv[1])
