"""The base of every model a stranger's bytes are parsed into (agent messages, hardware facts, a group's reward
errors): unknown keys refused, no NaN or infinity, and no NUL character in any text field (PostgreSQL stores none,
and no honest agent sends one). A refusal names the field, like every other."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value
