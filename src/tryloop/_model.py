"""The base of every configuration model: frozen, unknown fields refused.

Kept apart from `tryloop.config` so that each part's config module can build on it
without importing the root config (which imports all of them).
"""

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
