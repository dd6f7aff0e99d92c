"""Per-record data-quality checks, run-level rates, alarms and their notifications."""
