"""Everything that runs afterwards, on recordings, one folder per stage: classify (one record), store
(DuckDB), load (segments -> rows), episodes, measure, report, export, lifecycle."""
