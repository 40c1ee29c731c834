"""The base of every configuration model: frozen, unknown fields refused.

Kept apart from `tryloop.config` so that each part's config module can build on it
without importing the root config (which imports all of them).
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _merge(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in given.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _sections_given_in_part_keep_their_defaults(cls, data: Any) -> Any:
        """A section whose default is a configured instance (`train.policy` samples at T=0.7 with
        dtype auto, where a bare `PolicyConfig` has float32) keeps those values when a file gives
        only some of its fields: what is given is merged over them, not over the class's own
        defaults. Without this, `train: {policy: {name: DIR}}` would silently sample in float32."""
        if not isinstance(data, dict):
            return data
        merged = None
        for name, field in cls.model_fields.items():
            value = data.get(name)
            if not isinstance(value, dict) or field.default_factory is None \
                    or getattr(field, "default_factory_takes_validated_data", False):
                continue
            default = field.default_factory()   # type: ignore[call-arg]
            if not isinstance(default, BaseModel) or not default.model_fields_set:
                continue
            merged = dict(data) if merged is None else merged
            merged[name] = _merge(default.model_dump(include=default.model_fields_set), value)
        return data if merged is None else merged
