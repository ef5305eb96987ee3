"""The environment track's LLM roles: QA synthesis and checks, tool specs and implementations."""
