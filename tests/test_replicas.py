"""Many replicas, one dataset: three proxies on "different hosts" (distinct replica names, clocks
skewed by minutes) share one data directory behind a round-robin balancer, and analyse to exactly
the turns, outcomes and metrics that one proxy records from the same traffic.

The skew is real as far as the analyzer can tell: TOOLPROXY_TEST_CLOCK_OFFSET shifts every time
and id a proxy stamps, as a host whose clock is off would. The offsets (minutes) exceed the whole
traffic's duration, so clock order puts most later turns before the turns they continue.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from itertools import count

from proxyprocess import sql_rows, toolproxy_cli

from toolproxy.emulators import call, error, text
from toolproxy.record.segments import list_segments

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CITIES = ["Oslo", "Paris", "Lima", "Pune", "Kyiv", "Doha"]
SKEWS = {"replica-a": 0.0, "replica-b": -240.0, "replica-c": 180.0}
PROXY_ARGS = ("--quiet", "--no-fingerprint", "--no-live-page", "--durability", "sync")


def post(url: str, path: str, body: dict) -> tuple[int, dict | str]:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read().decode()
            return r.status, raw if body.get("stream") else json.loads(raw)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def drive(fake, urls: list[str]) -> int:
    """Six three-turn episodes, interleaved turn by turn, every request (retries included) sent to
    the next proxy in turn. Half are tagged episodes, half untagged (chained by content); some
    turns fail once and are retried on the next proxy; one episode ends in a call to a tool that
    was never offered, one answers as a stream. Returns the number of requests sent."""
    sent = count()

    def send(path: str, body: dict, reply, fail_first: bool) -> dict | str:
        if fail_first:
            fake.enqueue(error(503, "server overloaded, retry later"))
            status, _ = post(urls[next(sent) % len(urls)], path, body)
            assert status == 503
        fake.enqueue(reply)
        status, out = post(urls[next(sent) % len(urls)], path, body)
        assert status == 200, out
        return out

    episodes = []
    for k in range(6):
        tagged = k % 2 == 0
        path = f"/t/run=fleet/episode=e{k}/v1/chat/completions" if tagged else "/t/run=fleet/v1/chat/completions"
        messages = [
            {"role": "system", "content": "You are a weather agent."},
            {"role": "user", "content": f"Weather in {CITIES[k]}, then {CITIES[(k + 1) % 6]}?"},
        ]
        episodes.append((k, tagged, path, messages))
    for turn in range(3):
        for k, tagged, path, messages in episodes:
            if turn < 2:
                reply = call("get_weather", {"city": CITIES[(k + turn) % 6]})
            elif k == 3:
                reply = call("get_stock_price", {"ticker": "ACME"})
            else:
                reply = text(f"{CITIES[k]} 5C, {CITIES[(k + 1) % 6]} 9C.")
            stream = turn == 2 and k == 4
            # A first turn is retried only when tagged: untagged, a failed first request and an
            # answered one cannot be told from two episodes that began alike (analysis/episodes/build.py).
            fail_first = (tagged and turn == 0 and k != 4) or (turn == 1 and k in (1, 2))
            out = send(
                path,
                {"model": "gpt-4o-mini", "messages": messages, "tools": TOOLS, "stream": stream},
                reply,
                fail_first,
            )
            if turn < 2:
                msg = out["choices"][0]["message"]
                (tc,) = msg["tool_calls"]
                messages += [msg, {"role": "tool", "tool_call_id": tc["id"], "content": f"{5 + turn}C"}]
    return next(sent)


# Every episode with its turns, named by what the traffic says (tagged name, or item key: a hash
# of the first request's content), never by exchange ids, which differ between the two recordings.
EPISODES = """
SELECT CASE WHEN e.reconstructed THEN NULL ELSE e.episode END AS name, e.reconstructed, e.item_key, e.n_turns,
       e.looping, list([t.turn_index::VARCHAR, t.outcome, t.sub_kind, t.n_attempts::VARCHAR, t.n_calls::VARCHAR,
                        t.role, t.delivered::VARCHAR, t.is_last::VARCHAR] ORDER BY t.turn_index) AS turns
FROM episodes e JOIN turns t USING (episode_key) GROUP BY ALL ORDER BY ALL
"""


def analysed(data) -> tuple[list, list, dict]:
    r = toolproxy_cli("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    r = toolproxy_cli("report", "--data", str(data), "--format", "json")
    assert r.returncode == 0, r.stderr
    outcomes = sql_rows(data, "SELECT outcome, sub_kind, count(*) AS n FROM turns GROUP BY ALL ORDER BY ALL")
    report = json.loads(r.stdout)
    del report["source"], report["generated_at"]  # where and when, not what
    for run in report["runs"]:
        del run["ttfb_median_ms"], run["ttft_median_ms"]  # how fast this machine answered, not what
    return sql_rows(data, EPISODES), outcomes, report


def test_three_skewed_replicas_sharing_a_data_dir_analyse_like_one_proxy(fake_stack, proxy, tmp_path):
    shared = tmp_path / "shared"
    fake = fake_stack("openai")
    replicas = [
        proxy(
            fake.url,
            *PROXY_ARGS,
            data=shared,
            env={"TOOLPROXY_REPLICA": name, "TOOLPROXY_TEST_CLOCK_OFFSET": str(skew)},
        )
        for name, skew in SKEWS.items()
    ]
    n = drive(fake, [p.url for p in replicas])
    for p in replicas:
        assert p.stop() == 0
    alone = proxy(fake.url, *PROXY_ARGS, data=tmp_path / "alone")
    assert drive(fake, [alone.url]) == n == 22
    assert alone.stop() == 0

    # Each replica writes its own segments, named for it; ids stay unique across them.
    writers = {seg.name.removesuffix(".jsonl").split("-", 3)[3] for seg in list_segments(shared)}
    assert writers == set(SKEWS)
    fleet, alone_ = analysed(shared), analysed(tmp_path / "alone")
    ids = sql_rows(shared, "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM exchanges")
    # The clocks really disagree: by the recorded times, a request began before one whose reply it carries.
    inverted = sql_rows(
        shared,
        """
        SELECT count(*) AS n FROM exchanges x JOIN exchanges earlier
          ON earlier.episode = x.episode AND earlier.n_messages < x.n_messages
        WHERE x.started_at < earlier.started_at""",
    )
    assert ids == [{"n": n, "ids": n}] and inverted[0]["n"] >= 3

    episodes, outcomes, report = fleet
    assert episodes == alone_[0]
    assert outcomes == alone_[1]
    assert report == alone_[2]
    # ... and the result is the traffic's: six episodes of three turns, the retries one turn each.
    assert len(episodes) == 6 and all(e["n_turns"] == 3 for e in episodes)
    assert sum(e["reconstructed"] for e in episodes) == 3
    assert outcomes == [
        {"outcome": "hallucinated_call", "sub_kind": None, "n": 1},
        {"outcome": "prose", "sub_kind": None, "n": 5},
        {"outcome": "valid_call", "sub_kind": None, "n": 12},
    ]
    attempts = sorted(int(t[3]) for e in episodes for t in e["turns"])
    assert attempts == [1] * 14 + [2] * 4
