"""The model repository: its layout on disk (``layout``) and the live set of versions serving
from it (``manager``)."""

from service.repository.manager import ModelRepository

__all__ = ["ModelRepository"]
