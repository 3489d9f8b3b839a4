"""Model providers. Each turns a session's history into a streamed ``ModelResponse``."""

from dex.models.base import Model, ModelError, ModelRequest
from dex.models.scripted import Scripted, call, say

__all__ = ["Model", "ModelError", "ModelRequest", "Scripted", "call", "say"]
