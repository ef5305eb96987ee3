"""Isolated execution of generated code and the environment runtime.

Lands with the environment-track issue (ASTRA §2.2).
"""
