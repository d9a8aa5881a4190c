"""Keeping a store true to its recordings over time: rebuilding what is derived when the rules
change (reanalyze) and forgetting what retention pruned (prune)."""
