"""Emulated serving stacks: aiohttp apps that answer on the wire the way each real stack does.

Real stacks cannot run in CI or in `toolproxy demo`, yet what toolproxy measures is exactly how
they differ: who refuses `tools` with a 400, who leaves a call in `content`, whose error body is
flat or nested, who streams NDJSON instead of SSE. Each emulator reproduces one stack's observable
behaviour (status, body bytes, Content-Type, framing, metadata endpoints) as read from its source
(references beside each class), with the texts and versions of its `toolproxy.stacks.catalog`
entry; the *model* behind it is a script the caller writes.

Three layers, kept apart so a test can vary one without the others:

* the model (model.py): `ScriptedReply` values (`text`, `call`, `calls`, `text_call`, `broken_call`,
  `error`) queued with `FakeStack.enqueue` or produced by a responder given a `ModelRequest`;
* the stack: one module per stack (ollama.py, llamacpp.py, llamacpp_python.py, vllm.py, sglang.py, lmstudio.py,
  openai.py) on the shared `Emulator` base (base.py), turning a ScriptedReply into that stack's bytes;
* faults (faults.py): stall, close mid-stream, keep-alive comments before the first event, raw bodies,
  gzip, N failures, for the proxy's tests;
  calls lost only when streaming, for replay's.

`FakeStack` (server.py) serves one: `async with FakeStack("ollama").running() as url`, or
`python -m toolproxy.emulators ollama --port 0` from a shell.
"""

from toolproxy.emulators.faults import Fault, close_mid_stream, drops_streamed_calls, gzipped, keepalive, raw, stall
from toolproxy.emulators.model import (
    CALL_FORMATS,
    ModelRequest,
    ScriptedReply,
    ToolCall,
    broken_call,
    call,
    calls,
    error,
    render_calls,
    text,
    text_call,
)
from toolproxy.emulators.server import FakeStack, Seen, run_fake

__all__ = [
    "CALL_FORMATS",
    "FakeStack",
    "Fault",
    "ModelRequest",
    "ScriptedReply",
    "Seen",
    "ToolCall",
    "broken_call",
    "call",
    "calls",
    "close_mid_stream",
    "drops_streamed_calls",
    "error",
    "gzipped",
    "keepalive",
    "raw",
    "render_calls",
    "run_fake",
    "stall",
    "text",
    "text_call",
]
