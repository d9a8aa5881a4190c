"""Each addon alone, on built flows (toolproxy.testing.flows): no socket, no server.

The servers' tests show the addons together behind real sockets; these pin what each one does
to a flow, and the list that assembles them (order, hooks per phase, services, stats keys).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from toolproxy.proxy import app as proxy_app
from toolproxy.proxy.addons import addons
from toolproxy.proxy.admission import OriginFormOnly, UpstreamKey, writer_backpressure
from toolproxy.proxy.auth import Auth
from toolproxy.proxy.condition import ConditionAddon
from toolproxy.proxy.counters import Counters
from toolproxy.proxy.diskguard import DiskBudgetGuard
from toolproxy.proxy.durability import Durability, RecordingGuard
from toolproxy.proxy.exposure import Exposure
from toolproxy.proxy.flow import Addon, Hooks, Service
from toolproxy.proxy.headers import Redactor
from toolproxy.proxy.modelswap import ModelSwap
from toolproxy.proxy.parts import Part
from toolproxy.proxy.pool import PoolStats
from toolproxy.proxy.recorder import Recorder
from toolproxy.proxy.refusals import RefusalBudget
from toolproxy.proxy.stackwatch import StackWatch
from toolproxy.proxy.state import STATS_KEYS, ProxyState
from toolproxy.proxy.upstreamhealth import UpstreamHealth
from toolproxy.proxy.watchdog import Watchdog
from toolproxy.record.housekeeping import Housekeeper
from toolproxy.record.segments import read_records
from toolproxy.record.writer import SegmentWriter
from toolproxy.testing import flows
from toolproxy.testing.flows import Context


def _state(tmp_path, **options) -> ProxyState:
    return proxy_app.make_state(flows.config(data_dir=tmp_path, quiet=True, **options))


# --- the list -------------------------------------------------------------------------------------


def _names(state: ProxyState) -> list[str]:
    return [
        type(a).__name__ if not isinstance(a, Part) else (a.stats_key or a.service().name) for a in state.hooks.addons
    ]


def test_the_list_in_order_with_everything_on(tmp_path):
    state = _state(
        tmp_path,
        mask=("email",),
        retain_seconds=60.0,
        max_disk=10**9,
        on_disk_full="block",
        sample=0.5,
        auth_token="t",
        on_record_failure="block",
        upstream_key="sk",
        upstream_connections=4,
        otlp_endpoint="http://127.0.0.1:9/v1/traces",
    )
    assert _names(state) == [
        "live view",
        "otlp",
        "refused",
        "recording",
        "SpillMasking",
        "lifecycle",
        "sampling",
        "Watchdog",
        "Counters",
        "Exposure",
        "UpstreamHealth",
        "PoolStats",
        "upstream session",
        "Auth",
        "RecordingGuard",
        "DiskBudgetGuard",
        "OriginFormOnly",
        "UpstreamKey",
        "ModelSwap",
        "StackWatch",
        "ConditionAddon",
        "Durability",
        "Recorder",
    ]
    assert [s.name for s in proxy_app.services(state)] == [
        "live view",
        "otlp",
        "refusals writer",
        "writer",
        "spill masking",
        "housekeeper",
        "watchdog",
        "upstream health",
        "upstream session",
        "stack watch",
    ]


def test_hooks_per_phase_only_from_the_addons_that_hook_it(tmp_path):
    """The request_headers phase runs these and no others: the counters see every flow first,
    the admission addons come after every refusal an addon can make."""
    hooks = _state(tmp_path, auth_token="t", upstream_key="sk").hooks
    assert [h.__self__.__class__.__name__ for h in hooks.request_headers] == [
        "Counters",
        "Exposure",
        "Auth",
        "OriginFormOnly",
        "UpstreamKey",
    ]
    assert [h.__self__.__class__.__name__ for h in hooks.request] == ["ModelSwap", "StackWatch", "ConditionAddon"]
    assert [h.__self__.__class__.__name__ for h in hooks.response_chunk] == ["Recorder"]
    assert [h.__self__.__class__.__name__ for h in hooks.error] == ["Counters", "UpstreamHealth", "Recorder"]
    assert [h.__self__.__class__.__name__ for h in hooks.recorded] == ["LiveView"]


def test_an_addon_not_hooked_costs_no_call(tmp_path):
    """Uncapped, the pool has nothing to settle; with --allowed-host '*' nothing is checked: both
    still report, neither is called per flow."""
    hooks = _state(tmp_path, allowed_hosts=("*",), live_page=False).hooks
    assert not any(
        isinstance(h.__self__, (PoolStats, Exposure)) for phase in (hooks.request_headers, hooks.error) for h in phase
    )
    assert hooks.recorded == () and hooks.observer() is None


def test_the_writers_observe_is_the_recorded_hooks(tmp_path):
    state = _state(tmp_path, otlp_endpoint="http://127.0.0.1:9/v1/traces")
    assert len(state.hooks.recorded) == 2
    assert state.writer.observe is state.refusals.writer.observe is not None
    one = _state(tmp_path / "one")
    assert one.writer.observe == one.live.observe  # one listener: called as it is, no fan-out


def test_stats_keep_their_keys_in_their_order(tmp_path):
    """/_toolproxy/stats is read by scripts and dashboards: each key where it always was, null
    when its feature is off."""
    for options in (
        {},
        {"mask": ("email",), "retain_seconds": 60.0, "sample": 0.5, "otlp_endpoint": "http://127.0.0.1:9/v1/traces"},
    ):
        snap = _state(tmp_path / str(len(options)), **options).snapshot()
        assert list(snap) == [
            "status",
            "version",
            "upstream",
            "data_dir",
            "condition",
            "stack",
            "uptime_s",
            "exchanges",
            "in_flight",
            "by_status_class",
            "errors",
            "resent",
            "refused",
            "recording",
            "exposure",
            "upstream_pool",
            "lifecycle",
            "sampling",
            "otlp",
        ]
        assert list(snap["recording"]) == [
            "queue_depth",
            "written",
            "dropped",
            "dropped_reasons",
            "behind",
            "write_failures",
            "segments",
            "last_error",
            "durability",
            "on_record_failure",
            *(["masking"] if options else []),
        ]
    off = _state(tmp_path / "off", fingerprint=False).snapshot()
    assert [off[k] for k in ("stack", "lifecycle", "sampling", "otlp")] == [None] * 4
    assert off["exchanges"] == 0 and off["upstream_pool"]["limit"] is None and off["exposure"]["checked"] is True


def test_a_key_no_layout_knows_is_shown_after_the_rest(tmp_path):
    state = _state(tmp_path)
    state.hooks.add(Part(stats_key="extra", report=lambda: {"n": 1}))
    assert list(state.snapshot())[-1] == "extra" and state.snapshot()["extra"] == {"n": 1}


def test_hooks_find_overrides_on_the_class_and_on_the_instance():
    class Quiet(Addon):
        pass

    class Counting(Addon):
        def response_end(self, flow) -> None: ...

    seen = []
    listening = Part(recorded=lambda rec, line, ok: seen.append(rec.id))
    hooks = Hooks([Quiet(), Counting(), listening])
    assert len(hooks.response_end) == 1 and hooks.request_headers == () and len(hooks.recorded) == 1
    hooks.observer()(flows.record(id="r1"), None, True)
    assert seen == ["r1"]


# --- admission ------------------------------------------------------------------------------------

LABELS = [
    # raw target, headers -> run, episode, item, condition, tags, upstream path, recorded query
    ("/v1/chat/completions", (), (None, None, None, "native", {}, "/v1/chat/completions", "")),
    (
        "/t/run=a/episode=3/item=x/category=math/v1/chat/completions?stream=1",
        (),
        ("a", "3", "x", "native", {"category": "math"}, "/v1/chat/completions", "stream=1"),
    ),
    (
        "/t/run=a/v1/models",
        (("X-Toolproxy-Run", "b"), ("X-Toolproxy-Tag-Seed", "7")),
        ("b", None, None, "native", {"seed": "7"}, "/v1/models", ""),
    ),
    ("/t/condition=text/v1/chat/completions", (), (None, None, None, "text", {}, "/v1/chat/completions", "")),
]


@pytest.mark.parametrize("target,headers,expected", LABELS)
async def test_label(target, headers, expected):
    f = flows.flow(target, headers=headers)
    rec = f.rec
    assert (rec.run, rec.episode, rec.item, rec.condition, rec.tags, rec.path, rec.query) == expected
    assert f.up_path == expected[5]
    assert not any(k.lower().startswith("x-toolproxy-") for k in f.up_headers)


async def test_label_redacts_a_key_in_the_query_for_the_record_only():
    f = flows.flow("/v1/chat/completions?api_key=sk-secret&stream=1")
    assert "sk-secret" not in f.rec.query and "sk-secret" not in f.rec.client_path
    assert f.up_query == "api_key=sk-secret&stream=1"


async def test_label_takes_the_default_run_and_condition_from_the_config():
    f = flows.flow(cfg=flows.config(run="nightly", condition="text"))
    assert (f.rec.run, f.rec.condition) == ("nightly", "text")


async def test_origin_form_only_refuses_an_absolute_form_target():
    out = await Context(OriginFormOnly(flows.UPSTREAM)).cycle(flows.flow("http://elsewhere.example/v1/models"))
    assert out.refusal.status == 400 and out.refusal.kind == "not_a_forward_proxy"
    assert flows.UPSTREAM in out.refusal.message
    ok = await Context(OriginFormOnly(flows.UPSTREAM)).cycle(flows.flow("/v1/models"))
    assert ok.refusal is None


async def test_upstream_key_replaces_every_authorization_the_client_sent():
    f = flows.flow(headers=[("authorization", "Bearer client"), ("Content-Type", "application/json")])
    await Context(UpstreamKey("sk-up")).cycle(f)
    assert [(k, v) for k, v in f.up_headers.items() if k.lower() == "authorization"] == [
        ("Authorization", "Bearer sk-up")
    ]


async def test_writer_backpressure_waits_for_the_writer_and_says_how_long(tmp_path):
    writer = SegmentWriter(tmp_path, window=0.01)
    writer.start()
    try:
        f = flows.flow()
        await writer_backpressure(f, writer)
        assert f.rec.extra["recording_wait_ms"] >= 0.0
    finally:
        await asyncio.get_running_loop().run_in_executor(None, writer.close)


# --- each addon -----------------------------------------------------------------------------------


async def test_counters_count_every_flow_once_by_class_and_error():
    counters = Counters()
    ctx = Context(counters, Auth("t"))
    await ctx.cycle(flows.flow(), flows.response(200))
    await ctx.cycle(flows.flow(headers=[("X-Toolproxy-Token", "t")]), flows.response(502))
    await ctx.cycle(flows.flow(headers=[("X-Toolproxy-Token", "t")]), error=("timeout", "too slow"))
    assert counters.report() == {
        "exchanges": 3,
        "in_flight": 0,
        "by_status_class": {"4xx": 1, "5xx": 1, "none": 1},
        "errors": {"unauthorized": 1, "timeout": 1},
        "resent": 0,
    }
    assert counters.stats() == counters.report()  # its entries are the stats' top level


async def test_exposure_refuses_a_foreign_host_and_counts_it():
    exposure = Exposure("127.0.0.1")
    out = await Context(exposure).cycle(flows.flow(headers=[("Host", "rebind.example")]))
    assert (out.refusal.status, out.refusal.kind) == (403, "host_refused")
    assert exposure.report()["refused_host"] == 1
    assert (await Context(exposure).cycle(flows.flow(headers=[("Host", "127.0.0.1:8080")]))).refusal is None
    assert Exposure("127.0.0.1", ("*",)).hooked is False


async def test_auth_refuses_without_the_token_and_keeps_a_token_sent_as_the_key_from_upstream():
    out = await Context(Auth("t")).cycle(flows.flow())
    assert (out.refusal.status, out.refusal.kind) == (401, "unauthorized")
    f = flows.flow(headers=[("Authorization", "Bearer t")])
    assert (await Context(Auth("t")).cycle(f)).refusal is None
    assert not any(k.lower() == "authorization" for k in f.up_headers)
    g = flows.flow(headers=[("X-Toolproxy-Token", "t"), ("Authorization", "Bearer sk-user")])
    await Context(Auth("t")).cycle(g)
    assert g.up_headers["Authorization"] == "Bearer sk-user"
    # each SDK's own key header carries the token as well (Anthropic's x-api-key, Azure's api-key,
    # Gemini's x-goog-api-key); the header that carried it goes no further, the others do
    for name in ("x-api-key", "Api-Key", "X-Goog-Api-Key"):
        h = flows.flow(headers=[(name, "t"), ("Authorization", "Bearer sk-user")])
        assert (await Context(Auth("t")).cycle(h)).refusal is None, name
        assert {k.lower() for k in h.up_headers} & {name.lower()} == set() and h.up_headers[
            "Authorization"
        ] == "Bearer sk-user"
    wrong = await Context(Auth("t")).cycle(flows.flow(headers=[("x-api-key", "nope"), ("Authorization", "Bearer t2")]))
    assert (wrong.refusal.status, wrong.refusal.kind) == (401, "unauthorized")


async def test_recording_guard_refuses_while_recording_fails(tmp_path):
    writer = SegmentWriter(tmp_path)
    guard = RecordingGuard(writer)
    assert (await Context(guard).cycle(flows.flow())).refusal is None
    writer.stats.degraded, writer.stats.last_error = True, "disk gone"
    out = await Context(guard).cycle(flows.flow())
    assert (out.refusal.status, out.refusal.kind) == (503, "recording_failed") and "disk gone" in out.refusal.message


async def test_disk_budget_guard_refuses_while_the_housekeeper_says_full(tmp_path):
    keeper = Housekeeper(tmp_path, retain=None, max_bytes=1000, on_full="block")
    guard = DiskBudgetGuard(keeper)
    assert (await Context(guard).cycle(flows.flow())).refusal is None
    keeper.refusal = "the recordings are at --max-disk"
    out = await Context(guard).cycle(flows.flow())
    assert (out.refusal.status, out.refusal.kind, out.refusal.message) == (
        503,
        "disk_budget_full",
        "the recordings are at --max-disk",
    )


async def test_upstream_health_learns_of_an_unreachable_upstream_from_a_failed_connect():
    health = UpstreamHealth(flows.UPSTREAM, 1.0)
    await Context(health).cycle(flows.flow(), error=("timeout", "slow"))  # not a connect failure
    assert health.reachable is None
    await Context(health).cycle(flows.flow(), error=("connect", "refused"))
    assert (health.reachable, health.last_error, health.source) == (False, "refused", "exchange")
    assert health.service().name == "upstream health"


async def test_pool_settles_a_wait_that_ended_in_an_error():
    pool = PoolStats(2)
    f = flows.flow()
    f.pool_queued_at = f.t0
    pool.waiting = 1
    await Context(pool).cycle(f, error=("client_closed", "gone"))
    assert (pool.waiting, pool.waited, f.pool_queued_at) == (0, 1, None) and f.pool_wait >= 0.0
    assert PoolStats(0).hooked is False and pool.stats()["upstream_pool"]["limit"] == 2


async def test_stack_watch_queues_a_chat_body_and_nothing_else(tmp_path):
    watch = StackWatch(flows.config(data_dir=tmp_path), SegmentWriter(tmp_path), lambda: None)
    await Context(watch).cycle(flows.flow(body=b'{"model": "m"}'))
    await Context(watch).cycle(flows.flow("/v1/models", method="GET"))
    assert list(watch._pending) == ['{"model": "m"}']
    assert watch.stats() == {"stack": None}  # nothing fingerprinted yet


async def test_condition_rewrites_what_goes_upstream_and_the_reply(tmp_path):
    cfg = flows.config(data_dir=tmp_path)
    condition = ConditionAddon(cfg.condition_options, lambda: None, Redactor(flows.KEY))
    body = (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
        b'"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}'
    )
    native = flows.flow(body=body)
    await Context(condition).cycle(native)
    assert native.body == body and native.rec.upstream_request is None
    text = flows.flow("/t/condition=text/v1/chat/completions", body=body)
    await Context(condition).cycle(text)
    assert text.body != body and b'"tools"' not in text.body, text.rec.condition_note
    assert text.rec.upstream_request["path"] == "/v1/chat/completions" and text.stream is not None


async def test_model_swap_sends_the_tagged_model_and_the_condition_keeps_it(tmp_path):
    """The tag's model goes upstream (the condition rewrites the swapped body, the stack watcher
    reads the body as sent); the harness's body stays the record's request_body."""
    cfg = flows.config(data_dir=tmp_path)
    redactor = Redactor(flows.KEY)
    body = (
        b'{"model":"harness-m","messages":[{"role":"user","content":"hi"}],'
        b'"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}'
    )
    ctx = Context(ModelSwap(redactor), ConditionAddon(cfg.condition_options, lambda: None, redactor))
    native = flows.flow("/t/run=r/upstream_model=qwen%2F0.5b/v1/chat/completions", body=body)
    await ctx.cycle(native)
    assert json.loads(native.body) == {**json.loads(body), "model": "qwen/0.5b"}
    assert native.rec.extra["model_sent"] == "qwen/0.5b" and native.rec.request_body == body.decode()
    assert json.loads(native.rec.upstream_request["body"])["model"] == "qwen/0.5b"
    text = flows.flow("/t/condition=text/upstream_model=q/v1/chat/completions", body=body)
    await ctx.cycle(text)
    assert json.loads(text.body)["model"] == "q" and b'"tools"' not in text.body
    assert json.loads(text.rec.upstream_request["body"])["model"] == "q"


@pytest.mark.parametrize(
    "path, method, body, note",
    [
        ("/t/upstream_model=q/v1/models", "GET", b"", None),  # not a model call: nothing to rewrite
        ("/v1/chat/completions", "POST", b'{"model":"m","messages":[]}', None),  # untagged
        ("/t/upstream_model=q/v1/chat/completions", "POST", b"[1, 2]", "the request body is not a JSON object"),
        ("/t/upstream_model=q/v1/chat/completions", "POST", b"\xff{", "the request body is not a JSON object"),
    ],
)
async def test_model_swap_leaves_alone_what_it_cannot_or_need_not_rewrite(path, method, body, note):
    f = flows.flow(path, method=method, body=body)
    await Context(ModelSwap(Redactor(flows.KEY))).cycle(f)
    assert f.body == body and f.rec.upstream_request is None and "model_sent" not in f.rec.extra
    assert f.rec.extra.get("model_not_sent") == note


async def test_model_swap_of_a_body_already_naming_the_model_sends_it_as_it_came():
    body = b'{"model": "q",  "messages": []}'
    f = flows.flow("/t/upstream_model=q/api/chat", body=body)
    await Context(ModelSwap(Redactor(flows.KEY))).cycle(f)
    assert f.body == body and f.rec.upstream_request is None and f.rec.extra["model_sent"] == "q"


async def test_durability_holds_the_end_of_a_durable_response(tmp_path):
    durability = Durability(SegmentWriter(tmp_path))
    loose = flows.flow()
    await Context(durability).cycle(loose, flows.response())
    assert loose.hold is None
    sync = flows.flow(durable=True)
    await Context(durability).cycle(sync, flows.response(body=b'{"a": 1}'))
    assert sync.hold.remaining == len(b'{"a": 1}') and sync.hold.headers_only is False  # from its Content-Length


async def test_recorder_writes_one_record_per_flow_and_refusals_to_their_budget(tmp_path):
    writer = SegmentWriter(tmp_path, window=0.01)
    refused = SegmentWriter(tmp_path, window=0.01, stream="refusals")
    budget = RefusalBudget(refused, writer, flows.UPSTREAM, lambda t: None, Redactor(flows.KEY))
    recorder = Recorder(writer, 1 << 20, str(tmp_path / "spill"), Redactor(flows.KEY), 1 << 20, budget)
    writer.start()
    refused.start()
    try:
        await Context(recorder).cycle(
            flows.flow(headers=[("Authorization", "Bearer sk-live")]), flows.response(body=b'{"ok": true}')
        )
        await Context(Auth("t"), recorder).cycle(flows.flow())
    finally:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, writer.close)
        await loop.run_in_executor(None, refused.close)
    answered, refusal = sorted(read_records(tmp_path, kind="exchange"), key=lambda r: r["error_kind"] is not None)
    assert (answered["status"], answered["response_body"], answered["response_complete"]) == (200, '{"ok": true}', True)
    assert "sk-live" not in str(answered["request_headers"])
    assert (refusal["error_kind"], refusal["client_status"]) == ("unauthorized", 401)
    assert budget.report()["by_kind"] == {"unauthorized": 1} and budget.recorded == 1


async def test_a_cut_response_ends_as_an_error_with_what_was_kept(tmp_path):
    recorder = Recorder(
        SegmentWriter(tmp_path),
        1 << 20,
        str(tmp_path / "spill"),
        Redactor(flows.KEY),
        4,
        RefusalBudget(
            SegmentWriter(tmp_path), SegmentWriter(tmp_path), flows.UPSTREAM, lambda t: None, Redactor(flows.KEY)
        ),
    )
    f = flows.flow()
    out = await Context(recorder).cycle(f, flows.Response.of(200, (), b"abc", b"defg"))
    assert out.cut.kind == "response_too_large" and f.rec.error_kind == "response_too_large"
    assert f.rec.response_body == "abc" and f.ended


async def test_watchdog_is_a_service_and_no_hook():
    dog = Watchdog()
    assert dog.service().name == "watchdog" and Hooks([dog]).request_headers == () and dog.stats() == {}


async def test_the_live_view_and_otlp_listen_on_the_recorded_hook(tmp_path):
    state = _state(tmp_path, otlp_endpoint="http://127.0.0.1:9/v1/traces")
    ctx = Context(*state.hooks.addons)
    ctx.recorded(flows.record(status=200, path="/v1/chat/completions"))
    ctx.recorded(flows.record(kind="probe"))  # the proxy's own probe: neither counts it
    otlp = next(a for a in state.hooks.addons if a.stats_key == "otlp")
    assert state.live.observed == 1 and otlp.report()["observed"] == 1


def test_every_addon_fills_only_keys_the_stats_know(tmp_path):
    state = _state(
        tmp_path, mask=("email",), retain_seconds=60.0, sample=0.5, otlp_endpoint="http://127.0.0.1:9/v1/traces"
    )
    for addon in addons(state.config, ProxyState(state.config, state.writer)):
        assert set(addon.stats()) <= set(STATS_KEYS), addon


def test_a_part_without_a_service_starts_nothing():
    assert Part(stats_key="x", report=dict).service() is None
    assert Part(Service("s", lambda: None, lambda: None)).service().name == "s"
