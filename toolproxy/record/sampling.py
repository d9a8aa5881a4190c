"""`--sample RATE`: keep a share of whole episodes, never single turns.

An episode's turns must be kept or dropped together: a stored episode missing a turn would be
classified wrongly (its last kept turn looks like its end) and would bias every rate. So the
decision is a pure function of something every turn of an episode shares, computed from the
request alone (no memory of earlier requests, so any number of workers, or a restarted proxy,
decide alike):

- a tagged episode: its `episode` tag;
- an untagged one: its *opening*, the messages before the first assistant message. A harness
  sends turn k+1 as turn k's messages plus the reply and tool results, so every turn of an
  episode begins with the same opening (this is the prefix chaining the analyzer rebuilds
  untagged episodes from). Messages are compared as role + stripped text, the way the analyzer
  compares them, so a harness re-serialising content parts still maps to the same decision.

The key is an HMAC (key file `sample.key` in the data directory) mapped to [0, 1) and compared
with the rate: which episodes are kept cannot be steered by the traffic, stays the same across
restarts, and with a fixed key is reproducible. Neither key names the run, so runs that repeat
the same episodes or items keep the same ones and paired comparisons keep their pairs. Episodes
whose openings are identical are kept or dropped together.

What is not an episode's turn (a model list, a request that is not JSON, a stateful Responses
request continuing a stored response by `previous_response_id`, whose opening the proxy never
sees) is always kept, marked with rate 1, so estimates weigh it once.

A sampled-out exchange is still forwarded unchanged; what reaches disk is a stub record
(kind `sampled_out`: id, times, tags, path, status, no headers or bodies), so every exchange is
counted and nothing is an uncounted loss. Every kept record carries the rate in
extra["sample"]; the analyzer weighs each turn by 1/rate for estimated totals. Runs on the writer
thread, never on the event loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from pathlib import Path
from typing import Any

import orjson

from toolproxy.record import keys
from toolproxy.record.model import Record, body_bytes
from toolproxy.record.spill import SpilledBody
from toolproxy.wire import family_of, read_request
from toolproxy.wire.model import text_of

KEY_FILE = "sample.key"
SAMPLED_OUT = "sampled_out"
# What a decision was made by (extra["sample"]["by"]).
BY_EPISODE = "episode"
BY_OPENING = "opening"
BY_NONE = "always"  # not an episode's turn, or its episode cannot be told: kept, weight 1


def parse_rate(text: str) -> float:
    """A share of episodes to keep: 0.25, 25%, 1. ValueError with a usable message otherwise."""
    value = (text or "").strip()
    try:
        rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a rate; write a share of episodes to keep: 0.1, 0.5, 25%") from None
    if not 0 < rate <= 1:
        raise ValueError(f"{text!r}: the share of episodes to keep must be above 0 and at most 1 (100%)")
    return rate


def opening(messages: list[Any]) -> list[list[Any]]:
    """The messages before the first assistant message, as role + stripped text."""
    out = []
    for m in messages:
        if isinstance(m, dict):
            if m.get("role") == "assistant":
                break
            out.append([m.get("role"), text_of(m.get("content")).strip()])
        else:
            out.append([None, orjson.dumps(m, default=str).decode()])
    return out


def episode_key(rec: Record, request_body: bytes | None) -> tuple[str, bytes | None]:
    """(what decides, the bytes to hash); None when the exchange is not a turn of a known episode."""
    if rec.kind != "exchange" or rec.method != "POST":
        return BY_NONE, None
    family = family_of(rec.path)
    if family is None:
        return BY_NONE, None
    if rec.episode:
        return BY_EPISODE, b"episode\x00" + rec.episode.encode("utf-8", "surrogatepass")
    try:
        body = orjson.loads(request_body) if request_body else None
    except orjson.JSONDecodeError:
        return BY_NONE, None
    if not isinstance(body, dict) or body.get("previous_response_id") is not None:
        return BY_NONE, None
    try:
        material = orjson.dumps(opening(read_request(family, body, rec.path).messages), option=orjson.OPT_SORT_KEYS)
    except Exception:  # a body no reader understands (or orjson cannot write) is not a turn we can place: keep it
        return BY_NONE, None
    return BY_OPENING, b"opening\x00" + material


def _request_bytes(rec: Record) -> bytes | None:
    body = rec.request_body
    if isinstance(body, SpilledBody):
        data = body.read()  # bounded by --max-body; only when sampling, on the writer thread
        return data if body.utf8 else None
    if rec.request_body_encoding != "utf8":
        return None  # binary or compressed: not read here, so the exchange is kept
    return body_bytes(body, rec.request_body_encoding)


class Sampler:
    def __init__(self, rate: float, key: bytes) -> None:
        self.rate = rate
        self.key = key
        # Exchanges decided so far (written on the writer thread, read by /_toolproxy/stats).
        self.kept = 0
        self.sampled_out = 0

    def report(self) -> dict:
        return {"sample_rate": self.rate, "kept": self.kept, "sampled_out": self.sampled_out}

    def keeps(self, material: bytes) -> bool:
        digest = hmac.new(self.key, material, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.rate

    def record(self, rec: Record) -> Record:
        """The record to write: the record itself marked with the rate, or a stub if sampled out."""
        if rec.kind != "exchange":
            return rec
        by, material = episode_key(rec, _request_bytes(rec))
        if material is None:
            return dataclasses.replace(rec, extra={**rec.extra, "sample": {"rate": 1.0, "by": by, "of": self.rate}})
        mark = {"rate": self.rate, "by": by}
        if self.keeps(material):
            self.kept += 1
            return dataclasses.replace(rec, extra={**rec.extra, "sample": mark})
        self.sampled_out += 1
        return stub(rec, mark)


def stub(rec: Record, mark: dict) -> Record:
    """What is stored of a sampled-out exchange: enough to count it, by run, episode and outcome."""
    return Record(
        id=rec.id,
        started_at=rec.started_at,
        kind=SAMPLED_OUT,
        ended_at=rec.ended_at,
        ttfb_ms=rec.ttfb_ms,
        duration_ms=rec.duration_ms,
        run=rec.run,
        episode=rec.episode,
        item=rec.item,
        condition=rec.condition,
        tags=rec.tags,
        upstream=rec.upstream,
        method=rec.method,
        path=rec.path,
        status=rec.status,
        client_status=rec.client_status,
        error_kind=rec.error_kind,
        extra={"sample": mark},
    )


def load_sampler(rate: float, data_dir: str | Path) -> Sampler:
    return Sampler(rate, keys.load_key(data_dir, KEY_FILE))
