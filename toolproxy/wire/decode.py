"""Bytes of a reply, in any chunking, -> events and the accumulated Reply.

One decoder for every family: the framing (one JSON document, SSE, NDJSON) is taken from the
content type or sniffed from the first bytes, each JSON document goes to the family's reader, and
every event is folded into `reply` as it is produced. Feeding a body in any split gives the same
events and the same reply as feeding it whole. Nothing here raises on bad input: a recording of
a broken exchange is exactly what the analyzer must explain, and a condition must still answer.
"""

from __future__ import annotations

import orjson

import toolproxy.wire.framing as framing

from .chat import ChatReader
from .endpoints import ARRAY_FRAMED, CHAT, GEMINI, LINE_FRAMED, MESSAGES, RESPONSES
from .errors import error_of
from .framing import DONE
from .gemini import GeminiReader
from .messages import MessagesReader
from .model import FOLD, Error, Event, Reply
from .ollama import OllamaReader
from .responses import ResponsesReader

_READERS = {RESPONSES: ResponsesReader, MESSAGES: MessagesReader, GEMINI: GeminiReader}
_UNREADABLE_HEAD = 4000


def reader_for(family: str | None):
    """The object-to-events reader of a family."""
    if family in LINE_FRAMED:
        return OllamaReader()
    return _READERS.get(family, ChatReader)()


class Decoder:
    def __init__(self, family: str | None, content_type: str | None = None) -> None:
        self.family = family or CHAT
        self.content_type = content_type
        self.reader = reader_for(self.family)
        self.reply = Reply()
        self._framer = None
        self._kind: str | None = None
        self._head = b""
        # An NDJSON guess (a line-framed family, no content type) keeps the body: if no line is a
        # document, it was one pretty-printed JSON document after all.
        self._kept: list[bytes] | None = None
        self._documents_seen = 0

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._framer is None:
            self._head += chunk
            kind = self._sniff(self._head)
            if kind is None:
                return []
            chunk, self._head = self._head, b""
            self._start(kind)
        if self._kept is not None:
            self._kept.append(chunk)
        return self._read(self._framer.feed(chunk))

    def close(self) -> list[Event]:
        """Events for what is left once the body has ended."""
        if self._framer is None:
            head, self._head = self._head, b""
            if not head.strip():
                self.reply.empty_body = True
                return []
            return self._rest(head, self._sniff(head) or framing.JSON)
        return self._end()

    def whole(self, body: bytes | None) -> None:
        """Read a whole body: the reply `feed(body)` then `close()` give.

        The analyzer's path: with the whole body in hand the framing is known from the first call,
        so the body is framed once, with no head kept aside and copied as `feed` must.
        """
        if not body or self._framer is not None or self._head:
            if body:
                self.feed(body)
            self.close()
            return
        kind = self._sniff(body)
        if kind is None and not body.strip():
            self.reply.empty_body = True
            return
        self._rest(body, kind or framing.JSON)

    def _sniff(self, head: bytes) -> str | None:
        family = self.family
        return framing.sniff(head, self.content_type, family in LINE_FRAMED, family in ARRAY_FRAMED)

    def _rest(self, data: bytes, kind: str) -> list[Event]:
        """Start framing as `kind` once the body has ended, read its last unframed bytes, and end.
        A batch with no document is not read (see _read)."""
        self._start(kind)
        if self._kept is not None:
            self._kept.append(data)
        docs = self._framer.feed(data)
        return (self._read(docs) if docs else []) + self._end()

    def _end(self) -> list[Event]:
        """The framer's last documents, and what only the end of the body can tell."""
        docs = self._framer.close()
        events = self._read(docs) if docs else []
        if self._kind == framing.NDJSON:
            if self._kept is not None and self._documents_seen == 0:
                self._kind = framing.JSON
                events += self._read([(None, b"".join(self._kept))])
            self.reply.streamed = self._documents_seen > 1 or "ndjson" in (self.content_type or "").lower()
        return events

    def _start(self, kind: str) -> None:
        self._kind = kind
        self._framer = framing.FRAMERS[kind]()
        self.reply.streamed = kind != framing.JSON
        if kind == framing.NDJSON and "ndjson" not in (self.content_type or "").lower():
            self._kept = []

    def _read(self, docs: list[tuple[str | None, bytes]]) -> list[Event]:
        """Parse a batch of documents and fold each object's events into the reply (one loop for
        the whole batch: a stream has hundreds of documents, each a few lookups). Every batch
        ends settled, so an empty batch changes nothing and need not be read."""
        reply = self.reply
        reader = self.reader
        single = self._kind == framing.JSON
        out: list[Event] = []
        for (name, _), parsed in zip(docs, _parse_all([payload for _, payload in docs])):
            if type(parsed) is dict:  # the common case first (orjson makes plain dicts)
                self._documents_seen += 1
                if reply.first is None:
                    reply.first = parsed
                reply.last = parsed
                if reply.model is None or (reply.id is None and self._documents_seen <= _ID_DOCUMENTS):
                    self._identity(parsed)
                message = error_of(parsed)
                if message is not None:
                    events: list[Event] = [Error(message)]
                else:
                    events = reader.read(name, parsed)
                    if not reply.decoded and (events or reader.n_choices):
                        reply.decoded = True
                for event in events:
                    FOLD[type(event)](reply, event)
                out += events
                if single:
                    reply.complete = True
            elif parsed is _DONE:
                reply.complete = True
            elif isinstance(parsed, orjson.JSONDecodeError):
                if single:
                    reply.unreadable = f"body is not JSON: {parsed}"
                    reply.raw_text = docs[0][1][:_UNREADABLE_HEAD].decode("utf-8", "replace")
                # a torn event (a cut stream) is dropped, as a client library would
            else:
                self._documents_seen += 1
                if single:
                    reply.unreadable = f"body is JSON but not an object ({type(parsed).__name__})"
        if reader.n_choices > reply.n_choices:
            reply.n_choices = reader.n_choices
        reply.settle()
        return out

    def _identity(self, obj: dict) -> None:
        """The reply's model and id, top level or inside a Responses/Messages envelope."""
        inner = obj.get("response") if isinstance(obj.get("response"), dict) else obj.get("message")
        inner = inner if isinstance(inner, dict) else {}
        reply = self.reply
        model, rid = obj.get("model", inner.get("model")), obj.get("id", inner.get("id"))
        if model is None and rid is None and "modelVersion" in obj:  # Gemini
            model, rid = obj.get("modelVersion"), obj.get("responseId")
        if reply.model is None and isinstance(model, str):
            reply.model = model
        if reply.id is None and isinstance(rid, str):
            reply.id = rid


# A reply names its id in its first documents when at all (Ollama never does: looking for it in
# every line would cost each delta a lookup); the model is looked for until found (llama-server's
# Responses stream names it only in response.completed).
_ID_DOCUMENTS = 2


_DONE = object()


def _parse_all(payloads: list[bytes]) -> list:
    """Each payload parsed (or its JSONDecodeError, or _DONE for `[DONE]`), in one C call when
    all are good: a stream has hundreds of small documents."""
    if len(payloads) == 1:  # a whole body, one line, one event
        try:
            return [_DONE] if DONE in payloads[0] and payloads[0].strip() == DONE else [orjson.loads(payloads[0])]
        except orjson.JSONDecodeError as exc:
            return [exc]
    # `[DONE]` ends an OpenAI stream: looked for payload by payload only when the others hold it.
    tail = [len(payloads) - 1] if payloads and payloads[-1] == DONE else []
    docs = payloads[:-1] if tail else payloads
    joined = b",".join(docs)
    done = tail
    if DONE in joined:
        done = [i for i, p in enumerate(payloads) if DONE in p and p.strip() == DONE]
        skip = set(done)
        docs = [p for i, p in enumerate(payloads) if i not in skip]
        joined = b",".join(docs)
    try:
        parsed = orjson.loads(b"".join((b"[", joined, b"]"))) if len(docs) > 1 else [orjson.loads(d) for d in docs]
    except orjson.JSONDecodeError:
        parsed = None
    if parsed is None or len(parsed) != len(docs):  # a bad document, or one holding `a, b`
        parsed = []
        for doc in docs:
            try:
                parsed.append(orjson.loads(doc))
            except orjson.JSONDecodeError as exc:
                parsed.append(exc)
    for i in done:
        parsed.insert(i, _DONE)
    return parsed


def decode(raw: bytes | None, family: str | None, content_type: str | None = None) -> Reply:
    """The reply in a whole recorded body."""
    decoder = Decoder(family, content_type)
    decoder.whole(raw)
    return decoder.reply
