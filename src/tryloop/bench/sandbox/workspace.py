"""The benchmark's workspace and what an agent changes in it between resets."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tryloop.bench.sandbox.common import WS_BYTES, WS_DIRS, WS_FILES


def build_workspace(root: Path, files: int = WS_FILES, total: int = WS_BYTES) -> list[str]:
    """`files` files totalling `total` bytes in WS_DIRS directories, deterministic; relative paths."""
    rng = random.Random(20261130)
    per, extra = divmod(total, files)
    paths = []
    for i in range(files):
        rel = f"d{i % WS_DIRS:02d}/f{i // WS_DIRS:03d}.bin"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(per + (1 if i < extra else 0)))
        paths.append(rel)
    return paths


@dataclass(frozen=True)
class Mutation:
    """What an agent did between two resets: files changed, created, deleted."""

    modify: tuple[str, ...]
    create: tuple[str, ...]
    delete: tuple[str, ...]

    @classmethod
    def pick(cls, paths: list[str], seed: int, modify: int = 20, create: int = 10,
             delete: int = 5) -> Mutation:
        chosen = random.Random(seed).sample(paths, modify + delete)
        new = tuple(f"d{(seed + k) % WS_DIRS:02d}/new{k}.bin" for k in range(create))
        return cls(tuple(chosen[:modify]), new, tuple(chosen[modify:]))

    def shell(self, workdir: str) -> str:
        parts = [f"cd {workdir}"]
        if self.modify:
            parts.append(f"for f in {' '.join(self.modify)}; do printf changed >> $f; done")
        if self.create:
            parts.append(f"for f in {' '.join(self.create)}; do printf 'new file\\n' > $f; done")
        if self.delete:
            parts.append(f"rm {' '.join(self.delete)}")
        return " && ".join(parts)

    def apply_host(self, root: Path) -> None:
        for rel in self.modify:
            with open(root / rel, "ab") as f:
                f.write(b"changed")
        for rel in self.create:
            (root / rel).write_bytes(b"new file\n")
        for rel in self.delete:
            (root / rel).unlink()
