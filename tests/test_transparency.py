"""Every command that starts a proxy forwards and records a request as `serve` does.

The same three requests (transparency_client: a gzip-encoded body, a header value with obs-text
bytes, a head trickled in pieces) go through `serve`, `run`, `study`, `replay`, `demo` and
`doctor`, each in front of one recording upstream that keeps the raw bytes it received. What
the upstream got and what was recorded must be serve's, byte for byte, field for field.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
from pathlib import Path

import orjson
import pytest
import transparency_client as client
from proxyprocess import ProxyProcess, toolproxy_cli

from toolproxy.record.segments import read_records

CASES = tuple(client.case_requests())
CLIENT_SCRIPT = str(Path(client.__file__).resolve())
REPLY = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
)
# Differ by command and by moment, not by how a request was handled: the run and its tags, the
# record's id and clock, and the client's Host (it names the proxy's port).
VOLATILE = {
    "id",
    "started_at",
    "ended_at",
    "run",
    "episode",
    "item",
    "tags",
    "client_path",
    "ttfb_ms",
    "duration_ms",
    "extra",
    "condition",
}


class RecordingUpstream:
    """An HTTP/1.1 upstream on 127.0.0.1 that keeps each request's raw head and body, by case, and
    answers every POST with one chat completion (anything else, the fingerprint's probes, 404)."""

    def __init__(self) -> None:
        self.received: dict[str, list[bytes]] = {}
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.url = ""
        ready = threading.Event()
        threading.Thread(target=self._main, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                fields = dict(
                    (k.strip().lower(), v.strip()) for k, _, v in (ln.partition(b":") for ln in lines[1:] if ln)
                )
                body = await reader.readexactly(int(fields.get(b"content-length", b"0")))
                case = fields.get(client.CASE_HEADER.lower())
                if case is not None:
                    with self.lock:
                        self.received.setdefault(case.decode(), []).append(head + body)
                status, reply = (b"200 OK", REPLY) if lines[0].startswith(b"POST ") else (b"404 Not Found", b"{}")
                writer.write(
                    b"HTTP/1.1 "
                    + status
                    + b"\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(reply)).encode()
                    + b"\r\n\r\n"
                    + reply
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def take(self) -> dict[str, list[bytes]]:
        with self.lock:
            got, self.received = self.received, {}
        return got

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def recorded(data: Path) -> dict[str, dict]:
    """Each case's record, without what differs by command (VOLATILE) or the proxy's own port."""
    return recorded_of_run(data, None)


def recorded_of_run(data: Path, run: str | None, exclude: bool = False) -> dict[str, dict]:
    out = {}
    for rec in read_records(data, "exchange"):
        if run is not None and (rec.get("run") == run) == exclude:
            continue
        headers = [h for h in rec.get("request_headers") or () if h[0].lower() != "host"]
        case = next((v for k, v in headers if k.lower() == client.CASE_HEADER.decode().lower()), None)
        if case is not None:
            out[case] = {**{k: v for k, v in rec.items() if k not in VOLATILE}, "request_headers": headers}
    return out


@pytest.fixture(scope="module")
def upstream():
    up = RecordingUpstream()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def through_serve(upstream, tmp_path_factory):
    """What the upstream received and what was recorded when the cases went through `serve`."""
    data = tmp_path_factory.mktemp("serve")
    proxy = ProxyProcess(upstream.url, data)
    try:
        statuses = asyncio.run(client.send_all(proxy.url + "/t/run=serve"))
        proxy.wait_records(len(CASES))
    finally:
        proxy.stop()
    assert statuses == {case: 200 for case in CASES}, statuses
    return upstream.take(), recorded(data), data


async def through_demo(upstream: str, data: Path) -> dict[str, int]:
    """A demo scenario's proxy, as `demo` starts it (its scripted agent cannot send these requests)."""
    from toolproxy.drive.demo import SCENARIOS, scenario_proxy

    proxy = await scenario_proxy(next(sc for sc in SCENARIOS if sc.condition == "native"), upstream, data)
    try:
        return await client.send_all(proxy.url + "/t")
    finally:
        await proxy.stop()


async def through_doctor(upstream: str, data: Path) -> dict[str, int]:
    """The local proxy `doctor` and `conformance` probe through, with these requests instead of probes."""
    from toolproxy.checks.local import local_proxy

    async with local_proxy(upstream, data, "doctor") as lp:
        return await client.send_all(lp.url)


def command_through(upstream, tmp_path, command: str, serve_data: Path) -> tuple[dict, dict]:
    data = tmp_path / command
    harness = ("--", sys.executable, CLIENT_SCRIPT)
    if command in ("run", "study", "replay"):
        if command == "run":
            args = ("run", "--upstream", upstream.url, "--data", str(data), "--no-analyze", *harness)
        elif command == "study":
            args = ("study", "--upstream", upstream.url, "--data", str(data), "--conditions", "native", *harness)
        else:
            shutil.copytree(serve_data, data)
            analyzed = toolproxy_cli("analyze", "--data", str(data), timeout=120)
            assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
            args = ("replay", "--from", "serve", "--upstream", upstream.url, "--data", str(data))
        done = toolproxy_cli(*args, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        statuses = asyncio.run((through_demo if command == "demo" else through_doctor)(upstream.url, data))
        assert statuses == {case: 200 for case in CASES}, statuses
    if command != "replay":
        return upstream.take(), recorded(data)
    # Replay's own client sends the recorded headers without the hop-by-hop ones (Connection)
    # and in its own order: the record is the same request once that is allowed for.
    return upstream.take(), {case: _replayed(rec) for case, rec in recorded_of_run(data, "serve", exclude=True).items()}


def _replayed(rec: dict) -> dict:
    return {**rec, "request_headers": sorted(h for h in rec["request_headers"] if h[0].lower() != "connection")}


# Replay's client is aiohttp's, which cannot write a header byte above 0x7f: it sends the value as
# serve forwards it (so the upstream gets serve's bytes) and its proxy records that.
REPLAY_CANNOT_SEND = {"odd_header record"}


def test_serve_forwards_as_it_does_and_records_every_byte(through_serve):
    """What the others are held to, pinned: the gzip body passes compressed, byte for byte; a
    header value's obs-text bytes are recorded losslessly but not forwarded (aiohttp's client
    writer drops them); the trickled head is answered like any other."""
    got, recs, _ = through_serve
    assert got["gzip"][0].endswith(b"\r\n\r\n" + client.GZIP_BODY)
    assert b"\r\nContent-Encoding: gzip\r\n" in got["gzip"][0]
    assert b"\r\nX-Odd: caf -obs-text\r\n" in got["odd_header"][0]
    assert ["X-Odd", client.ODD_VALUE.decode("latin-1")] in recs["odd_header"]["request_headers"]
    assert got["slow_header"][0].endswith(b"\r\n\r\n" + client.PLAIN_BODY)
    assert {case: rec["status"] for case, rec in recs.items()} == {case: 200 for case in CASES}


@pytest.mark.parametrize("command", ["run", "study", "replay", "demo", "doctor"])
def test_a_command_forwards_and_records_as_serve_does(upstream, through_serve, tmp_path, command):
    serve_got, serve_recorded, serve_data = through_serve
    got, recs = command_through(upstream, tmp_path, command, serve_data)
    if command == "replay":
        serve_recorded = {case: _replayed(rec) for case, rec in serve_recorded.items()}
    row = {}
    for case in CASES:
        row[f"{case} upstream"] = got.get(case) == serve_got[case]
        row[f"{case} record"] = recs.get(case) == serve_recorded[case]
    print(f"\n{command}: " + ", ".join(f"{k}: {'same' if v else 'DIFFERENT'}" for k, v in row.items()))
    expected_different = REPLAY_CANNOT_SEND if command == "replay" else set()
    assert {k for k, same in row.items() if not same} == expected_different, row
    if command == "replay":
        assert ["X-Odd", "caf -obs-text"] in recs["odd_header"]["request_headers"]


async def test_an_embedded_proxy_counts_the_requests_its_parser_rejects(upstream, tmp_path):
    """doctor's proxy listens as serve does: a request line aiohttp cannot parse is answered 400
    by the parser and still counted (before, an embedded proxy's runner never told anyone)."""
    from rawhttp import raw_request

    from toolproxy.checks.local import local_proxy
    from toolproxy.proxy.refusals import PARSER_REJECTED

    async with local_proxy(upstream.url, tmp_path / "d", "doctor") as lp:
        status, _ = await raw_request(lp.url, b"/v1/chat/completions", [(b"Bad Header", b"x")])
        assert status == 400
        assert lp.state.refusals.report()["by_kind"].get(PARSER_REJECTED) == 1
