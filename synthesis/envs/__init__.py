"""The environment track's library (ASTRA §2.2): QA synthesis and validation, environment code, merging."""
