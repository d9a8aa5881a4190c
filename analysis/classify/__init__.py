"""The per-record stage: one recorded exchange -> its outcome, calls, tool set and conversation keys
(record.analyze_record), with what that reads: bodies, calls in text, side requests, prompt protocols,
the words particular harnesses write, and the keys episodes are later chained by; and the words
outcomes, causes, roles and expectations are written in (outcomes, expectations). Pure: it runs in
`analyze`'s worker processes and in the live page's classifier, so it imports no other folder of
the analyzer, no DuckDB and no NumPy."""
