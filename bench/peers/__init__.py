"""The peers ``gelu-serve bench --peers`` serves the same ONNX file with: MLServer and BentoML,
each in its own virtual environment (``bench.peers.environments``)."""
