"""Keeping a store true to its recordings over time: what each `analyze` adds (ingest: load, then
derive), rebuilding what is derived when the rules change (reanalyze) and forgetting what
retention pruned (prune)."""
