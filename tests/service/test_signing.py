"""Model versions verified before they load (OpenSSF model signing, GELU_MODEL_VERIFY_KEY), in
every model control mode: what is signed serves, what is altered, unsigned or signed by
another key is refused with the reason, and what was serving keeps serving."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.signing import SIGNATURE_FILENAME, sign
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import BadInputError, ModelLoadError
from service.inference import InferenceRequest, RequestInput
from service.onnxrt import OnnxRuntime, SessionFactory, session_options
from tests.helpers import DIGITS, until

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


async def _states(core: DataPlane, name: str) -> dict[str, tuple[str, str]]:
    entries = [
        e for e in await ModelControl.over(core).index() if e["name"] == name and "version" in e
    ]
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
        assert (await _states(core, "digits-mlp"))["2"][0] == "READY"
        state, reason = (await _states(core, "digits-mlp"))["1"]
        assert state == "UNAVAILABLE" and "signature does not verify" in reason
        assert "model.onnx changed since it was signed" in reason
        assert "unsigned (no model.sig)" in (await _states(core, "digits-mlp-tanh"))["1"][1]
        assert "signature does not verify" in (await _states(core, "digits-autoencoder"))["1"][1]
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

    async def seen(condition: Callable[[dict], bool], what: str) -> None:
        """Until ``condition`` holds of digits-mlp's states in the index."""

        async def holds() -> bool:
            return condition(await _states(core, "digits-mlp"))

        await until(holds, what, timeout=15)

    asker = asyncio.create_task(keep_asking())
    try:
        new = root / "digits-mlp" / "3"
        shutil.copytree(root / "digits-mlp" / "2", new)
        (new / SIGNATURE_FILENAME).unlink()
        await seen(lambda states: "3" in states, "the unsigned version seen")
        assert "unsigned" in (await _states(core, "digits-mlp"))["3"][1]
        sign(new, other)
        await seen(lambda states: "does not verify" in states["3"][1], "other key")
        sign(new, private)
        await seen(lambda states: states["3"][0] == "READY", "signed: serves")
        _flip_a_byte(new / "model.onnx")
        await seen(lambda states: "new files failed" in states["3"][1], "altered")
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
            await ModelControl.over(core).load("digits-mlp")  # the repository API's 400
        assert core.model_info("digits-mlp").versions == ["1", "2"]  # the loaded one stays
        assert (await core.infer("digits-mlp", "2", _request())).outputs["logits"].shape == (1, 10)
    finally:
        await core.stop()


def _same_stamp(path: Path, data: bytes) -> None:
    """Replace ``path``'s bytes with ``data`` of the same size, its modification time kept."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_every_load_verifies_the_bytes_it_loads(signed: tuple[Path, Path, Path]) -> None:
    """Issue 62, item 4: a version verified once, then replaced by a file of the same size and
    modification time, is refused at its next load; nothing is remembered by stat."""
    from service.repository.layout import load_version, read_config
    from service.signing import Verifier

    root, _, public = signed
    verifier, model_dir = Verifier(public), root / "digits-mlp"
    runtime = OnnxRuntime(SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False))
    load_version(model_dir, 2, read_config(model_dir), runtime, 0, verifier).close()
    model = model_dir / "2" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    _same_stamp(model, bytes(data))
    with pytest.raises(ModelLoadError, match=r"2/model\.onnx changed since it was signed"):
        load_version(model_dir, 2, read_config(model_dir), runtime, 0, verifier)


def test_the_signature_covers_config_and_warmup_files(signed: tuple[Path, Path, Path]) -> None:
    """config.pbtxt and the warm-up folder are part of what each version's signature covers:
    changed, added or removed after signing, the version is refused, naming the file."""
    from service.repository.layout import read_version
    from service.signing import Verifier

    root, private, public = signed
    model_dir, verifier = root / "digits-mlp", Verifier(public)
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "digit").write_bytes(DIGITS[0].tobytes())
    sign(model_dir / "2", private)

    def check() -> None:
        read = read_version(model_dir, 2, None, whole=True)
        verifier.check(read.files, read.signature, "digits-mlp/2")

    check()  # as signed
    config = model_dir / "config.pbtxt"
    _same_stamp(config, config.read_bytes().replace(b"max_batch_size: 256", b"max_batch_size: 512"))
    with pytest.raises(ModelLoadError, match=r"config\.pbtxt changed since it was signed"):
        check()
    sign(model_dir / "2", private)
    (model_dir / "warmup" / "digit").write_bytes(DIGITS[1].tobytes())
    with pytest.raises(ModelLoadError, match="warmup/digit changed since it was signed"):
        check()
    (model_dir / "warmup" / "more").write_bytes(b"\0" * 4)
    with pytest.raises(ModelLoadError, match="warmup/more not signed"):
        check()


def test_a_signature_of_the_version_directory_alone_is_refused(
    signed: tuple[Path, Path, Path],
) -> None:
    """A signature made as before issue 62 (over ``<model>/<version>`` only) leaves
    config.pbtxt unsigned: refused, saying so."""
    from model_signing import hashing, signing

    from service.repository.layout import read_version
    from service.signing import Verifier

    root, private, public = signed
    version = root / "digits-mlp" / "2"
    hashed = hashing.Config().set_ignored_paths(paths=[version / SIGNATURE_FILENAME])
    config = (
        signing.Config().set_hashing_config(hashed).use_elliptic_key_signer(private_key=private)
    )
    config.sign(version, version / SIGNATURE_FILENAME)
    read = read_version(version.parent, 2, None, whole=True)
    with pytest.raises(ModelLoadError, match=r"config\.pbtxt.*not signed"):
        Verifier(public).check(read.files, read.signature, "digits-mlp/2")


def test_what_is_verified_is_what_was_read(signed: tuple[Path, Path, Path]) -> None:
    """The verifier judges the bytes it is given, whatever the disk holds by then."""
    from service.repository.layout import read_version
    from service.signing import Verifier

    root, _, public = signed
    read = read_version(root / "digits-mlp", 2, None, whole=True)
    verifier = Verifier(public)
    verifier.check(read.files, read.signature, "digits-mlp/2")
    model = read.files["2/model.onnx"]
    read.files["2/model.onnx"] = model[:-1] + bytes([model[-1] ^ 1])
    with pytest.raises(ModelLoadError, match=r"2/model\.onnx changed since it was signed"):
        verifier.check(read.files, read.signature, "digits-mlp/2")


def test_a_refusal_names_files_whatever_their_digests_hold() -> None:
    """model-signing reports a mismatch as the repr of a list, whose quotes are escaped when a
    digest's bytes hold one: the reason names the files either way, never the digests."""
    from service.signing import _reason

    lines = [
        "Hash mismatch for 'config.pbtxt': Expected 'Digest(b\\'x\"y\\')', Actual 'z'",
        "Extra files found in model 'm': warmup/b",
        "Missing files in model 'm': 1/model.onnx",
    ]
    assert "\\'config.pbtxt\\'" in str(lines)  # escaped, as model-signing's report can be
    assert _reason(ValueError(f"Signature mismatch: {lines}")) == (
        "config.pbtxt changed since it was signed; warmup/b not signed; "
        "1/model.onnx signed but absent"
    )
