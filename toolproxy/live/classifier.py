"""The live page's classifier process: batches of written records in, answers to the page out,
and serve's line per exchange once it is classified.

Started by `LiveView.start` as `python -m toolproxy.live.classifier RECORDS_FD QUERIES_FD SOCKET
RECENT MAX_RUNS`, a fresh interpreter that imports only the live page's own modules and the
analyzer's per-record code: not multiprocessing's spawn, whose child re-imports the proxy's main
module (the whole CLI) and which starts a resource-tracker process besides, together as much
memory again as the proxy itself.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from multiprocessing.connection import Connection, wait

import orjson

from toolproxy.live.tally import Tally
from toolproxy.live.view import print_lines

SLICE = 32  # records the classifier classifies between looks for a question from the page


def _answer_peer(listener: socket.socket, tally: Tally) -> None:
    """One question from a peer worker's page handler: a JSON line in, a JSON document out."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    with conn:
        try:
            conn.settimeout(2.0)
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                piece = conn.recv(4096)
                if not piece:
                    break
                data += piece
            conn.sendall(orjson.dumps(tally.answer(orjson.loads(data))))
        except (OSError, ValueError, TypeError, IndexError):
            pass  # a peer that hung up or asked nonsense: it reports the worker as not answering


def _lowest_priority() -> None:
    """Run only on CPU time nothing else wants (SCHED_IDLE; nice 19 where that is refused).

    Not just a low nice value: a nice-19 process that holds a core when the proxy wakes up can
    keep it waiting for a scheduler slice (milliseconds, under saturation, on every wake-up), while
    a SCHED_IDLE one is preempted at once. On a machine that is never idle the classifier falls
    behind instead, which the page says.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


def _log_lines(tally: Tally, lines: list[bytes], texts: list[str | None]) -> str:
    """Classify each record, and serve's line for each that has one, with its outcome appended
    (analysis.measure.runline.exchange_text): the line says what the report will say of the exchange."""
    from toolproxy.analysis.measure.runline import exchange_text
    from toolproxy.term.printable import printable

    out = []
    for line, text in zip(lines, texts):
        summary = tally.add(line)
        if text:
            said = exchange_text(summary) if summary is not None else "not classified: the analyzer could not read it"
            out.append(f"{text} -> {printable(said)}\n")
    return "".join(out)


def run(records: Connection, queries: Connection, socket_path: str | None, recent: int, max_runs: int) -> None:
    """The classifier process: batches of records in, answers to the page's questions out.

    Questions are answered between slices of a batch, so the page stays quick while a large batch
    is classified; the next batch is received only when this one is done, which is what makes
    the feeder wait and the proxy's inbox, not this process, bound the backlog.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the proxy stops us itself
    _lowest_priority()
    tally = Tally(recent, max_runs)
    listener = None
    if socket_path is not None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(socket_path)
            listener.listen(16)
        except OSError as exc:  # the page then says this worker does not answer; its counts go on
            print(
                f"toolproxy: the live page cannot ask this worker ({socket_path}: {exc})", file=sys.stderr, flush=True
            )
            listener.close()
            listener = socket_path = None
    lines: list[bytes] = []
    texts: list[str | None] = []
    pos = 0
    try:
        while True:
            busy = pos < len(lines)
            watch = [queries, *([listener] if listener is not None else []), *([] if busy else [records])]
            for conn in wait(watch, timeout=0 if busy else None):
                if conn is listener:
                    _answer_peer(listener, tally)
                    continue
                try:
                    msg = conn.recv() if conn is queries else conn.recv_bytes()
                except (EOFError, OSError):
                    # The worker is gone: a clean EOF, or its batch cut off by its death
                    # (multiprocessing's "got end of file during message"). Nobody is left to tell.
                    return
                if conn is queries:
                    seq, query = msg
                    answer = tally.answer(query)
                    try:
                        queries.send((seq, answer))
                    except OSError:  # it asked, then died (BrokenPipeError)
                        return
                elif not msg:
                    return
                else:
                    head, _, body = msg.partition(b"\n")
                    tally.observed, counted, texts = orjson.loads(head)
                    tally.count({tuple(c[:4]): c[4:] for c in counted})
                    lines, pos = [line for line in body.split(b"\n") if line], 0
            printed = _log_lines(tally, lines[pos : pos + SLICE], texts[pos : pos + SLICE])
            if printed:
                print_lines(printed)
            pos += SLICE
    finally:
        if socket_path is not None:
            try:
                os.unlink(socket_path)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> None:
    records_fd, queries_fd, socket_path, recent, max_runs = argv if argv is not None else sys.argv[1:]
    run(
        Connection(int(records_fd), writable=False),
        Connection(int(queries_fd)),
        socket_path or None,
        int(recent),
        int(max_runs),
    )


if __name__ == "__main__":
    main()
