"""The peers' own virtual environments and servers, for ``gelu-serve bench --peers``.

Each peer is installed from the package registry into ``.bench-peers/<name>`` (once; again when
its requirements change) and serves the same ONNX file as gelu-serve, with the same batching
limits, on the same pinned core. Neither peer is a dependency of gelu-serve.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import onnxruntime

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ENVIRONMENTS = ROOT / ".bench-peers"


@dataclass(frozen=True)
class Peer:
    """A serving framework to compare with: what to install, and how to start it."""

    name: str
    label: str
    requirements: tuple[str, ...]


# MLServer 1.7.1 needs uvloop < 0.22 (SeldonIO/MLServer#2286). Both get gelu-serve's
# onnxruntime, so the sessions are the same.
MLSERVER = Peer(
    "mlserver",
    "MLServer 1.7.1",
    ("mlserver==1.7.1", "uvloop<0.22", f"onnxruntime=={onnxruntime.__version__}", "numpy"),
)
BENTOML = Peer(
    "bentoml", "BentoML 1.4", ("bentoml>=1.4,<1.5", f"onnxruntime=={onnxruntime.__version__}")
)


def environment(peer: Peer) -> Path:
    """The peer's environment's ``bin`` directory, created and installed when missing."""
    venv = ENVIRONMENTS / peer.name
    marker = venv / "requirements.txt"
    # Its path too: a venv's scripts name their interpreter by absolute path, so one copied or
    # moved from elsewhere has scripts that cannot start (exit status 127).
    wanted = "\n".join([f"# {venv.resolve()}", *peer.requirements]) + "\n"
    if not marker.is_file() or marker.read_text() != wanted:
        print(f"installing {peer.label} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, *peer.requirements], check=True)
        marker.write_text(wanted)
    return venv / "bin"


@contextmanager
def mlserver_command(
    model: str, model_file: Path, port: int, max_batch_size: int, ports: tuple[int, int]
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """``mlserver start`` over a temporary model folder: the command and its environment.

    MLServer batches adaptively only with a positive ``max_batch_time``; 1 ms is its
    smallest sensible setting next to gelu-serve's zero delay. Inference runs in the server
    process (``parallel_workers: 0``), as gelu-serve's does, and no request is logged.
    """
    grpc_port, metrics_port = ports
    with tempfile.TemporaryDirectory(prefix="mlserver-") as tmp:
        folder = Path(tmp)
        settings = {
            "http_port": port,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "parallel_workers": 0,
            "debug": False,  # MLServer's default, true, logs every request
        }
        (folder / "settings.json").write_text(json.dumps(settings))
        model_settings = {
            "name": model,
            "implementation": "mlserver_runtime.OnnxModel",
            "max_batch_size": max_batch_size,
            "max_batch_time": 0.001,
            "parameters": {"uri": str(model_file)},
        }
        (folder / "model-settings.json").write_text(json.dumps(model_settings))
        bin_dir = environment(MLSERVER)
        yield [str(bin_dir / "mlserver"), "start", str(folder)], {"PYTHONPATH": str(HERE)}


def bentoml_command(
    model_file: Path, port: int, max_batch_size: int
) -> tuple[list[str], dict[str, str]]:
    """``bentoml serve`` of ``bentoml_service.py``: the command and its environment."""
    bin_dir = environment(BENTOML)
    command = [
        str(bin_dir / "bentoml"), "serve", "bentoml_service:DigitsModel", "--port", str(port),
        "--working-dir", str(HERE),
    ]  # fmt: skip
    env = {"GELU_PEER_MODEL": str(model_file), "GELU_PEER_MAX_BATCH": str(max_batch_size)}
    return command, env
