"""Triton's model configuration schema, vendored: ``model_config.proto`` from
triton-inference-server/common (``protobuf/model_config.proto`` at commit b0b5387, the newest
change to it in that repository's main at 83adf7c), under NVIDIA's BSD-3-Clause licence
(``LICENSE``), and the Python modules protoc makes of it (``model_config_pb2``; regenerate them
with ``make protos``, see ``generate.py``).

``contract.model_config`` parses and writes ``config.pbtxt`` through these messages, so its
grammar and its errors are Triton's.
"""
