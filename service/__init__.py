"""gelu-serve's serving core (``dataplane.DataPlane``) and its faces (``rest``: FastAPI).

onnxruntime runs the models. Never imports torch or ``models``.
"""

__version__ = "0.1.0"
