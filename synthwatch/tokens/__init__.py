"""Tokenizers and a record's training tokens."""
