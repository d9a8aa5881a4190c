"""The profile's attribution: which part a sample belongs to, and how thread CPU is split (pure)."""

from __future__ import annotations

import collections

import pytest

from benchmarks import profiling as bp

ROOT = [
    "_run_module_as_main (<frozen runpy>:198)",
    "run (toolproxy/proxy/app.py:271)",
    "Runner.run (asyncio/runners.py:118)",
]

PART_CASES = [
    # innermost frame that names a part wins
    (
        ROOT
        + [
            "serve_request (toolproxy/proxy/forward.py:78)",
            "_handle (toolproxy/proxy/forward.py:160)",
            "split_path_tags (toolproxy/proxy/tags.py:21)",
        ],
        "request: path tags, query redaction",
    ),
    (
        ROOT
        + ["_relay (toolproxy/proxy/forward.py:372)", "_relay.<locals>.<listcomp> (toolproxy/proxy/forward.py:372)"],
        "headers: copied up and down",
    ),
    (
        ROOT
        + [
            "Hooks.end (toolproxy/proxy/flow.py:143)",
            "Recorder.response_end (toolproxy/proxy/recorder.py:64)",
            "Redactor.record_headers (toolproxy/proxy/headers.py:100)",
        ],
        "headers: redacted for the record",
    ),
    (
        ROOT
        + [
            "Hooks.end (toolproxy/proxy/flow.py:143)",
            "Recorder.response_end (toolproxy/proxy/recorder.py:77)",
            "SegmentWriter.submit (toolproxy/record/writer.py:210)",
            "encode_record (toolproxy/record/model.py:170)",
        ],
        "record: serialised on the loop (orjson)",
    ),
    (
        ROOT + ["Hooks.end (toolproxy/proxy/flow.py:143)", "Counters.response_end (toolproxy/proxy/counters.py:25)"],
        "other addons' hooks (counters, exposure, health, durability, ...)",
    ),
    (
        ROOT
        + [
            "serve_request (toolproxy/proxy/forward.py:75)",
            "Flow.__init__ (toolproxy/proxy/flow.py:63)",
            "new_id (toolproxy/record/model.py:71)",
        ],
        "record: Flow and Record built (ids, clocks, body text)",
    ),
    # modules both sides use name no part: the caller decides
    (
        ROOT
        + [
            "_send (toolproxy/proxy/forward.py:324)",
            "ClientRequest.write_bytes (aiohttp/client_reqrep.py:1594)",
            "BytesPayload.write_with_length (aiohttp/payload.py:415)",
            "StreamWriter._writelines (aiohttp/http_writer.py:116)",
        ],
        "aiohttp client: request upstream, read its reply",
    ),
    (
        ROOT
        + [
            "_relay (toolproxy/proxy/forward.py:417)",
            "StreamResponse.write (aiohttp/web_response.py:565)",
            "StreamWriter._writelines (aiohttp/http_writer.py:116)",
        ],
        "aiohttp server: response headers and writes",
    ),
    (ROOT + ["_relay (toolproxy/proxy/forward.py:396)"], "the handler (forward.py, bench.py)"),
    (
        ["run_app (aiohttp/web.py:502)", "_bare_app.<locals>.handle (benchmarks/proxy.py:159)"],
        "the handler (forward.py, bench.py)",
    ),
    (
        ["run_app (aiohttp/web.py:502)", "Application._handle (aiohttp/web_app.py:563)"],
        "aiohttp Application and router",
    ),
    # no Python frame of either: the loop's own work
    (ROOT, bp.EVENT_LOOP),
    ([], bp.EVENT_LOOP),
]


@pytest.mark.parametrize("frames,part", PART_CASES)
def test_part_of(frames, part):
    assert bp.part_of(frames) == part


PROXY = 'process 100:"python -m toolproxy.cli serve --upstream http://127.0.0.1:1"'
CLASSIFIER = 'process 101:"python -m toolproxy.live.classifier 13 16  300 200"'
RAW = "\n".join(
    [
        f"{PROXY};thread (100): MainThread;" + ";".join(ROOT) + ";_relay (toolproxy/proxy/forward.py:396) 3",
        f"{PROXY};thread (100): MainThread;" + ";".join(ROOT) + " 1",
        f"{PROXY};thread (102): toolproxy-writer;Thread.run (threading.py:982);SegmentWriter._run "
        "(toolproxy/record/writer.py:315);"
        "SegmentWriter._append (toolproxy/record/writer.py:600) 2",
        f"{PROXY};thread (102): toolproxy-writer;Thread.run (threading.py:982);SegmentWriter._run "
        "(toolproxy/record/writer.py:315) 2",
        f"{PROXY};thread (103): toolproxy-fsync;Thread.run (threading.py:982) 1",
        f"{CLASSIFIER};thread (101): MainThread;run (toolproxy/live/classifier.py:70) 5",
        "a line that is not a sample",
        # a command line with a ';' of its own (python -c "a; b") does not hide the thread
        'process 106:"python -c import sys; main() serve";thread (106): MainThread;' + ";".join(ROOT) + " 1",
    ]
)


def test_samples_split_each_threads_cpu_by_their_parts():
    samples = bp.read_samples(RAW)
    assert samples[100][2] == collections.Counter({"the handler (forward.py, bench.py)": 3, bp.EVENT_LOOP: 1})
    assert samples[102][2] == collections.Counter({"writer: write(2) of each batch": 2, bp.WRITER_OTHER: 2})
    assert samples[101][2] == collections.Counter({bp.CLASSIFIER: 5})
    assert samples[106][2] == collections.Counter({bp.EVENT_LOOP: 1})
    cpu = {
        100: (100, "python", 0.8),
        102: (100, "toolproxy-write", 0.2),
        103: (100, "toolproxy-fsync", 0.0),
        101: (101, "python", 0.1),
        104: (100, "uv-thread", 0.01),
        105: (200, "python", 0.02),
    }
    us = bp.attribute(samples, cpu, 1000, {100})  # 1,000 requests: 1 s of CPU is 1,000 us per request
    assert us == pytest.approx(
        {
            "the handler (forward.py, bench.py)": 600.0,
            bp.EVENT_LOOP: 200.0,
            "writer: write(2) of each batch": 100.0,
            bp.WRITER_OTHER: 100.0,
            bp.CLASSIFIER: 100.0,
            "unsampled thread (uv-thread)": 10.0,
            bp.OTHER_PROCESS: 20.0,
        }
    )
    assert sum(us.values()) == pytest.approx(1130.0)  # every CPU second is somewhere


def test_breakdown_table_has_every_part_and_the_difference_to_the_floor():
    table = bp.breakdown_table({"toolproxy": {"a": 10.0, "b": 5.0}, "floor": {"a": 8.0, "c": 1.0}}, "floor")
    lines = table.splitlines()
    assert lines[0] == "| part (CPU us per request) | toolproxy | floor | toolproxy - floor |"
    assert (
        "| a | 10.0 | 8.0 | +2.0 |" in lines
        and "| b | 5.0 | 0.0 | +5.0 |" in lines
        and "| c | 0.0 | 1.0 | -1.0 |" in lines
    )
    assert lines[-1] == "| **total** | **15.0** | **9.0** | **+6.0** |"
