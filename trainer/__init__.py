"""Training service: SFT, then online multi-turn GRPO pulled from `samples.verified`.

Lands with the trainer issue (ASTRA §3, EigenData §5).
"""
