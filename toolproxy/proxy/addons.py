"""The proxy's addons, in one ordered list: the order their hooks run and their services start.

Hooks run in list order (counters first: they see every flow, refused ones included; the
recorder last: it sees what every other addon did). Services start in list order and stop in
reverse, so the record listeners (live view, OTLP) come first and stop last: the writers' final
records, flushed at their stop, still reach them. Masking and the housekeeper feed the writer
and stop before it; the upstream session comes before the stack watcher that probes through it.
"""

from __future__ import annotations

from toolproxy.proxy.admission import OriginFormOnly, UpstreamKey
from toolproxy.proxy.auth import Auth
from toolproxy.proxy.condition import ConditionAddon
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.diskguard import DiskBudgetGuard
from toolproxy.proxy.durability import Durability, RecordingGuard
from toolproxy.proxy.flow import Addon
from toolproxy.proxy.mcptraffic import McpTraffic
from toolproxy.proxy.modelswap import ModelSwap
from toolproxy.proxy.parts import (
    Housekeeping,
    LivePage,
    Otlp,
    Recording,
    RecordSampling,
    RefusedRecording,
    UpstreamSession,
)
from toolproxy.proxy.recorder import Recorder
from toolproxy.proxy.state import ProxyState


def addons(config: ProxyConfig, state: ProxyState) -> list[Addon]:
    """The addons `config` asks for, in order (module doc); built once, at startup. Each wires
    itself to what it needs as it is built (toolproxy.proxy.parts), so this only says which and
    in what order."""
    out: list[Addon] = []
    if config.live_page:
        out.append(LivePage(config, state))
    if config.otlp_endpoint:
        out.append(Otlp(config, state))
    out.append(RefusedRecording(config, state))
    sampling = RecordSampling(config) if config.sample is not None else None
    mcp = McpTraffic(config.mcp_server, state.redactor) if config.mcp_server is not None else None
    recording = Recording(
        config, state, sampling.sampler if sampling is not None else None, mcp.scrubbed if mcp is not None else None
    )
    out.append(recording)
    if recording.spill_masking is not None:
        out.append(recording.spill_masking)
    housekeeping = (
        Housekeeping(config, state.writer) if config.retain_seconds is not None or config.max_disk is not None else None
    )
    if housekeeping is not None:
        out.append(housekeeping)
    if sampling is not None:
        out.append(sampling)
    if mcp is not None:  # first on the request: a refused exchange is the server's too
        out.append(mcp)
    out += [
        state.watchdog,
        state.counters,
        state.exposure,
        state.upstream_health,
        state.pool,
        UpstreamSession(config, state),
    ]
    if config.auth_token is not None:
        out.append(Auth(config.auth_token))
    if config.on_record_failure == "block":
        out.append(RecordingGuard(state.writer))
    if housekeeping is not None:
        out.append(DiskBudgetGuard(housekeeping.housekeeper))
    out.append(OriginFormOnly(config.upstream))
    if config.upstream_key is not None:
        out.append(UpstreamKey(config.upstream_key))
    out.append(ModelSwap(state.redactor))  # before the stack watcher: it fingerprints the model sent
    if state.stacks is not None:
        out.append(state.stacks)
    out.append(
        ConditionAddon(
            config.condition_options, state.stacks.detected_stack if state.stacks else lambda: None, state.redactor
        )
    )
    out.append(Durability(state.writer))
    out.append(
        Recorder(
            state.writer,
            config.spill_above,
            state.spill_dir,
            state.redactor,
            config.max_response,
            state.refusals,
            recording.submit,
        )
    )
    return out
