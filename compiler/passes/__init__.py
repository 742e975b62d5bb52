"""Compiler passes over `layout`-stage IR; one pass per file, named for what it does."""
