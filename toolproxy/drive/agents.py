"""Coding agents, and how each is pointed at a proxy the way it reads its endpoint.

The common SDK variables (toolproxy.drive.harness) reach harnesses built on an SDK; a coding agent
reads its endpoint from its own variables or its own config files. This table says, per agent,
what `toolproxy run` sets: variables, and where an agent only reads a file, a temporary one it is
told to use by a variable (a system settings file, a config home, a config file), written under
the run's data folder (`DATA/agents/<agent>/`, kept: it shows what the agent was told, and the
session files an agent writes there are its own record of the run). The user's own config is
never edited; a variable the user already set wins over the table's.

The knowledge behind each entry (what the agent sends, where it looks) is the agent's own source,
as observed with the pinned versions in docs/recipes; the test rig for coding agents
(tests/data/agents) points each agent at its proxy with this same table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from toolproxy import wire
from toolproxy.drive.harness import PLACEHOLDER

# The folder under the run's data folder where each agent's temporary files go.
AGENTS_DIR = "agents"
# The model name an agent asks for when neither the user nor the upstream says one.
DEFAULT_MODEL = "local"


@dataclass(frozen=True)
class Pointing:
    """What one run of an agent is told: where the proxy is (`base`, the tagged proxy root), the
    model to ask for, the folder for its temporary files, and the user's environment."""

    base: str
    model: str
    folder: Path
    environ: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentSetup:
    """Variables to add, and files to write first ({path: text})."""

    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CodingAgent:
    name: str
    title: str
    commands: tuple[str, ...]  # executable names it is started by
    protocol: str  # the wire family it speaks
    package: str  # where it comes from (registry: name)
    reads: str  # how it is pointed at an endpoint, in words
    setup: Callable[[Pointing], AgentSetup]

    def apply(self, pointing: Pointing) -> dict[str, str]:
        """Write the agent's files and return the variables to add (the user's own win)."""
        made = self.setup(pointing)
        for path, text in made.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return {k: v for k, v in made.env.items() if k not in pointing.environ}


def _claude(p: Pointing) -> AgentSetup:
    env = {"ANTHROPIC_BASE_URL": p.base, "ANTHROPIC_API_KEY": PLACEHOLDER}
    for name in ("MODEL", "SMALL_FAST_MODEL", "DEFAULT_HAIKU_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_OPUS_MODEL"):
        env[f"ANTHROPIC_{name}"] = p.model
    env.update(DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1")
    return AgentSetup(env)


# Codex's key variable for the provider run defines (its value: the placeholder, or the user's).
CODEX_KEY = "TOOLPROXY_CODEX_KEY"


def _codex(p: Pointing) -> AgentSetup:
    home = p.folder / "codex-home"
    config = f"""# written by toolproxy run: Codex's provider pointed at the proxy
model_provider = "toolproxy"
model = {json.dumps(p.model)}
check_for_update_on_startup = false

[model_providers.toolproxy]
name = "toolproxy"
base_url = {json.dumps(p.base + "/v1")}
wire_api = "responses"
env_key = "{CODEX_KEY}"

[analytics]
enabled = false

[otel]
exporter = "none"
"""
    return AgentSetup({"CODEX_HOME": str(home), CODEX_KEY: PLACEHOLDER}, {home / "config.toml": config})


def _settings(auth: str, mine: dict | None = None) -> str:
    """A Gemini CLI (or Qwen Code) settings file: the auth type, nothing sent home, over `mine`
    (the user's own settings, when they are copied)."""
    doc = dict(mine or {})
    for key, value in (
        ("security", {"auth": {"selectedType": auth}}),
        ("privacy", {"usageStatisticsEnabled": False}),
        ("telemetry", {"enabled": False}),
        ("general", {"enableAutoUpdate": False}),
    ):
        section = doc.get(key) if isinstance(doc.get(key), dict) else {}
        inner = {k: v for k, v in value.items() if not isinstance(v, dict)}
        nested = {
            k: {**(section.get(k) if isinstance(section.get(k), dict) else {}), **v}
            for k, v in value.items()
            if isinstance(v, dict)
        }
        doc[key] = {**section, **inner, **nested}
    return json.dumps(doc, indent=2) + "\n"


def _json_file(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _gemini(p: Pointing) -> AgentSetup:
    # GOOGLE_GEMINI_BASE_URL alone selects Gemini CLI's "gateway" auth, which it refuses (exit 41):
    # the API-key auth must be selected in settings. A system settings file would do, but Gemini CLI
    # ignores one under a folder others may write to (/tmp), so it gets a home of its own
    # (GEMINI_CLI_HOME) whose settings are the user's own with the auth set, and the user's folder
    # trust decisions.
    home = p.folder / "home"
    user = Path(p.environ.get("GEMINI_CLI_HOME") or p.environ.get("HOME") or os.path.expanduser("~")) / ".gemini"
    files = {home / ".gemini" / "settings.json": _settings("gemini-api-key", _json_file(user / "settings.json"))}
    trusted = user / "trustedFolders.json"
    if trusted.is_file():
        files[home / ".gemini" / "trustedFolders.json"] = trusted.read_text(encoding="utf-8")
    env = {"GOOGLE_GEMINI_BASE_URL": p.base, "GEMINI_API_KEY": PLACEHOLDER, "GEMINI_CLI_HOME": str(home)}
    return AgentSetup(env, files)


def _qwen(p: Pointing) -> AgentSetup:
    settings = p.folder / "system-settings.json"
    env = {"OPENAI_BASE_URL": p.base + "/v1", "OPENAI_API_KEY": PLACEHOLDER, "OPENAI_MODEL": p.model}
    env["QWEN_CODE_SYSTEM_SETTINGS_PATH"] = str(settings)
    return AgentSetup(env, {settings: _settings("openai")})


def _opencode(p: Pointing) -> AgentSetup:
    config = p.folder / "opencode.json"
    doc = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "toolproxy": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "toolproxy",
                "options": {"baseURL": p.base + "/v1", "apiKey": PLACEHOLDER},
                "models": {p.model: {"name": p.model}},
            }
        },
        "model": f"toolproxy/{p.model}",
        "small_model": f"toolproxy/{p.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    env = {"OPENCODE_CONFIG": str(config), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1"}
    env["OPENCODE_DISABLE_MODELS_FETCH"] = "1"  # its model list comes from the internet otherwise
    return AgentSetup(env, {config: json.dumps(doc, indent=2) + "\n"})


def _aider(p: Pointing) -> AgentSetup:
    env = {"OPENAI_API_BASE": p.base + "/v1", "OPENAI_API_KEY": PLACEHOLDER, "AIDER_MODEL": f"openai/{p.model}"}
    env.update(AIDER_CHECK_UPDATE="false", AIDER_ANALYTICS="false", AIDER_SHOW_MODEL_WARNINGS="false")
    return AgentSetup(env)


def _mini(p: Pointing) -> AgentSetup:
    env = {"OPENAI_API_BASE": p.base + "/v1", "OPENAI_API_KEY": PLACEHOLDER, "MSWEA_MODEL_NAME": f"openai/{p.model}"}
    return AgentSetup(env)


AGENTS = {
    a.name: a
    for a in (
        CodingAgent(
            "claude-code",
            "Claude Code",
            ("claude",),
            wire.MESSAGES,
            "npm: @anthropic-ai/claude-code",
            "ANTHROPIC_BASE_URL and its model variables (ANTHROPIC_MODEL, ANTHROPIC_SMALL_FAST_MODEL, "
            "ANTHROPIC_DEFAULT_{HAIKU,SONNET,OPUS}_MODEL)",
            _claude,
        ),
        CodingAgent(
            "codex",
            "Codex CLI",
            ("codex",),
            wire.RESPONSES,
            "npm: @openai/codex",
            "a provider in $CODEX_HOME/config.toml: its built-in provider ignores OPENAI_BASE_URL, so run makes "
            "a CODEX_HOME of its own whose provider `toolproxy` points at the proxy",
            _codex,
        ),
        CodingAgent(
            "gemini-cli",
            "Gemini CLI",
            ("gemini",),
            wire.GEMINI,
            "npm: @google/gemini-cli",
            "GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY, and the API-key auth in the settings of a home of its own "
            "(GEMINI_CLI_HOME: the user's settings and folder trust copied)",
            _gemini,
        ),
        CodingAgent(
            "qwen-code",
            "Qwen Code",
            ("qwen",),
            wire.CHAT,
            "npm: @qwen-code/qwen-code",
            "OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL, and the openai auth in a system settings file named "
            "by QWEN_CODE_SYSTEM_SETTINGS_PATH",
            _qwen,
        ),
        CodingAgent(
            "opencode",
            "opencode",
            ("opencode",),
            wire.CHAT,
            "npm: opencode-ai",
            "a config file named by OPENCODE_CONFIG (merged over the user's) with a provider `toolproxy` "
            "(@ai-sdk/openai-compatible) and its model",
            _opencode,
        ),
        CodingAgent(
            "aider",
            "aider",
            ("aider",),
            wire.CHAT,
            "PyPI: aider-chat",
            "OPENAI_API_BASE and AIDER_MODEL=openai/MODEL",
            _aider,
        ),
        CodingAgent(
            "mini-swe-agent",
            "mini-swe-agent",
            ("mini", "mini-swe-agent"),
            wire.CHAT,
            "PyPI: mini-swe-agent",
            "OPENAI_API_BASE (litellm) and MSWEA_MODEL_NAME=openai/MODEL",
            _mini,
        ),
    )
}


def agent_of(argv: list[str]) -> CodingAgent | None:
    """The coding agent a command starts, by its executable's name (through `npx NAME`, `uvx
    NAME`, `env ... NAME`), or None."""
    words = list(argv)
    while words and (os.path.basename(words[0]) in ("npx", "uvx", "env") or "=" in words[0]):
        words = words[1:]
        while words and words[0].startswith("-"):
            words = words[1:]
    if not words:
        return None
    exe = os.path.basename(words[0])
    return next((a for a in AGENTS.values() if exe in a.commands or exe == a.name), None)
