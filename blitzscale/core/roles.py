"""What a serving instance does."""

from __future__ import annotations

from typing import Literal

Role = Literal["prefill", "decode", "colocated"]
