"""Use cases written once, called by every face (CLI, HTTP)."""
