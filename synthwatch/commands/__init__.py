"""Subcommands of the `synthwatch` CLI, one module each."""
