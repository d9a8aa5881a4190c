"""The columns of every table the analyzer writes, declared once.

Ingest, turn derivation and re-classification build their rows as dicts keyed by these names,
the inserts and the type checks read the types from here, and a migration step that adds a
column takes its type from here too (Table.add_columns). The numbered steps in migrations.py are
history and are never edited; tests/analysis/test_store.py checks that running them all gives
exactly the tables declared here, so changing a declaration without a step fails there.
"""

from __future__ import annotations

from toolproxy.analysis.store.columns import Columns


class Table:
    """A table's name and its columns (name -> DuckDB type) in table order."""

    def __init__(self, name: str, types: dict[str, str]) -> None:
        self.name = name
        self.types = types
        self.names = list(types)
        self.check = Columns(types)

    def columns_of(self, rows: list[dict]) -> dict[str, list]:
        """Rows (dicts keyed by column name, every name present) transposed to column lists."""
        return {name: [row[name] for row in rows] for name in self.names}

    def insert(self, con, columns: dict[str, list], *, on_conflict: str = "", fitted: bool = False) -> int:
        """Insert column lists (any subset of the table's columns); returns the row count."""
        from toolproxy.analysis.store.connection import insert_columns

        return insert_columns(
            con,
            self.name,
            columns,
            {name: self.types[name] for name in columns},
            on_conflict=on_conflict,
            fitted=fitted,
        )

    def add_columns(self, *names: str) -> str:
        """The SQL of a migration step that adds these declared columns to an existing table."""
        return "\n".join(f"ALTER TABLE {self.name} ADD COLUMN {name} {self.types[name]};" for name in names)


_V, _T, _J, _I, _B, _D, _BOOL = "VARCHAR", "TIMESTAMP", "JSON", "INTEGER", "BIGINT", "DOUBLE", "BOOLEAN"

EXCHANGES = Table(
    "exchanges",
    {
        # the record as received (see reanalyze: every other column is derived from these)
        "id": _V,
        "kind": _V,
        "started_at": _T,
        "ended_at": _T,
        "ttfb_ms": _D,
        "duration_ms": _D,
        "run": _V,
        "episode": _V,
        "item": _V,
        "condition": _V,
        "tags": _J,
        "upstream": _V,
        "method": _V,
        "path": _V,
        "query": _V,
        "status": _I,
        "client_status": _I,
        "error_kind": _V,
        "error_message": _V,
        # derived at ingest
        "is_attempt": _BOOL,
        "streamed": _BOOL,
        "model": _V,
        "prompt_tokens": _B,
        "completion_tokens": _B,
        "cached_tokens": _B,
        "tool_set": _V,
        # where the record is (its bodies are read from there: analysis/classify/bodies.py), and what else it said
        "upstream_request": _J,
        "condition_note": _V,
        "request_headers": _J,
        "response_headers": _J,
        "segment": _V,
        "segment_offset": _B,
        "record": _J,
        # the attempt's classification
        "outcome": _V,
        "sub_kind": _V,
        "surface": _V,
        "n_calls": _I,
        "finish_reason": _V,
        "content": _V,
        "reasoning_content": _V,
        "upstream_content": _V,
        "harness_saw_prose": _BOOL,
        "stack_marker": _V,
        "stack_marker_version": _V,
        # conversation-state keys that group attempts into turns and episodes
        "n_messages": _I,
        "state_hash": _V,
        "chain_hash": _V,
        "parent_hashes": "VARCHAR[]",
        "item_hash": _V,
        "call_signature": _V,
        # set when turns are derived
        "turn_id": _V,
        "tool_results": _I,
        "analyzer_version": _I,
        # the prompt protocol the request was read under (analysis.classify.protocols), the other keys a later
        # request names its reply by, whether it says the harness rejected the reply before it, and
        # whether its reply ends the episode through the harness's finishing tool; the harness whose
        # finishing tool the request offered (analysis.classify.harnesses: its call, not prose, is the answer)
        "protocol": _V,
        "reply_keys": "VARCHAR[]",
        "rejects": _BOOL,
        "finishes": _BOOL,
        "finisher": _V,
        # the rolling hash after the assistant message before the last, and the links back from there
        # that this request adds (analysis.classify.keys: the parent keys beyond parent_hashes)
        "prior_hash": _V,
        "prefix_links": "VARCHAR[]",
        # the hash of the conversation's first message after its system ones (analysis.classify.keys.thread_key)
        "thread": _V,
        # what a harness asked for itself beside the task, if it was one (analysis.classify.sides), when
        # the reply's first token came (not a keep-alive comment: analysis.classify.firsttoken), and the
        # text keys that link the conversations of one task (analysis.episodes.links): the summary a
        # compaction returned, the summary a conversation goes on from, the texts a conversation opens
        # with, and the task each subagent-starting call of the reply gave ("KEY CALL_ID")
        "side_request": _V,
        "ttft_ms": _D,
        "summary": _V,
        "continues": _V,
        "opening": "VARCHAR[]",
        "spawns": "VARCHAR[]",
    },
)
TOOL_SETS = Table("tool_sets", {"hash": _V, "tools": _J, "names": "VARCHAR[]"})
TURNS = Table(
    "turns",
    {
        "turn_id": _V,
        "run": _V,
        "episode_key": _V,
        "turn_index": _I,
        "item_key": _V,
        "category": _V,
        "condition": _V,
        "model": _V,
        "outcome": _V,
        "sub_kind": _V,
        "surface": _V,
        "n_attempts": _I,
        "n_calls": _I,
        "final_exchange_id": _V,
        "finish_reason": _V,
        "harness_saw_prose": _BOOL,
        "content": _V,
        "role": _V,
        "expect": _V,
        "delivered": _BOOL,
        "offered_tools": _BOOL,
        "tool_results": _I,
        "saw_result": _BOOL,
        "is_last": _BOOL,
        "analyzer_version": _I,
        "protocol": _V,
        "rejected": _BOOL,
        "finishes": _BOOL,
        "last_with_tools": _BOOL,
        "finisher": _V,
    },
)
CALLS = Table(
    "calls",
    {
        "turn_id": _V,
        "exchange_id": _V,
        "idx": _I,
        "name": _V,
        "arguments_raw": _V,
        "arguments": _J,
        "surface": _V,
        "format": _V,
        "offered": _BOOL,
        "validated": _BOOL,
        "valid": _BOOL,
        "schema_errors": _J,
        "analyzer_version": _I,
    },
)
EPISODES = Table(
    "episodes",
    {
        "episode_key": _V,
        "run": _V,
        "episode": _V,
        "reconstructed": _BOOL,
        "item_key": _V,
        "category": _V,
        "n_turns": _I,
        "looping": _BOOL,
        "loop_reason": _V,
        "expect": _V,
        "tags": _J,
        "analyzer_version": _I,
        # the episode this one is a subagent of (started by its call parent_call) or goes on from after a
        # compaction (link), and the task it belongs to: the root of its tree, itself when it has no parent
        "parent_episode": _V,
        "parent_call": _V,
        "link": _V,
        "task_key": _V,
    },
)
RUNS = Table(
    "runs",
    {
        "run": _V,
        "stack": _V,
        "stack_version": _V,
        "model": _V,
        "condition": _V,
        "n_exchanges": _I,
        "n_episodes": _I,
        "n_turns": _I,
        "first_seen": _T,
        "last_seen": _T,
        "analyzer_version": _I,
    },
)
FINGERPRINTS = Table(
    "fingerprints",
    {
        "id": _V,
        "run": _V,
        "upstream": _V,
        "recorded_at": _T,
        "stack": _V,
        "stack_version": _V,
        "model": _V,
        "record": _J,
        "segment": _V,
        "segment_offset": _B,
    },
)
INGEST_STATE = Table(
    "ingest_state",
    {
        "segment": _V,
        "byte_offset": _B,
        "size_seen": _B,
        "n_records": _B,
        "updated_at": _T,
    },
)
INGEST_ISSUES = Table(
    "ingest_issues",
    {
        "segment": _V,
        "byte_offset": _B,
        "kind": _V,
        "message": _V,
        "seen_at": _T,
        "record_id": _V,
    },
)
ANALYZER_STATE = Table("analyzer_state", {"key": _V, "value": _J})
# Per reconstructed episode, the keys later requests name its turns by (analysis.episodes.order.chain_keys).
EPISODE_KEYS = Table("episode_keys", {"run": _V, "episode_key": _V, "key": _V})
# Per run, field (model, condition, marker, marker_version, upstream, kind, sample_rate) and value: how many
# of its exchanges (attempts, for model and condition) have it; its row's most common ones are read here
# (derive._RUNS_SQL), and analyze's line about sampled runs.
RUN_TALLIES = Table("run_tallies", {"run": _V, "field": _V, "value": _V, "n": _B})

# One row per MCP request with its response, or lone message, of an MCP record (analysis.classify.mcp):
# never an attempt, so in no model's metric.
MCP_EXCHANGES = Table(
    "mcp_exchanges",
    {
        "id": _V,
        "record_id": _V,
        "run": _V,
        "episode": _V,
        "item": _V,
        "tags": _J,
        "server": _V,
        "transport": _V,
        "session": _V,
        "event": _V,
        "sender": _V,
        "message": _V,
        "method": _V,
        "rpc_id": _V,
        "tool": _V,
        "arguments": _J,
        "started_at": _T,
        "ended_at": _T,
        "duration_ms": _D,
        "status": _I,
        "result": _V,
        "error_kind": _V,
        "error_code": _I,
        "error_message": _V,
        "request_bytes": _B,
        "response_bytes": _B,
        "segment": _V,
        "segment_offset": _B,
        "analyzer_version": _I,
    },
)

TABLES = [
    EXCHANGES,
    TOOL_SETS,
    TURNS,
    CALLS,
    EPISODES,
    RUNS,
    FINGERPRINTS,
    INGEST_STATE,
    INGEST_ISSUES,
    ANALYZER_STATE,
    EPISODE_KEYS,
    RUN_TALLIES,
    MCP_EXCHANGES,
]
