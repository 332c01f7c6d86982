"""Model and drafter references for `serve`: a local folder or a Hugging Face hub id.

SGLang resolves `--model-path` hub ids itself (huggingface_hub's cache under `HF_HOME` /
`HF_HUB_CACHE`, downloading unless `HF_HUB_OFFLINE=1`); the DOMINO worker reads its drafter from
a folder. So `serve` passes a target id through unchanged (reading only its config.json here, for
the drafter check) and turns a drafter id into the local snapshot folder the same way SGLang's
loader would (huggingface_hub.snapshot_download, offline mode honoured).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# `org/name` with the characters the hub allows (huggingface_hub's validate_repo_id).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# What a drafter snapshot needs: config, safetensors weights, the draft vocabulary.
DRAFTER_FILES = ["*.json", "*.safetensors"]


class HubError(ValueError):
    """A reference that is neither a local folder nor a resolvable hub id (one-line message)."""


def is_hub_id(ref: str) -> bool:
    """True when `ref` is not an existing path and reads as a hub repository id (`org/name`)."""
    return not os.path.exists(ref) and _HUB_ID.fullmatch(ref) is not None \
        and ".." not in ref and not ref.endswith((".", "-"))


def offline() -> bool:
    """huggingface_hub's offline switch (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE as it accepts)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    """The hub cache huggingface_hub (and so SGLang) reads: HF_HUB_CACHE, else HF_HOME/hub."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _explain(flag: str, ref: str, exc: Exception) -> HubError:
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        why = "a gated repository: accept its licence on the hub and set HF_TOKEN"
    elif isinstance(exc, errors.RepositoryNotFoundError):
        why = "no such repository on the hub (or private: set HF_TOKEN)"
    elif isinstance(exc, errors.RevisionNotFoundError):
        why = "no such revision"
    elif isinstance(exc, errors.LocalEntryNotFoundError) or offline():
        why = (f"not in the Hugging Face cache {cache_dir()}"
               + (" and HF_HUB_OFFLINE is set" if offline() else " and the hub is unreachable"))
    else:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return HubError(f"{flag} {ref}: {why}")


def resolve_folder(ref: str | Path, flag: str = "--drafter",
                   allow_patterns: list[str] | None = None) -> Path:
    """A local folder as is; a hub id as its local snapshot folder (downloaded unless offline)."""
    ref = str(ref)
    if os.path.isdir(ref):
        return Path(ref)
    if os.path.exists(ref):
        raise HubError(f"{flag} {ref}: a file, not a folder")
    if not is_hub_id(ref):
        raise HubError(f"{flag} {ref}: no such folder, and not a hub id (org/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref, allow_patterns=allow_patterns,
                                      local_files_only=offline()))
    except Exception as exc:  # every hub failure becomes one line naming the flag
        raise _explain(flag, ref, exc) from exc


def target_config(ref: str | Path, flag: str = "--model-path") -> dict | None:
    """The target's config.json as a dict: from the folder, or from the hub cache for an id
    (only that file is fetched; SGLang downloads the weights itself). None for a local folder
    without one (SGLang then reports what it needs)."""
    ref = str(ref)
    if os.path.isdir(ref):
        path = Path(ref) / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None
    if os.path.exists(ref):
        raise HubError(f"{flag} {ref}: a file, not a folder")
    if not is_hub_id(ref):
        raise HubError(f"{flag} {ref} does not exist, and is not a hub id (org/name)")
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(ref, "config.json", local_files_only=offline())
    except Exception as exc:
        raise _explain(flag, ref, exc) from exc
    return json.loads(Path(path).read_text())
