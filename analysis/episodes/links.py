"""Episodes of one task: a subagent's episode under the call that started it, a compacted task going on.

A coding agent's task may be more than one conversation. Its Agent (or task) tool starts a
subagent: a conversation of its own, under another system prompt and tool set, whose task is the
call's argument and whose answer comes back as the call's result. Its compaction replaces the
history with a summary of it (a side request, analysis.classify.sides) and the task goes on from
there. Prefix chaining cannot follow either (the new conversation shares no prefix with the old),
so both are linked once a run's episodes are built, by what the requests carry: a conversation that
opens with the exact text of a delivered spawning call's argument, after that call, is its child
(parent episode and call id); one that opens with a summary a compaction returned goes on from the
episode that compaction summarised (link `compaction`). A task is then counted once: its episodes
form a tree whose root is the task (task_key), and per-task figures are over those trees.
"""

from __future__ import annotations

from toolproxy.analysis.episodes.roles import ROLE_SQL

SUBAGENT, COMPACTION = "subagent", "compaction"

# A link per episode at most: the child's parent episode, the call that started it, the kind. A
# subagent's parent is the episode whose turn's reply made the spawning call (the latest such
# before the child's first request, when several sent the same task); a compacted task's is the
# episode of the last turn of the compaction's conversation (its thread) before the compaction.
LINKS_SQL = """
WITH heads AS (
    SELECT t.run, t.episode_key, e.started_at AS at, e.opening, e.continues
    FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id
    WHERE t.run IN (SELECT unnest($runs::VARCHAR[])) AND t.turn_index = 0
      AND (e.opening IS NOT NULL OR e.continues IS NOT NULL)),
spawns AS (
    SELECT t.run, t.episode_key, e.started_at AS at, split_part(s, ' ', 1) AS k, split_part(s, ' ', 2) AS call_id
    FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id, unnest(e.spawns) AS u(s)
    WHERE t.run IN (SELECT unnest($runs::VARCHAR[])) AND e.spawns IS NOT NULL AND t.delivered),
children AS (
    SELECT h.episode_key, arg_max(s.episode_key, s.at) AS parent, arg_max(s.call_id, s.at) AS call_id
    FROM heads h, unnest(h.opening) AS o(k) JOIN spawns s ON s.run = h.run AND s.k = o.k
    WHERE s.at < h.at AND s.episode_key <> h.episode_key GROUP BY h.episode_key),
summaries AS (
    SELECT x.run, x.summary, x.started_at AS at,
           (SELECT arg_max(t.episode_key, e.started_at) FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id
            WHERE t.run = x.run AND e.thread = x.thread AND e.started_at < x.started_at) AS parent
    FROM exchanges x
    WHERE x.run IN (SELECT unnest($runs::VARCHAR[])) AND x.summary IS NOT NULL AND x.thread IS NOT NULL),
continued AS (
    SELECT h.episode_key, arg_max(s.parent, s.at) AS parent
    FROM heads h JOIN summaries s ON s.run = h.run AND s.summary = h.continues AND s.at < h.at
    WHERE s.parent IS NOT NULL AND s.parent <> h.episode_key GROUP BY h.episode_key)
SELECT episode_key, parent, call_id, 'subagent' FROM children
UNION ALL
SELECT episode_key, parent, NULL, 'compaction' FROM continued
WHERE episode_key NOT IN (SELECT episode_key FROM children)
"""


def roots(links: dict[str, str]) -> dict[str, str]:
    """Each linked episode's task: the root of its tree (episode -> parent links; a loop, which
    only colliding keys could make, ends at the first episode met again)."""
    out = {}
    for child in links:
        seen = {child}
        root = links[child]
        while root in links and links[root] not in seen:
            seen.add(root)
            root = links[root]
        out[child] = root
    return out


def link_episodes(con, runs: list[str]) -> int:
    """Link the runs' episodes into tasks (LINKS_SQL), set every episode's task_key, and let a
    compacted task's later turns count the tool results that came back before its compaction
    (their roles read again: an answer after the compaction is the task's answer). Returns the
    links made."""
    con.execute(
        "UPDATE episodes SET parent_episode = NULL, parent_call = NULL, link = NULL, task_key = episode_key "
        "WHERE run IN (SELECT unnest(?::VARCHAR[]))",
        [runs],
    )
    rows = con.execute(LINKS_SQL, {"runs": runs}).fetchall()
    if not rows:
        return 0
    parents = {child: parent for child, parent, _, _ in rows}
    tasks = roots(parents)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _links AS SELECT unnest(?::VARCHAR[]) AS child, unnest(?::VARCHAR[]) AS parent, "
        "unnest(?::VARCHAR[]) AS call_id, unnest(?::VARCHAR[]) AS link, unnest(?::VARCHAR[]) AS task",
        [
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [tasks[r[0]] for r in rows],
        ],
    )
    con.execute(
        "UPDATE episodes SET parent_episode = l.parent, parent_call = l.call_id, link = l.link, task_key = l.task "
        "FROM _links l WHERE episodes.episode_key = l.child"
    )
    # a compacted task goes on: its episode after the compaction saw what the one before it saw
    con.execute(f"""
        UPDATE turns SET saw_result = true, role = NULL WHERE episode_key IN (
            SELECT l.child FROM _links l WHERE l.link = '{COMPACTION}'
            AND EXISTS (SELECT 1 FROM turns p WHERE p.episode_key = l.parent AND p.saw_result))""")
    con.execute(
        f"UPDATE turns SET role = ({ROLE_SQL}) WHERE role IS NULL AND outcome <> 'non_response' "
        f"AND episode_key IN (SELECT child FROM _links WHERE link = '{COMPACTION}')"
    )
    con.execute("DROP TABLE _links")
    return len(rows)
