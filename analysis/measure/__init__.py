"""What is counted and how: outcomes and their classification, expectation rules, metrics,
statistics, a run's summary and one-line figures, and the comparison of two runs."""
