"""Reading generated text out of an upstream response as it arrives, whatever the API spoke.

A rewriting condition has to see the model's text to find calls in it, while still passing prose
on as soon as it is generated. This reader turns the upstream body, chunk by chunk, into text
deltas plus the end-of-generation facts (finish reason, usage), for each API a condition sends to:

| kind                | request                          | stream framing | text in                     |
|---------------------|----------------------------------|----------------|-----------------------------|
| openai_chat         | /v1/chat/completions             | SSE            | choices[0].delta.content    |
| openai_completion   | /v1/completions                  | SSE            | choices[0].text             |
| llamacpp_completion | llama.cpp /completion            | SSE            | content                     |
| ollama_chat         | Ollama /api/chat                 | NDJSON         | message.content             |
| ollama_generate     | Ollama /api/generate (raw)       | NDJSON         | response                    |

Non-streaming bodies are one JSON object of the same shape (`message` instead of `delta`).
"""

from __future__ import annotations

from typing import Any

import orjson

KINDS = ("openai_chat", "openai_completion", "llamacpp_completion", "ollama_chat", "ollama_generate")


def _usage_from_counts(prompt: Any, completion: Any) -> dict | None:
    if not isinstance(prompt, int) and not isinstance(completion, int):
        return None
    p, c = prompt or 0, completion or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class UpstreamReader:
    def __init__(self, kind: str, stream: bool) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown upstream kind {kind!r}")
        self.kind = kind
        self.stream = stream
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: str | None = None
        self.model: str | None = None
        self.decoded = False  # at least one object of the expected shape was read
        self._buf = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        if not self.stream:
            return []
        out = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line, self._buf = self._buf[:nl].strip(), self._buf[nl + 1:]
            out.extend(self._line(line))

    def close(self) -> list[str]:
        rest, self._buf = self._buf.strip(), b""
        if not rest:
            return []
        if self.stream:
            return self._line(rest)
        return self._object(rest)

    def _line(self, line: bytes) -> list[str]:
        if self.kind.startswith("ollama"):
            return self._object(line) if line else []
        if not line.startswith(b"data:"):
            return []  # SSE comments, `event:` lines and the blank separators
        data = line[5:].strip()
        if data == b"[DONE]":
            return []
        return self._object(data)

    def _object(self, raw: bytes) -> list[str]:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(obj, dict):
            return []
        if "error" in obj:
            err = obj["error"]
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return []
        self.model = obj.get("model") if isinstance(obj.get("model"), str) else self.model
        text = getattr(self, "_" + self.kind)(obj)
        return [text] if text else []

    def _choice(self, obj: dict) -> dict:
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return {}
        self.decoded = True
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        return choice

    def _openai_chat(self, obj: dict) -> str:
        choice = self._choice(obj)
        part = choice.get("delta") if self.stream else choice.get("message")
        content = part.get("content") if isinstance(part, dict) else None
        return content if isinstance(content, str) else ""

    def _openai_completion(self, obj: dict) -> str:
        text = self._choice(obj).get("text")
        return text if isinstance(text, str) else ""

    def _llamacpp_completion(self, obj: dict) -> str:
        if "content" not in obj:
            return ""
        self.decoded = True
        if obj.get("stop"):
            self.finish_reason = "length" if obj.get("stop_type") == "limit" else "stop"
            self.usage = _usage_from_counts(obj.get("tokens_evaluated"), obj.get("tokens_predicted")) or self.usage
        text = obj.get("content")
        return text if isinstance(text, str) else ""

    def _ollama_done(self, obj: dict) -> None:
        self.decoded = True
        if obj.get("done"):
            self.finish_reason = "length" if obj.get("done_reason") == "length" else "stop"
            self.usage = _usage_from_counts(obj.get("prompt_eval_count"), obj.get("eval_count")) or self.usage

    def _ollama_chat(self, obj: dict) -> str:
        message = obj.get("message")
        if not isinstance(message, dict):
            return ""
        self._ollama_done(obj)
        text = message.get("content")
        return text if isinstance(text, str) else ""

    def _ollama_generate(self, obj: dict) -> str:
        if "response" not in obj:
            return ""
        self._ollama_done(obj)
        text = obj.get("response")
        return text if isinstance(text, str) else ""
