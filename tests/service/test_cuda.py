"""The CUDA provider: its options from the settings and reported in force, the reason a GPU
provider did not load, and (where onnxruntime-gpu and a GPU are) CUDA's answers against the
CPU's."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from service.cuda import dynamic_entries, provider_unloadable, unresolved
from service.rest.app import create_app
from service.settings import Settings
from tests.helpers import DIGITS

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
CAPI = Path(ort.__file__).parent / "capi"
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a GPU")


def test_tf32_is_off_unless_asked_for() -> None:
    """onnxruntime rounds float32 products to TF32 by default; gelu-serve does not."""
    options = Settings().cuda_options
    assert options["use_tf32"] == "0" and options["device_id"] == "0"
    assert "gpu_mem_limit" not in options  # 0: no limit, onnxruntime's own default
    tuned = Settings(cuda_tf32=True, cuda_device_id=1, cuda_gpu_mem_limit=1 << 30,
                     cuda_cudnn_conv_algo_search="HEURISTIC").cuda_options  # fmt: skip
    assert tuned["use_tf32"] == "1" and tuned["device_id"] == "1"
    assert tuned["gpu_mem_limit"] == str(1 << 30)
    assert tuned["cudnn_conv_algo_search"] == "HEURISTIC"
    both = Settings(providers=["cuda", "cpu"]).provider_options
    assert both == [Settings().cuda_options, {}]  # the CPU provider takes none


def test_the_options_in_force_are_reported(settings_factory) -> None:
    """V1 and V2 say which providers' options a version runs with, and where it runs."""
    with TestClient(create_app(settings_factory())) as client:
        summary = client.get("/v1/models/digits-mlp").json()
        assert summary["provider_options"] == {"CPUExecutionProvider": {}}
        config = client.get("/v2/models/digits-mlp/config").json()
        assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 1}]
        assert "optimization" not in config  # no CUDA, no accelerator options


def test_a_cpu_build_is_named_as_the_reason() -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA")
    reason = provider_unloadable("CUDAExecutionProvider", CAPI)
    assert reason is not None and "install onnxruntime-gpu" in reason
    assert provider_unloadable("CPUExecutionProvider", CAPI) is None


def test_missing_libraries_are_named(tmp_path: Path) -> None:
    """A provider library whose CUDA libraries are not on the loader's path: each is named."""
    library = next(CAPI.glob("onnxruntime_pybind11_state*.so"))
    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(library.read_bytes())
    needed, _ = dynamic_entries(library.open("rb"))
    assert "libc.so.6" in needed
    assert unresolved(["libc.so.6", "libcublasLt.so.13"], [], {"libc.so.6"}) == [
        "libcublasLt.so.13"
    ]
    assert unresolved(["libfound.so.1"], [tmp_path], set()) == ["libfound.so.1"]
    (tmp_path / "libfound.so.1").touch()
    assert unresolved(["libfound.so.1"], [tmp_path], set()) == []
    # This copy needs only the C and C++ runtimes, which are found: no reason to give.
    assert provider_unloadable("CUDAExecutionProvider", tmp_path) is None


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) missing")
def test_needed_libraries_read_as_readelf_reads_them(tmp_path: Path) -> None:
    """The ELF reader against binutils, on a real shared library, directly and from a zip."""
    library = next(CAPI.glob("onnxruntime_pybind11_state*.so"))
    listing = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    needed = [line for line in listing.splitlines() if "(NEEDED)" in line]
    expected = [line.split("[")[1].rstrip("]") for line in needed]
    with library.open("rb") as file:
        assert dynamic_entries(file)[0] == expected
    archive = tmp_path / "x.whl"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.write(library, "pkg/lib.so")
    with zipfile.ZipFile(archive) as zipped, zipped.open("pkg/lib.so") as member:
        assert dynamic_entries(member)[0] == expected  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a 64-bit"):
        dynamic_entries((tmp_path / "x.whl").open("rb"))


@needs_gpu
def test_cuda_answers_match_the_cpu_with_tf32_off(settings_factory) -> None:
    """With TF32 off (the default), CUDA's logits are the CPU's within 1e-5; the options in
    force say so on both V1 and V2."""
    x = DIGITS[:256].tolist()
    answers = {}
    for providers in (["cpu"], ["cuda", "cpu"]):
        settings = settings_factory(providers=providers, strict_providers=True)
        with TestClient(create_app(settings)) as client:
            body = {"inputs": [{"name": "input", "shape": [256, 64], "datatype": "FP32",
                                "data": x}], "outputs": [{"name": "logits"}]}  # fmt: skip
            response = client.post("/v2/models/digits-mlp/infer", json=body)
            answers[providers[0]] = np.array(response.json()["outputs"][0]["data"])
            if providers[0] == "cuda":
                summary = client.get("/v1/models/digits-mlp").json()
                assert summary["provider_options"]["CUDAExecutionProvider"]["use_tf32"] == "0"
                config = client.get("/v2/models/digits-mlp/config").json()
                assert config["instance_group"][0]["kind"] == "KIND_GPU"
                (cuda,) = config["optimization"]["execution_accelerators"][
                    "gpu_execution_accelerator"
                ]
                assert cuda["name"] == "cuda" and cuda["parameters"]["use_tf32"] == "0"
    np.testing.assert_allclose(answers["cuda"], answers["cpu"], atol=1e-5, rtol=0)


@needs_gpu
def test_tf32_on_is_reported(settings_factory) -> None:
    settings = settings_factory(providers=["cuda", "cpu"], strict_providers=True, cuda_tf32=True)
    with TestClient(create_app(settings)) as client:
        summary = client.get("/v1/models/digits-mlp").json()
        assert summary["provider_options"]["CUDAExecutionProvider"]["use_tf32"] == "1"
