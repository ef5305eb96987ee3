"""Placeholder until its owner fills it: RULES maps role name -> rule function."""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import BaseModel

RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {}
