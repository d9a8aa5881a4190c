"""Attempts -> turns (with their roles) -> episodes, derived from the stored exchanges."""
