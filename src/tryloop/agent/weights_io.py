"""Weights as safetensors bytes or files, the way they travel from a learner to a sampler.

Tied parameters (a model whose output layer shares the embedding's tensor) are written once:
safetensors refuses two names over one storage. The other names are kept in the file's metadata
(`tryloop_aliases`: name -> the name written) and restored on reading, so the reader gets every
key of the model's state dict and can load it strictly.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

_ALIASES = "tryloop_aliases"


def _dedupe(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    seen: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        out[name] = t.contiguous().cpu()
    return out, aliases


def state_dict_of(weights: Any) -> dict[str, torch.Tensor]:
    return weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)


def to_bytes(weights: Any, *, version: str) -> bytes:
    from safetensors.torch import save

    tensors, aliases = _dedupe(state_dict_of(weights))
    return save(tensors, metadata={_ALIASES: json.dumps(aliases), "tryloop_version": version})


def to_file(weights: Any, path: str | Path, *, version: str) -> Path:
    """Written to a temporary name, then renamed: a reader never sees half a file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _dedupe(state_dict_of(weights))
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={_ALIASES: json.dumps(aliases), "tryloop_version": version})
    tmp.replace(path)
    return path


def _restore(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> dict[str, torch.Tensor]:
    for name, target in json.loads((metadata or {}).get(_ALIASES, "{}")).items():
        tensors[name] = tensors[target]
    return tensors


def _header_metadata(data: bytes) -> dict[str, str]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]).get("__metadata__") or {}


def from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return _restore(load(data), _header_metadata(data))


def from_file(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return _restore({k: f.get_tensor(k) for k in f.keys()}, f.metadata())  # noqa: SIM118
