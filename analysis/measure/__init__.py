"""What is counted and how: metrics, statistics, a run's summary and one-line figures, and the
comparison of two runs (over the outcomes classify/ assigned and the roles episodes/ gave)."""
