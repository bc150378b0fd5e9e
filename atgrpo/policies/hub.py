"""Hugging Face hub ids in ``model.path``, resolved through the Hugging Face cache as transformers resolves them.

``model.path`` is a local model directory, or a hub id ``org/name`` that is not a local path; ``model.revision``
(a branch, tag or commit; default ``main``) goes with a hub id. ``resolve`` returns the snapshot directory of the
cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: huggingface_hub's rule) and
its commit, downloading what is missing with huggingface_hub's progress bars, or, with ``HF_HUB_OFFLINE=1``,
reading the cache only. Only what a run loads is fetched (``HUB_FILES``: configs, tokenizer files, safetensors
weights). ``trainer/run_settings.pin_model`` resolves once at start-up, before any other work, and records the
commit as ``model.revision`` in the run's config.yaml, so a resume and the vLLM engine read the same files.

A missing model offline is one line naming the id, the revision and the cache searched (``ModelNotFound``).
"""

from __future__ import annotations

import os

CACHE_ENV = "ATGRPO_CACHE_DIR"  # where atgrpo's converted GGUF models are cached (default ~/.cache/atgrpo)


def cache_root() -> str:
    """atgrpo's own cache (presets and GGUF files converted to transformers directories; ``policies/hf.py``)."""
    if os.environ.get(CACHE_ENV):
        return os.path.expanduser(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "atgrpo")


# what a run loads: the model's and tokenizer's configs and files, the weights as safetensors (no .bin, no GGUF)
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.tiktoken", "*.jinja", "vocab.*", "merges.*"]
_TRUE = ("1", "true", "yes", "on")


def looks_like_hub_id(path: str | None) -> bool:
    """``org/name``, not a local path: two non-empty parts, no leading ``.``, ``~`` or ``/``, and nothing there."""
    if not path or os.path.exists(os.path.expanduser(path)):
        return False
    parts = path.split("/")
    return (len(parts) == 2 and all(parts) and not path.startswith((".", "~"))
            and not any(p in (".", "..") for p in parts))


def cache_dir() -> str:
    """The hub cache, read from the environment at each call (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set: read the cache only."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


class ModelNotFound(ValueError):
    """A model that cannot be loaded on this machine (a hub id not cached offline, unknown, no network; a missing
    directory or file); the message says how to get it."""


def resolve(repo_id: str, revision: str | None = None, local_only: bool = False) -> tuple[str, str]:
    """``(snapshot directory, commit)`` of ``repo_id`` at ``revision`` (default ``main``): from the cache, after
    a download of what is missing unless offline (or ``local_only``: the cache alone, ``atgrpo check``)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache, rev, cached_only = cache_dir(), revision or "main", local_only or offline()
    try:
        path = huggingface_hub.snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                                 local_files_only=cached_only, allow_patterns=HUB_FILES)
    except LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE=1 reads the cache only" if offline() else "only the cache was read" if local_only
               else "and it could not be downloaded")
        raise ModelNotFound(f"model.path={repo_id!r} (revision {rev}) is not in the Hugging Face cache {cache}: {why}"
                            f"; download it with `huggingface-cli download {repo_id} --revision {rev}` where the "
                            f"machine may, or set HF_HOME / HF_HUB_CACHE to the cache that holds it") from None
    except Exception as e:  # noqa: BLE001 - unknown repository or revision, gated, no network: one line, its cause
        raise ModelNotFound(f"model.path={repo_id!r} (revision {rev}) could not be resolved through the Hugging Face "
                            f"hub (cache {cache}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                            ) from None
    return path, os.path.basename(os.path.normpath(path))
