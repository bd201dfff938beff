"""Model versions verified before they load (OpenSSF model signing, GELU_MODEL_VERIFY_KEY), in
every model control mode: what is signed serves, what is altered, unsigned or signed by
another key is refused with the reason, and what was serving keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from contract.signing import SIGNATURE_FILENAME, sign
from service.dataplane import DataPlane
from service.errors import BadInputError, ModelLoadError
from service.inference import InferenceRequest, RequestInput
from tests.helpers import DIGITS

pytest.importorskip("model_signing")  # the [signing] extra
pytestmark = pytest.mark.anyio


def _key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """A PEM elliptic-curve private key and its public key, as files."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return private, public


@pytest.fixture
def signed(tmp_path: Path, model_repository: Path) -> tuple[Path, Path, Path]:
    """A copy of the test repository with every version signed: (root, private, public)."""
    root = tmp_path / "repo"
    shutil.copytree(model_repository, root)
    private, public = _key_pair(tmp_path, "owner")
    for version_dir in root.glob("*/[0-9]*"):
        sign(version_dir, private)
    return root, private, public


def _states(core: DataPlane, name: str) -> dict[str, tuple[str, str]]:
    entries = [e for e in core.control.index() if e["name"] == name and "version" in e]
    return {e["version"]: (e["state"], e["reason"]) for e in entries}


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _request() -> InferenceRequest:
    return InferenceRequest([RequestInput(DIGITS[:1], "input", "FP32")])


async def test_a_signed_repository_serves_and_each_bad_version_is_refused(
    settings_factory, signed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """At start-up (model control mode none): altered, unsigned and other-key versions are
    UNAVAILABLE with their reason; the signed ones serve."""
    root, _, public = signed
    other, _ = _key_pair(tmp_path, "stranger")
    mlp = root / "digits-mlp"
    _flip_a_byte(mlp / "1" / "model.onnx")  # changed by one byte after signing
    (root / "digits-mlp-tanh" / "1" / SIGNATURE_FILENAME).unlink()  # unsigned
    sign(root / "digits-autoencoder" / "1", other)  # signed by another key
    core = DataPlane(
        settings_factory(model_repository=root, model_verify_key=public, exit_on_error=False)
    )
    await core.start()
    try:
        assert _states(core, "digits-mlp")["2"][0] == "READY"
        state, reason = _states(core, "digits-mlp")["1"]
        assert state == "UNAVAILABLE" and "signature does not verify" in reason
        assert "model.onnx changed since it was signed" in reason
        assert "unsigned (no model.sig)" in _states(core, "digits-mlp-tanh")["1"][1]
        assert "signature does not verify" in _states(core, "digits-autoencoder")["1"][1]
        result = await core.infer("digits-mlp", "2", _request())
        assert result.outputs["logits"].shape == (1, 10)
    finally:
        await core.stop()


async def test_poll_refuses_a_bad_new_version_and_keeps_serving(
    settings_factory, signed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Poll mode: a new version unsigned, then signed by another key, then altered after
    signing, is refused each time; the serving versions answer every request meanwhile."""
    root, private, public = signed
    other, _ = _key_pair(tmp_path, "stranger")
    settings = settings_factory(
        model_repository=root, model_verify_key=public, exit_on_error=False,
        model_control_mode="poll", repository_poll_seconds=0.05,
    )  # fmt: skip
    core = DataPlane(settings)
    await core.start()
    failures = answered = 0

    async def keep_asking() -> None:
        nonlocal failures, answered
        while True:
            try:
                await core.infer("digits-mlp", None, _request())
                answered += 1
            except Exception:
                failures += 1
            await asyncio.sleep(0.005)

    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 15
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    asker = asyncio.create_task(keep_asking())
    try:
        new = root / "digits-mlp" / "3"
        shutil.copytree(root / "digits-mlp" / "2", new)
        (new / SIGNATURE_FILENAME).unlink()
        await until(lambda: "3" in _states(core, "digits-mlp"), "the unsigned version seen")
        assert "unsigned" in _states(core, "digits-mlp")["3"][1]
        sign(new, other)
        await until(lambda: "does not verify" in _states(core, "digits-mlp")["3"][1], "other key")
        sign(new, private)
        await until(lambda: _states(core, "digits-mlp")["3"][0] == "READY", "signed: serves")
        _flip_a_byte(new / "model.onnx")
        await until(lambda: "new files failed" in _states(core, "digits-mlp")["3"][1], "altered")
        assert "3" in core.model_info("digits-mlp").versions  # the verified one still serves
    finally:
        asker.cancel()
        await core.stop()
    assert failures == 0 and answered > 0


async def test_explicit_load_of_an_altered_version_is_refused(
    settings_factory, signed: tuple[Path, Path, Path]
) -> None:
    root, _, public = signed
    settings = settings_factory(
        model_repository=root, model_verify_key=public, exit_on_error=False,
        model_control_mode="explicit", load_models=["digits-mlp"],
    )  # fmt: skip
    core = DataPlane(settings)
    await core.start()
    try:
        assert core.model_info("digits-mlp").versions == ["1", "2"]
        _flip_a_byte(root / "digits-mlp" / "2" / "model.onnx")
        with pytest.raises(BadInputError, match=r"model\.onnx changed since it was signed"):
            await core.control.load("digits-mlp")  # the repository API's 400
        assert core.model_info("digits-mlp").versions == ["1", "2"]  # the loaded one stays
        assert (await core.infer("digits-mlp", "2", _request())).outputs["logits"].shape == (1, 10)
    finally:
        await core.stop()


def test_a_checked_version_is_not_hashed_again(
    signed: tuple[Path, Path, Path], monkeypatch
) -> None:
    from service.signing import Verifier

    root, _, public = signed
    verifier = Verifier(public)
    calls: list[Path] = []
    verify = verifier._verify

    def counted(version_dir: Path) -> str | None:
        calls.append(version_dir)
        return verify(version_dir)

    monkeypatch.setattr(verifier, "_verify", counted)
    version = root / "digits-mlp" / "2"
    for _ in range(3):
        verifier.check(version, "digits-mlp/2")
    assert len(calls) == 1  # unchanged files: the first result
    _flip_a_byte(version / "model.onnx")
    with pytest.raises(ModelLoadError):
        verifier.check(version, "digits-mlp/2")
    assert len(calls) == 2
