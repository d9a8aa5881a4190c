"""The DuckDB schema as numbered steps.

A step, once released, is never edited: a database created by an older toolproxy is brought up to
date by running the steps it has not seen, in order. Change the schema by appending a step.
Other code (reports, `toolproxy sql` users, any DuckDB client) reads these tables directly, so
their names and columns are a public interface: add, never rename.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "exchanges, tool sets, turns, calls, episodes, runs, fingerprints, ingest bookkeeping",
        """
        CREATE TABLE exchanges (
            id VARCHAR PRIMARY KEY,
            kind VARCHAR,
            started_at TIMESTAMP,
            ended_at TIMESTAMP,
            ttfb_ms DOUBLE,
            duration_ms DOUBLE,
            run VARCHAR,
            episode VARCHAR,
            item VARCHAR,
            condition VARCHAR,
            tags JSON,
            upstream VARCHAR,
            method VARCHAR,
            path VARCHAR,
            query VARCHAR,
            status INTEGER,
            client_status INTEGER,
            error_kind VARCHAR,
            error_message VARCHAR,
            is_attempt BOOLEAN,
            streamed BOOLEAN,
            model VARCHAR,
            prompt_tokens BIGINT,
            completion_tokens BIGINT,
            cached_tokens BIGINT,
            tool_set VARCHAR,
            request_body VARCHAR,
            request_body_encoding VARCHAR,
            response_body VARCHAR,
            response_body_encoding VARCHAR,
            client_body VARCHAR,
            client_body_encoding VARCHAR,
            upstream_request JSON,
            condition_note VARCHAR,
            request_headers JSON,
            response_headers JSON,
            segment VARCHAR,
            segment_offset BIGINT,
            record JSON,
            -- per-exchange classification (docs/analysis.md), the attempt's view
            outcome VARCHAR,
            sub_kind VARCHAR,
            surface VARCHAR,
            n_calls INTEGER,
            finish_reason VARCHAR,
            content VARCHAR,
            reasoning_content VARCHAR,
            upstream_content VARCHAR,
            harness_saw_prose BOOLEAN,
            stack_marker VARCHAR,
            stack_marker_version VARCHAR,
            -- conversation-state keys for grouping attempts into turns and episodes
            n_messages INTEGER,
            state_hash VARCHAR,
            chain_hash VARCHAR,
            parent_hashes VARCHAR[],
            item_hash VARCHAR,
            call_signature VARCHAR,
            turn_id VARCHAR
        );
        CREATE TABLE tool_sets (hash VARCHAR PRIMARY KEY, tools JSON, names VARCHAR[]);
        CREATE TABLE turns (
            turn_id VARCHAR PRIMARY KEY,
            run VARCHAR,
            episode_key VARCHAR,
            turn_index INTEGER,
            item_key VARCHAR,
            category VARCHAR,
            condition VARCHAR,
            model VARCHAR,
            outcome VARCHAR,
            sub_kind VARCHAR,
            surface VARCHAR,
            n_attempts INTEGER,
            n_calls INTEGER,
            final_exchange_id VARCHAR,
            finish_reason VARCHAR,
            harness_saw_prose BOOLEAN,
            content VARCHAR
        );
        CREATE TABLE calls (
            turn_id VARCHAR,
            exchange_id VARCHAR,
            idx INTEGER,
            name VARCHAR,
            arguments_raw VARCHAR,
            arguments JSON,
            surface VARCHAR,
            format VARCHAR,
            offered BOOLEAN,
            validated BOOLEAN,
            valid BOOLEAN,
            schema_errors JSON
        );
        CREATE TABLE episodes (
            episode_key VARCHAR PRIMARY KEY,
            run VARCHAR,
            episode VARCHAR,
            reconstructed BOOLEAN,
            item_key VARCHAR,
            category VARCHAR,
            n_turns INTEGER,
            looping BOOLEAN,
            loop_reason VARCHAR
        );
        CREATE TABLE runs (
            run VARCHAR PRIMARY KEY,
            stack VARCHAR,
            stack_version VARCHAR,
            model VARCHAR,
            condition VARCHAR,
            n_exchanges INTEGER,
            n_episodes INTEGER,
            n_turns INTEGER,
            first_seen TIMESTAMP,
            last_seen TIMESTAMP
        );
        CREATE TABLE fingerprints (
            id VARCHAR PRIMARY KEY,
            run VARCHAR,
            upstream VARCHAR,
            recorded_at TIMESTAMP,
            stack VARCHAR,
            stack_version VARCHAR,
            model VARCHAR,
            record JSON,
            segment VARCHAR,
            segment_offset BIGINT
        );
        CREATE TABLE ingest_state (
            segment VARCHAR PRIMARY KEY,
            byte_offset BIGINT,
            size_seen BIGINT,
            n_records BIGINT,
            updated_at TIMESTAMP
        );
        CREATE TABLE ingest_issues (
            segment VARCHAR,
            byte_offset BIGINT,
            kind VARCHAR,
            message VARCHAR,
            seen_at TIMESTAMP,
            PRIMARY KEY (segment, byte_offset, kind)
        );
        """,
    ),
    (
        2,
        "turn roles, expectations, delivered calls; analyzer version on every derived row",
        """
        ALTER TABLE exchanges ADD COLUMN tool_results INTEGER;
        ALTER TABLE exchanges ADD COLUMN analyzer_version INTEGER;
        ALTER TABLE calls ADD COLUMN analyzer_version INTEGER;
        ALTER TABLE turns ADD COLUMN role VARCHAR;
        ALTER TABLE turns ADD COLUMN expect VARCHAR;
        ALTER TABLE turns ADD COLUMN delivered BOOLEAN;
        ALTER TABLE turns ADD COLUMN offered_tools BOOLEAN;
        ALTER TABLE turns ADD COLUMN tool_results INTEGER;
        ALTER TABLE turns ADD COLUMN saw_result BOOLEAN;
        ALTER TABLE turns ADD COLUMN is_last BOOLEAN;
        ALTER TABLE turns ADD COLUMN analyzer_version INTEGER;
        ALTER TABLE episodes ADD COLUMN expect VARCHAR;
        ALTER TABLE episodes ADD COLUMN tags JSON;
        ALTER TABLE episodes ADD COLUMN analyzer_version INTEGER;
        ALTER TABLE runs ADD COLUMN analyzer_version INTEGER;
        -- what the derived tables were built under: the analyzer version and the expectation rules
        CREATE TABLE analyzer_state (key VARCHAR PRIMARY KEY, value JSON);
        """,
    ),
    (
        3,
        "ingest_issues names the record a set-aside line held, when it had an id",
        "ALTER TABLE ingest_issues ADD COLUMN record_id VARCHAR;",
    ),
    (
        4,
        "bodies stay in the segments (read by segment and offset), no longer copied into exchanges",
        """
        ALTER TABLE exchanges DROP COLUMN request_body;
        ALTER TABLE exchanges DROP COLUMN request_body_encoding;
        ALTER TABLE exchanges DROP COLUMN response_body;
        ALTER TABLE exchanges DROP COLUMN response_body_encoding;
        ALTER TABLE exchanges DROP COLUMN client_body;
        ALTER TABLE exchanges DROP COLUMN client_body_encoding;
        """,
    ),
    (
        5,
        "turns and episodes without primary keys: derive deletes and rewrites a run's rows whole, and "
        "the key's index made each deleted row cost ~30 us (re-deriving a run of 14k turns took 3x as long)",
        """
        CREATE TABLE turns_v5 AS SELECT * FROM turns;
        DROP TABLE turns;
        ALTER TABLE turns_v5 RENAME TO turns;
        CREATE TABLE episodes_v5 AS SELECT * FROM episodes;
        DROP TABLE episodes;
        ALTER TABLE episodes_v5 RENAME TO episodes;
        """,
    ),
    (
        6,
        "prompt protocols, the keys that tell identical episodes apart and follow harness retries and "
        "wrap-ups, harness rejections and finishing calls",
        """
        ALTER TABLE exchanges ADD COLUMN protocol VARCHAR;
        ALTER TABLE exchanges ADD COLUMN reply_keys VARCHAR[];
        ALTER TABLE exchanges ADD COLUMN rejects BOOLEAN;
        ALTER TABLE exchanges ADD COLUMN finishes BOOLEAN;
        ALTER TABLE turns ADD COLUMN protocol VARCHAR;
        ALTER TABLE turns ADD COLUMN rejected BOOLEAN;
        ALTER TABLE turns ADD COLUMN finishes BOOLEAN;
        ALTER TABLE turns ADD COLUMN last_with_tools BOOLEAN;
        """,
    ),
    (
        7,
        "the harness whose finishing tool a request offered: its call, not prose, answers there",
        """
        ALTER TABLE exchanges ADD COLUMN finisher VARCHAR;
        ALTER TABLE turns ADD COLUMN finisher VARCHAR;
        """,
    ),
    (
        8,
        "the conversation keys of every reconstructed episode's turns: a new untagged attempt can only join "
        "the episodes its parent keys name, so a re-analyze derives those again instead of the whole run",
        "CREATE TABLE episode_keys (run VARCHAR, episode_key VARCHAR, key VARCHAR);",
    ),
    (
        9,
        "parent keys linear in an episode's length: a request stores the hash it continues before its last "
        "assistant message and the links back from there that its own messages add, not one hash per earlier "
        "assistant message (rows stored before keep their whole lists, which say the same)",
        """
        ALTER TABLE exchanges ADD COLUMN prior_hash VARCHAR;
        ALTER TABLE exchanges ADD COLUMN prefix_links VARCHAR[];
        """,
    ),
    (
        10,
        "the thread of a request's conversation (its first message after the system ones), so that a run's "
        "attempts are grouped into episodes a batch of threads at a time, in memory that does not grow with "
        "the run (rows stored before have none, and their runs are grouped whole as before)",
        "ALTER TABLE exchanges ADD COLUMN thread VARCHAR;",
    ),
    (
        11,
        "per run, how many of its exchanges have each model, condition, stack marker, upstream, kind and sample "
        "rate, so that a re-analyze adds the new exchanges to its row instead of aggregating the whole run again "
        "(runs derived "
        "before have none: their next analyze aggregates them once)",
        "CREATE TABLE run_tallies (run VARCHAR, field VARCHAR, value VARCHAR, n BIGINT);",
    ),
    (
        12,
        "coding agents: side requests apart from the task, time to first token beside first byte, and the keys "
        "and links that make a subagent's episode a child of the call that started it and a compacted task one "
        "task (rows stored before have none: the analyzer version changed, so analyze derives them again)",
        """
        ALTER TABLE exchanges ADD COLUMN side_request VARCHAR;
        ALTER TABLE exchanges ADD COLUMN ttft_ms DOUBLE;
        ALTER TABLE exchanges ADD COLUMN summary VARCHAR;
        ALTER TABLE exchanges ADD COLUMN continues VARCHAR;
        ALTER TABLE exchanges ADD COLUMN opening VARCHAR[];
        ALTER TABLE exchanges ADD COLUMN spawns VARCHAR[];
        ALTER TABLE episodes ADD COLUMN parent_episode VARCHAR;
        ALTER TABLE episodes ADD COLUMN parent_call VARCHAR;
        ALTER TABLE episodes ADD COLUMN link VARCHAR;
        ALTER TABLE episodes ADD COLUMN task_key VARCHAR;
        """,
    ),
    (
        13,
        "MCP traffic (toolproxy mcp): each request to an MCP server with its response, and each lone message, "
        "as rows of their own, never attempts",
        """
        CREATE TABLE mcp_exchanges (
            id VARCHAR PRIMARY KEY,
            record_id VARCHAR,
            run VARCHAR,
            episode VARCHAR,
            item VARCHAR,
            tags JSON,
            server VARCHAR,
            transport VARCHAR,
            session VARCHAR,
            event VARCHAR,
            sender VARCHAR,
            message VARCHAR,
            method VARCHAR,
            rpc_id VARCHAR,
            tool VARCHAR,
            arguments JSON,
            started_at TIMESTAMP,
            ended_at TIMESTAMP,
            duration_ms DOUBLE,
            status INTEGER,
            result VARCHAR,
            error_kind VARCHAR,
            error_code INTEGER,
            error_message VARCHAR,
            request_bytes BIGINT,
            response_bytes BIGINT,
            segment VARCHAR,
            segment_offset BIGINT,
            analyzer_version INTEGER
        );
        """,
    ),
]
