"""The EigenData roles: task synthesis and validation, dialogues, orchestration (planner, prompt engineer, judge)."""
