"""Adapters to other frameworks; each submodule imports its framework, so import it by name."""
