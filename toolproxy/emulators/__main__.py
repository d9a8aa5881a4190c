"""`python -m toolproxy.emulators STACK --port 0`: serve one emulated stack on 127.0.0.1 from a shell."""

from __future__ import annotations

import argparse
import asyncio
import secrets

from toolproxy.emulators.faults import stall
from toolproxy.emulators.model import CALL_FORMATS, ModelRequest, ScriptedReply, agent_reply, call
from toolproxy.emulators.server import FakeStack
from toolproxy.proxy import serverlog
from toolproxy.proxy.headers import Redactor
from toolproxy.stacks import catalog


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m toolproxy.emulators",
        description="Serve an emulated LLM serving stack: it answers on the wire as the real stack does "
        "(status, body, headers, stream framing); its model is scripted.",
    )
    parser.add_argument("stack", choices=catalog.STACKS + ("no_jinja",))
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tool-parser", default=None, help="vLLM/SGLang --tool-call-parser (e.g. hermes)")
    parser.add_argument("--no-jinja", action="store_true", help="llama.cpp launched with --no-jinja")
    parser.add_argument(
        "--call-format",
        choices=list(CALL_FORMATS),
        default=None,
        help="how the scripted model writes calls the stack does not parse",
    )
    parser.add_argument(
        "--reply",
        choices=["text", "call", "agent"],
        default="text",
        help="text: the model answers with a greeting; call: it always calls the first offered tool with {}; "
        "agent: a correct agent's model, calling the first offered tool with arguments that fit its schema, "
        "then answering from the tool's result",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long the model takes before each reply (e.g. 2, to watch the live page while an agent runs)",
    )
    args = parser.parse_args(argv)

    def respond(req: ModelRequest) -> ScriptedReply | None:
        if args.reply == "agent":
            return agent_reply(req)
        return call(req.tools[0], {}) if args.reply == "call" and req.tools else None

    fake = FakeStack(
        args.stack,
        tool_parser=args.tool_parser,
        jinja=not args.no_jinja,
        call_format=args.call_format,
        responder=respond,
    )
    if args.delay > 0:
        fake.inject(stall(before=args.delay, times=None))  # toolproxy's fingerprint probes are never delayed
    # Its log lines as serve's: a request aiohttp refuses is one line, its keys never printed. The
    # key of the stand-ins is this process's own (it has no data directory).
    serverlog.install(Redactor(secrets.token_bytes(32)))

    async def serve() -> None:
        url = await fake.start(args.host, args.port)
        print(f"fake {fake.kind} listening on {url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await fake.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
