"""The IDX reader on small files written here, and the data set loaders' errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from models.data import DataError, digits_arrays, load_dataset, load_idx_pair, read_idx


def write_idx(path: Path, array: np.ndarray, type_code: int, compress: bool = False) -> Path:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


@pytest.mark.parametrize(
    ("dtype", "code"),
    [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C), (np.float32, 0x0D),
     (np.float64, 0x0E)],
)  # fmt: skip
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path: Path, dtype: type, code: int, compress: bool) -> None:
    array: np.ndarray = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype is np.uint8:
        array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4) * 10
    suffix = ".gz" if compress else ""
    got = read_idx(write_idx(tmp_path / f"x.idx{suffix}", array, code, compress))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, array)


def test_read_idx_refuses_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        read_idx(tmp_path / "missing")
    (tmp_path / "magic").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DataError, match="bad magic"):
        read_idx(tmp_path / "magic")
    (tmp_path / "type").write_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DataError, match="unknown IDX element type"):
        read_idx(tmp_path / "type")
    good = write_idx(tmp_path / "short", np.zeros((4, 2), np.uint8), 0x08)
    good.write_bytes(good.read_bytes()[:-1])
    with pytest.raises(DataError, match="holds 7"):
        read_idx(good)
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        read_idx(tmp_path / "bad.gz")


def _write_split(root: Path, split: str, n: int, n_labels: int | None = None) -> None:
    images = np.random.default_rng(0).integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = np.arange(n_labels if n_labels is not None else n, dtype=np.uint8) % 10
    write_idx(root / f"{split}-images-idx3-ubyte.gz", images, 0x08, compress=True)
    write_idx(root / f"{split}-labels-idx1-ubyte", labels, 0x08)


def test_mnist_like_directory_loads(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 6)
    _write_split(tmp_path, "t10k", 4)
    data = load_dataset("fashion-mnist", tmp_path)
    assert data.images.shape == (10, 1, 28, 28)
    assert data.images.dtype == np.float32
    assert data.images.min() >= 0.0 and data.images.max() <= 1.0
    assert data.label_names[9] == "ankle boot"
    assert data.divide_by == 255.0


def test_mismatched_pair_and_missing_files(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 6, n_labels=5)
    with pytest.raises(DataError, match="do not pair"):
        load_idx_pair(tmp_path, "train")
    with pytest.raises(DataError, match=r"missing t10k-images-idx3-ubyte\[.gz\]"):
        load_idx_pair(tmp_path, "t10k")


def test_missing_or_unknown_dataset_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="install Debian's dataset-fashion-mnist"):
        load_dataset("fashion-mnist", tmp_path / "nowhere")
    with pytest.raises(DataError, match="pass --data-dir"):
        load_dataset("mnist")
    with pytest.raises(DataError, match="unknown data set 'cifar10'"):
        load_dataset("cifar10")


def test_digits_is_bundled_and_scaled() -> None:
    pytest.importorskip("sklearn", reason="the digits come with the [train] extra's scikit-learn")
    data = load_dataset("digits")
    assert data.images.shape == (1797, 1, 8, 8)
    assert data.images.max() == 1.0
    assert data.label_names == tuple(str(i) for i in range(10))


def test_digits_come_from_scikit_learns_public_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``sklearn.datasets.load_digits`` (not a file inside scikit-learn's package,
    whose place is not its API), the same arrays as it gives: the models trained on them stay
    byte-identical."""
    datasets = pytest.importorskip("sklearn.datasets")
    bunch, calls = datasets.load_digits(), []

    def load_digits() -> object:
        calls.append(1)
        return bunch

    monkeypatch.setattr(datasets, "load_digits", load_digits)
    images, labels = digits_arrays()
    assert calls == [1]
    assert images.dtype == bunch.images.dtype and labels.dtype == bunch.target.dtype
    assert np.array_equal(images, bunch.images) and np.array_equal(labels, bunch.target)
    assert tuple(str(t) for t in bunch.target_names) == load_dataset("digits").label_names
