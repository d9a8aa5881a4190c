"""`toolproxy replay`: the turns of a recorded run, sent again through another interface or stack.

Recordings hold every request exactly as the harness sent it, so "would this traffic have worked
under `text`, another parser, another stack?" can be asked without rerunning the harness: each
turn's last attempt is sent once more through a proxy started in-process (so the condition,
recording and fingerprinting are the proxy's own) and recorded as a new run.

Replay is open-loop: every turn keeps the history the original harness built, never the replayed
answers, so a turn is a single question ("given this context, is a call delivered?"). Each
replayed turn is its own episode whose item is the original turn's id, and compare pairs the two
runs turn by turn. Selection reads the analyzer's database read-only; already replayed turns with
an answer are skipped, so an interrupted replay resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import click

from toolproxy.drive.run import start_proxy, toolproxy_cli
from toolproxy.proxy.cli import config_from_options, harness_serve_options, make_data_dir
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.tags import TAG_HEADER_PREFIX, tag_prefix
from toolproxy.runtime.eventloop import run_loop
from toolproxy.term.printable import printable
from toolproxy.term.progress import Progress, duration
from toolproxy.wire.hopbyhop import NOT_FORWARDED_UP
from toolproxy.wire.websocket import create_as_post

OPEN_LOOP = (
    "replay is open-loop: each turn is sent with the history the original harness built, "
    "never with the replayed answers, so a turn is one question, not an episode"
)
# Statuses that say "not now" rather than "no": wait and send the turn again.
BUSY = (429, 503)
MAX_BUSY_RETRIES = 6
MAX_BACKOFF = 120.0
# aiohttp's client adds these when a request lacks them: a replayed turn carries only what the
# harness sent, or the upstream sees (and may answer) a request the harness never made.
CLIENT_DEFAULTS = ("Accept", "Accept-Encoding", "User-Agent")
REPLAY_TAGS = ("replay_of_run", "replay_of_episode", "replay_of_item", "replay_of_turn", "replay_of_turn_index")


@dataclass(frozen=True)
class RecordedTurn:
    """One turn of the original run: its identity and its last attempt's request as recorded."""

    turn_id: str
    run: str
    episode: str
    item: str | None
    turn_index: int
    expect: str | None
    method: str
    path: str
    query: str | None
    headers: list[list[str]]
    body: bytes | None
    tags: dict[str, str]


@dataclass(frozen=True)
class ReplayRequest:
    method: str
    target: str  # path with the tag prefix and query, relative to the proxy
    headers: list[tuple[str, str]]
    body: bytes | None


def build_request(turn: RecordedTurn, new_run: str, model: str | None = None) -> ReplayRequest:
    """The request to send for `turn`: its own bytes, tagged for the new run, without secrets.

    Redacted values never go out (the proxy adds the upstream key itself), nor do the original's
    tag headers, hop-by-hop headers or a length the new body may not have.
    """
    tags = {k: v for k, v in turn.tags.items() if k not in REPLAY_TAGS and k != "expect"}
    tags.update(
        replay_of_run=turn.run,
        replay_of_episode=turn.episode,
        replay_of_turn=turn.turn_id,
        replay_of_turn_index=str(turn.turn_index),
    )
    if turn.item:
        tags["replay_of_item"] = turn.item
    if turn.expect:
        tags["expect"] = turn.expect
    prefix = tag_prefix(new_run, None, episode=f"replay-{turn.turn_id}", item=turn.turn_id, **tags)
    body, method = turn.body, turn.method
    posted = create_as_post(body) if method == "GET" else None
    if posted is not None:  # an exchange recorded on a WebSocket goes again as the HTTP request it stands for
        body, method = posted, "POST"
    if model is not None and body is not None:
        body = with_model(body, model)
    query = strip_redacted_query(turn.query or "")
    headers = [
        (k, as_sent(v))
        for k, v in turn.headers
        if k.lower() not in NOT_FORWARDED_UP
        and not k.lower().startswith((TAG_HEADER_PREFIX, "sec-websocket-"))
        and not v.startswith("redacted:")
    ]
    return ReplayRequest(method, prefix + turn.path + (f"?{query}" if query else ""), headers, body)


def as_sent(value: str) -> str:
    """A recorded header value (each byte as one latin-1 character) in the form aiohttp writes
    back as those same bytes: the proxy's own server reads headers as UTF-8 with surrogate
    escapes, and its client writes them so. Sent as recorded, a byte above 0x7f would leave
    as two (UTF-8) and the replayed request would not be the harness's."""
    try:
        return value.encode("latin-1").decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # not a recorded value: it has characters no byte gives
        return value


def with_model(body: bytes, model: str) -> bytes:
    """The body with its `model` field replaced; a body that is not a JSON object is left as it is."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    doc["model"] = model
    return json.dumps(doc, ensure_ascii=False).encode()


STREAM_SETTINGS = ("as-recorded", "on", "off")
# Ollama's native API streams unless told not to: a body without `stream` is a streamed one.
_STREAMS_BY_DEFAULT = ("/api/chat", "/api/generate")


def with_stream(req: ReplayRequest, stream: bool) -> ReplayRequest:
    """The request asking for a streamed (or a whole) reply. Only `stream` changes (and
    `stream_options`, which OpenAI-style servers refuse without it); a body that is not a JSON
    object, or already asks as wanted, is sent as it is. Open-loop replay makes each turn one
    question, so the same turns with `stream` flipped ask "does this stack lose calls only
    when streaming?" and compare pairs the two runs turn by turn."""
    if req.body is None:
        return req
    try:
        doc = json.loads(req.body)
    except ValueError:
        return req
    if not isinstance(doc, dict):
        return req
    path = req.target.split("?")[0]
    asked = doc.get("stream", path.endswith(_STREAMS_BY_DEFAULT))
    if asked is stream:
        return req
    doc["stream"] = stream
    if not stream:
        doc.pop("stream_options", None)
    return replace(req, body=json.dumps(doc, ensure_ascii=False).encode())


def strip_redacted_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not v.startswith("redacted:")]
    return query if len(kept) == len(pairs) else urlencode(kept)


def retry_delay(headers, attempt: int, now: float | None = None) -> float:
    """Seconds to wait before the next try: the upstream's Retry-After (seconds or a date), else 2^attempt."""
    value = (headers.get("Retry-After") or "").strip()
    try:
        return min(max(float(value), 0.0), MAX_BACKOFF)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (ValueError, TypeError):
        when = None
    if when is not None and when.tzinfo is not None:
        return min(max(when.timestamp() - (now if now is not None else time.time()), 0.0), MAX_BACKOFF)
    return min(2.0**attempt, MAX_BACKOFF)


# ---------------------------------------------------------------- selection


class SelectionError(click.ClickException):
    pass


_TURNS_SQL = """
with last as (
    select turn_id, arg_max(id, started_at) as id from exchanges
    where run = $run and turn_id is not null and coalesce(kind, 'exchange') = 'exchange'
    group by turn_id
)
select t.turn_id, t.run, t.episode_key, e.episode, e.item, t.turn_index, t.expect, e.method, e.path, e.query,
       e.request_headers::varchar, bodies(e.segment, e.segment_offset).request_body,
       bodies(e.segment, e.segment_offset).request_body_encoding, e.tags::varchar
from (select * from turns t where t.run = $run and ({where})) t join last l using (turn_id) join exchanges e on
    e.id = l.id
order by e.started_at, t.turn_index
"""
# A replayed turn is done once its answer was recorded (refusals included); one cut short or
# still refused for being busy is sent again.
_DONE_SQL = """
select distinct tags->>'replay_of_turn' from exchanges
where run = $new and tags->>'replay_of_run' = $run and error_kind is null and status is not null
  and status not in (429, 503)
"""


def select_turns(
    db: Path, run: str, new_run: str, where: str | None, limit: int | None
) -> tuple[list[RecordedTurn], set[str]]:
    """(the selected turns of `run` in recorded order, the ids already replayed in `new_run`).
    `db` is a data directory's database: the request bodies are read from its segments."""
    import duckdb

    from toolproxy.analysis.store.connection import bodies_in_sql
    from toolproxy.record.model import body_bytes

    if not db.exists():
        raise SelectionError(f"no analyzer database at {db}; run `toolproxy analyze` first")
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as exc:
        raise SelectionError(f"cannot open {db} read-only: {exc}") from None
    try:
        with bodies_in_sql(con, db.parent) as bodies:
            if not con.execute("select count(*) from turns where run = ?", [run]).fetchone()[0]:
                known = [r[0] for r in con.execute("select distinct run from turns order by 1 limit 20").fetchall()]
                raise SelectionError(f"run {run!r} has no turns in {db} (runs: {', '.join(map(str, known)) or 'none'})")
            sql = _TURNS_SQL.format(where=check_predicate(con, where))
            if limit is not None:
                sql += f" limit {int(limit)}"
            try:
                rows = con.execute(sql, {"run": run}).fetchall()
            except duckdb.Error as exc:
                if bodies.failure is not None:  # a segment gone, not the predicate
                    raise SelectionError(bodies.failure) from None
                raise SelectionError(f"--where {where!r}: {_first_line(exc)}") from None
            done = {r[0] for r in con.execute(_DONE_SQL, {"run": run, "new": new_run}).fetchall()}
    finally:
        con.close()
    turns = []
    for turn_id, r, episode_key, episode, item, index, expect, method, path, query, headers, body, enc, tags in rows:
        free = json.loads(tags) if tags else {}
        turns.append(
            RecordedTurn(
                turn_id=turn_id,
                run=r,
                episode=episode or episode_key,
                item=item,
                turn_index=int(index),
                expect=expect,
                method=method or "POST",
                path=path or "/",
                query=query,
                headers=[list(h) for h in json.loads(headers)] if headers else [],
                body=body_bytes(body, enc) if body is not None else None,
                tags={str(k): str(v) for k, v in free.items()} if isinstance(free, dict) else {},
            )
        )
    return turns, done


def check_predicate(con, where: str | None) -> str:
    """`where` as one SQL expression over the turns table, or a clear error.

    The connection is read-only, so nothing can be written; this also refuses anything that is
    not a single expression (a `;`, a closing parenthesis that ends the WHERE clause early).
    """
    import duckdb

    if where is None or not where.strip():
        return "true"
    probe = f"select 1 from turns t where ({where}) limit 0"
    try:
        statements = duckdb.extract_statements(probe)
    except duckdb.Error as exc:
        raise SelectionError(f"--where {where!r} is not valid SQL: {_first_line(exc)}") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT or _unbalanced(where):
        raise SelectionError(
            f"--where {where!r}: give one condition on the turns table, e.g. \"outcome = 'non_response'\""
        )
    try:
        con.execute(probe)
    except duckdb.Error as exc:
        raise SelectionError(
            f"--where {where!r}: {_first_line(exc)} (columns of the turns table: {', '.join(_columns(con))})"
        ) from None
    return where


def _unbalanced(where: str) -> bool:
    """True when a parenthesis outside quotes closes the wrapping one."""
    depth, quote = 0, None
    for ch in where:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return True
    return depth != 0


def _columns(con) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "select column_name from information_schema.columns where table_name = 'turns' order by ordinal_position"
        ).fetchall()
    ]


def _first_line(exc: Exception) -> str:
    return printable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


# ---------------------------------------------------------------- sending


@dataclass
class ReplayTally:
    total: int
    sent: int = 0
    answered: int = 0
    busy_retries: int = 0
    failed: int = 0  # no answer recorded (connect error, still busy): a rerun tries again
    started: float = 0.0

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.sent / elapsed * 60 if elapsed > 0 and self.sent else 0.0
        if self.sent >= self.total:
            eta = f", done in {duration(elapsed)}"
        elif self.sent and elapsed > 0:
            eta = f", about {duration((self.total - self.sent) / (self.sent / elapsed))} left"
        else:
            eta = ""
        return (
            f"  replayed {self.sent}/{self.total} ({self.answered} answered, {self.failed} without answer, "
            f"{self.busy_retries} busy retries), {rate:.1f} turns/min{eta}"
        )


class Pause:
    """A shared "not before" time: when the upstream says it is busy, every worker waits."""

    def __init__(self) -> None:
        self.until = 0.0

    def push(self, seconds: float) -> None:
        self.until = max(self.until, time.monotonic() + seconds)

    async def wait(self) -> None:
        while (left := self.until - time.monotonic()) > 0:
            await asyncio.sleep(left)


async def _send(session, base: str, req: ReplayRequest, tally: ReplayTally, pause: Pause) -> None:
    import aiohttp

    for attempt in range(MAX_BUSY_RETRIES + 1):
        await pause.wait()
        try:
            async with session.request(
                req.method, base + req.target, headers=req.headers, data=req.body, allow_redirects=False
            ) as resp:
                async for _ in resp.content.iter_any():  # a stream is read as a stream
                    pass
                if resp.status in BUSY and attempt < MAX_BUSY_RETRIES:
                    tally.busy_retries += 1
                    pause.push(retry_delay(resp.headers, attempt))
                    continue
                ok = resp.status not in BUSY
        except aiohttp.ClientError:
            ok = False
        tally.answered += ok
        tally.failed += not ok
        return


async def replay_turns(
    config: ProxyConfig, requests: list[ReplayRequest], concurrency: int, progress: Progress
) -> ReplayTally:
    """Send every request through an in-process proxy, `concurrency` at a time; Ctrl-C stops cleanly."""
    import aiohttp

    tally = ReplayTally(total=len(requests), started=time.monotonic())
    proxy = await start_proxy(config)
    base = proxy.url
    queue = iter(requests)
    pause = Pause()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)

    async def worker(session) -> None:
        for req in queue:
            await _send(session, base, req, tally, pause)
            tally.sent += 1
            progress.show(tally.line())

    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, skip_auto_headers=CLIENT_DEFAULTS
        ) as session:
            tasks = [asyncio.ensure_future(worker(session)) for _ in range(max(1, min(concurrency, len(requests))))]
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: [t.cancel() for t in tasks])
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
    finally:
        progress.clear()
        await proxy.stop()
    return tally


# ---------------------------------------------------------------- command


@click.command()
@click.option("--from", "source", required=True, metavar="RUN", help="The recorded run to replay.")
@harness_serve_options
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Turns in flight at once (a CPU model serves one at a time).",
)
@click.option("--limit", default=None, type=click.IntRange(1), help="Replay at most the first N selected turns.")
@click.option(
    "--where",
    default=None,
    metavar="SQL",
    help="Only turns matching this condition on the turns table, e.g. \"outcome = 'non_response'\", "
    "\"surface = 'text'\", \"role = 'call'\".",
)
@click.option("--model", default=None, help="Send this model name instead of the recorded one.")
@click.option(
    "--stream",
    "stream",
    type=click.Choice(STREAM_SETTINGS),
    default="as-recorded",
    show_default=True,
    help="Ask for streamed replies (on), whole ones (off), or as each turn was recorded; replaying a "
    "streamed run with off shows whether calls were lost only when streaming.",
)
def replay(source, concurrency, limit, where, model, stream, **options):
    """Send a recorded run's turns again through a condition or to another upstream, as a new run.

    toolproxy replay --from RUN --upstream URL --condition text [--run NEW]

    Each turn's last attempt goes out exactly as the harness sent it (streaming ones as streams,
    unless --stream on|off asks otherwise),
    through an in-process proxy that records it as run NEW (default RUN@replay-CONDITION), tagged
    with the original run, episode, item and turn. Open-loop: later turns keep the original
    history. Secrets were redacted in the recording, so none is replayed: give the upstream key
    with --upstream-key-env. Ctrl-C keeps what was replayed; the same command resumes. At the
    end the data directory is analyzed and `compare RUN NEW` is printed, turn by turn.
    """
    options["quiet"] = True
    flipped = "" if stream == "as-recorded" else f"-stream-{stream}"
    options["run"] = options["run"] or f"{source}@replay-{options['condition']}{flipped}"
    config = config_from_options(**options)
    new_run = config.run
    if new_run == source:
        raise click.BadParameter("the replay needs a run name other than the original's", param_hint="--run")
    make_data_dir(config)
    analyzed = toolproxy_cli("analyze", "--data", str(config.data_dir))
    if analyzed.returncode != 0:
        raise click.ClickException(f"analyze failed: {analyzed.stderr.strip() or analyzed.stdout.strip()}")
    turns, done = select_turns(config.data_dir / "toolproxy.duckdb", source, new_run, where, limit)
    todo = [t for t in turns if t.turn_id not in done]
    click.echo(
        f"replay {source} -> {new_run} (condition {config.condition}, upstream {config.upstream}): "
        f"{len(turns)} turns selected, {len(turns) - len(todo)} already replayed, {len(todo)} to send",
        err=True,
    )
    click.echo(f"note: {OPEN_LOOP}", err=True)
    interrupted = False
    if todo:
        requests = [build_request(t, new_run, model) for t in todo]
        if stream != "as-recorded":
            requests = [with_stream(r, stream == "on") for r in requests]
        tally = run_loop(replay_turns(config, requests, concurrency, Progress("replay")))
        interrupted = tally.sent < tally.total
        click.echo(tally.line().strip(), err=True)
    _finish(config.data_dir, source, new_run)
    if interrupted:
        click.echo("replay interrupted: what was replayed is kept; run the same command again to resume", err=True)
        sys.exit(130)


def _finish(data_dir: Path, source: str, new_run: str) -> None:
    if toolproxy_cli("analyze", "--data", str(data_dir)).returncode != 0:
        raise click.ClickException(
            f"analyze failed on {data_dir}; run `toolproxy analyze --data {data_dir}` to see why"
        )
    done = toolproxy_cli("compare", source, new_run, "--data", str(data_dir))
    text = done.stdout if done.returncode == 0 else done.stderr
    click.echo(printable(text, lines=True), nl=False)
    click.echo(f"(toolproxy compare {source} {new_run} --data {data_dir} [--metric ...] for other views)", err=True)
