"""Signed models, unsigned bytes (issue 62, item 4): with ``GELU_MODEL_VERIFY_KEY`` set, what
loads is what was verified. One real server for the module: ``on_demand`` with one slot, so
each request for another model evicts the last one and every request for it loads it again.

The repository holds signed models, then is altered as someone who can write to it would:
weights replaced after an eviction (same size, modification time restored), ``config.pbtxt``
and warm-up files changed after signing, an unsigned model with no ``config.pbtxt``, and
warm-up files that point outside the model's ``warmup/`` folder.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contract.signing import sign
from tests.servers import running

pytest.importorskip("model_signing")  # the [signing] extra
pytestmark = pytest.mark.slow  # a real server process

ROW = np.random.default_rng(0).random((1, 64), dtype=np.float32)
WARMUP = """
model_warmup [
  {{
    name: "sample"
    batch_size: 1
    inputs {{ key: "input" value: {{ data_type: TYPE_FP32 dims: [ 64 ] input_data_file: "{}" }} }}
  }}
]
"""
# Each a model whose warm-up names a file outside its warmup/ folder (the symbolic link is
# made after signing: a signature never covers one).
ESCAPES = {
    "warm-dev-zero": "/dev/zero",
    "warm-climbs": "../config.pbtxt",
    "warm-absolute": "/etc/hostname",
    "warm-link": "out",
}


def _key_pair(folder: Path) -> tuple[Path, Path]:
    """A PEM elliptic-curve private key and its public key, as files."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "owner.key", folder / "owner.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return private, public


def _clone(root: Path, name: str, warmup_file: str | None = None) -> Path:
    """digits-mlp-tanh under another name, with a warm-up sample reading ``warmup_file``."""
    model_dir = root / name
    shutil.copytree(root / "digits-mlp-tanh", model_dir)
    config = model_dir / "config.pbtxt"
    text = config.read_text().replace('"digits-mlp-tanh"', f'"{name}"')
    if warmup_file is not None:
        text += WARMUP.format(warmup_file)
        (model_dir / "warmup").mkdir()
        (model_dir / "warmup" / "digit").write_bytes(ROW.tobytes())
    config.write_text(text)
    return model_dir


def _unrunnable(path: Path) -> None:
    """A well-formed ONNX file that onnxruntime refuses to open (an operator it lacks): were
    it opened before its signature is checked, the refusal would say onnxruntime's reason."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("NoSuchOperator", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def _keep_stamp(path: Path, data: bytes) -> None:
    """Replace ``path``'s bytes with ``data`` of the same size, its times restored."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _negated(path: Path) -> bytes:
    """The ONNX file at ``path`` with every weight negated: the same size, other answers."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(tensor), tensor.name))
    return model.SerializeToString()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Path:
    """The test repository, every version signed, with the models above added."""
    folder = tmp_path_factory.mktemp("signed")
    root = folder / "repo"
    shutil.copytree(model_repository, root)
    _clone(root, "tampered-config")
    _clone(root, "tampered-warmup", "digit")
    for name, target in ESCAPES.items():
        _clone(root, name, target)
    private, _ = _key_pair(folder)
    for version_dir in root.glob("*/[0-9]*"):
        sign(version_dir, private)
    _unrunnable(root / "unsigned-no-config" / "1" / "model.onnx")
    (root / "warm-link" / "warmup" / "out").symlink_to("/dev/zero")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[int]:
    env = {
        "GELU_MODEL_VERIFY_KEY": str(repository.parent / "owner.pub"),
        "GELU_MODEL_CONTROL_MODE": "on_demand",
        "GELU_MAX_LOADED_MODELS": "1",
        "GELU_EXIT_ON_ERROR": "false",
    }
    with running(repository, **env) as (port, _):
        yield port


def infer(port: int, model: str, rows: np.ndarray = ROW) -> tuple[int, dict]:
    """A V2 JSON inference request: the status and the decoded body."""
    tensor = {"name": "input", "shape": list(rows.shape), "datatype": "FP32",
              "data": rows.ravel().tolist()}  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"inputs": [tensor]})
        connection.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def refused(port: int, model: str, why: str) -> str:
    """``model``'s request is refused as a load error (4xx, or 503), saying ``why``."""
    status, body = infer(port, model)
    assert status != 200 and (400 <= status < 500 or status == 503), (status, body)
    assert why in body["error"], body
    return str(body["error"])


def test_weights_replaced_after_an_eviction_are_refused(server: int, repository: Path) -> None:
    """Issue 62, item 4: a verified model, evicted (one slot), has its model.onnx replaced by
    one of the same size with negated weights and its modification time restored; its next
    load is refused, never served with other answers (the verdict was kept by size and mtime)."""
    status, first = infer(server, "digits-mlp")
    assert status == 200, first
    assert infer(server, "digits-mlp-tanh")[0] == 200  # takes the one slot: digits-mlp evicted
    for model in repository.glob("digits-mlp/[0-9]*/model.onnx"):
        _keep_stamp(model, _negated(model))
    refused(server, "digits-mlp", "model.onnx changed since it was signed")
    assert infer(server, "digits-mlp-tanh")[0] == 200  # the service keeps serving


def test_an_unsigned_model_without_config_is_refused_before_onnxruntime(server: int) -> None:
    """Issue 62, item 4: an unsigned ONNX file with no config.pbtxt is refused for want of a
    signature; onnxruntime never opens it (it would refuse this file for its own reason)."""
    reason = refused(server, "unsigned-no-config", "unsigned (no model.sig)")
    assert "onnxruntime" not in reason and "NoSuchOperator" not in reason


def test_a_changed_config_or_warmup_file_is_refused(server: int, repository: Path) -> None:
    """Issue 62, item 4: config.pbtxt and warm-up files are covered by the signature; changed
    after signing, the version is refused, naming the file."""
    config = repository / "tampered-config" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 256", "max_batch_size: 1"))
    refused(server, "tampered-config", "config.pbtxt changed since it was signed")
    (repository / "tampered-warmup" / "warmup" / "digit").write_bytes((-ROW).tobytes())
    refused(server, "tampered-warmup", "warmup/digit changed since it was signed")


@pytest.mark.parametrize("model", sorted(ESCAPES))
def test_a_warmup_file_outside_the_warmup_folder_is_refused(server: int, model: str) -> None:
    """Issue 62, item 4, and the path class of CVE-2023-31036 and onnx CVE-2024-27318: a
    warm-up input_data_file that is absolute (/dev/zero would be read whole), climbs out with
    '..', or is a symbolic link out of warmup/, is refused at load with the reason."""
    why = "a symbolic link" if model == "warm-link" else "must name a file under warmup/"
    refused(server, model, why)
