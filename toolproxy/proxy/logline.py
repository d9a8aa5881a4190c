"""The one line `serve` prints per record, built on the writer thread (not the loop).

An exchange reads as method, path, tags and time, then, when it failed, the error kind and the
proxy's own sentence for it (cut to one screen line). A fingerprint record has no method or path:
it says that it is the proxy's probe of the upstream and what the probe found, in words.
"""

from __future__ import annotations

from toolproxy.record.model import Record
from toolproxy.record.sampling import SAMPLED_OUT
from toolproxy.stacks.catalog import LABELS
from toolproxy.term.printable import printable

MESSAGE_CHARS = 200


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _ms(rec: Record) -> str:
    return f"{rec.duration_ms:.0f}ms" if rec.duration_ms is not None else "-"


def _fingerprint(rec: Record) -> str:
    fp = rec.extra
    model = f" model {fp['model']}:" if fp.get("model") else ""
    if rec.error_kind:
        found = f"upstream unreachable: {_cut(rec.error_message or rec.error_kind)}"
    else:
        stack = fp.get("stack")
        found = LABELS.get(stack, str(stack)) + (f" {fp['version']}" if fp.get("version") else "")
    return f"fingerprint of {rec.upstream}{model} {found} ({_ms(rec)})"


def log_line(rec: Record) -> str:
    if rec.kind == "fingerprint":
        return printable(_fingerprint(rec))
    status = rec.client_status if rec.client_status is not None else rec.status
    tags = " ".join(f"{k}={v}" for k, v in (("run", rec.run), ("ep", rec.episode), ("item", rec.item)) if v)
    cond = f" [{rec.condition}]" if rec.condition != "native" else ""
    err = (
        f" !{rec.error_kind}: {_cut(rec.error_message)}"
        if rec.error_kind and rec.error_message
        else (f" !{rec.error_kind}" if rec.error_kind else "")
    )
    if rec.kind == SAMPLED_OUT:
        err += " (sampled out: counted, not stored)"
    return printable(f"{status or '---'} {rec.method} {rec.path}{cond} {tags} {_ms(rec)}{err}".replace("  ", " "))
