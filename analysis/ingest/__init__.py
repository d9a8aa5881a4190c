"""Segments -> exchanges: the incremental ingest and the per-record stage it runs in workers
(records.py) with what that stage reads: bodies, calls in text, probes, prompt protocols, the
words particular harnesses write, and the conversation keys episodes are later chained by."""
