"""gelu-serve's HTTP service: FastAPI over onnxruntime. Never imports torch or ``models``."""

__version__ = "0.1.0"
