"""Model loading and the actor-critic policy (see ``loading``, ``policy``, ``builtin``)."""

from engine.models.builtin import builtin_model_dir, cache_root
from engine.models.loading import ModelLoadError, import_gguf, resolve_model_path

__all__ = ["ModelLoadError", "builtin_model_dir", "cache_root", "import_gguf", "resolve_model_path"]
