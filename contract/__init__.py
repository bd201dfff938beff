"""The model repository's contract between ``export/`` (which writes it), ``service/`` (which
reads it) and ``models/`` (whose names it fixes): Triton's layout,
``<repository>/<model>/config.pbtxt`` and ``<repository>/<model>/<version>/model.onnx``.

- ``contract.names``: file, tensor, task and activation names;
- ``contract.metadata``: the ONNX ``metadata_props`` export writes;
- ``contract.model_config``: ``config.pbtxt``, written and read through
  ``contract.triton``, Triton's own ``model_config.proto`` (vendored, BSD-3-Clause);
- ``contract.readme``: the documents' generated blocks, which commands write and tests check.

Imports nothing of the project and no torch, so every part, the serving install included,
can import it.
"""
