"""From an alarm to clean data: re-derive, re-run, undo, and a record's history."""
