"""Data sets that need no network.

- ``digits``: scikit-learn's bundled 8x8 digits (1797 images, 10 classes), the default.
- ``fashion-mnist``: the IDX files that Debian's ``dataset-fashion-mnist`` package installs
  under ``/usr/share/datasets/fashion-mnist/`` (or any directory given with ``data_dir``).
- ``mnist``: the standard MNIST IDX files, from ``data_dir``.

Every loader returns float32 images scaled to [0, 1], int64 labels, and the scale it used, so
that the checkpoint can record the input normalisation a client must apply.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_LABELS = (
    "t-shirt/top", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
)  # fmt: skip
DATASETS = ("digits", "fashion-mnist", "mnist")

# IDX type codes (http://yann.lecun.com/exdb/mnist/): big-endian element types.
_IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


class DataError(ValueError):
    """A data set that is missing, unknown or malformed."""


@dataclass(frozen=True)
class Dataset:
    """Images (N, C, H, W) in [0, 1], labels (N,), and what is needed to describe them."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    label_names: tuple[str, ...]
    divide_by: float

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a native-endian array."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"IDX file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX element type 0x{type_code:02x}")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header_len])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_len != expected:
        raise DataError(
            f"{path}: header declares shape {list(shape)} ({expected} bytes of data) "
            f"but the file holds {len(raw) - header_len}"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def _find_idx(data_dir: Path, stem: str) -> Path:
    for candidate in (data_dir / f"{stem}.gz", data_dir / stem):
        if candidate.is_file():
            return candidate
    raise DataError(f"missing {stem}[.gz] in {data_dir}")


def load_idx_pair(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Load ``{split}-images-idx3-ubyte`` and ``{split}-labels-idx1-ubyte`` from ``data_dir``."""
    images = read_idx(_find_idx(data_dir, f"{split}-images-idx3-ubyte"))
    labels = read_idx(_find_idx(data_dir, f"{split}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{data_dir}: {split} images {images.shape} and labels {labels.shape} do not pair"
        )
    return images, labels


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as ``sklearn.datasets.load_digits`` gives them: (1797, 8, 8) float64 images
    and int labels, from that public loader: where scikit-learn keeps the file is not part of
    its API. Imported here, not at the top, so the IDX data sets never pay for it."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


def _load_digits() -> Dataset:
    pixels, labels = digits_arrays()
    divide_by = 16.0
    images = (pixels / divide_by).astype(np.float32)[:, None, :, :]
    return Dataset(
        name="digits",
        images=images,
        labels=labels.astype(np.int64),
        label_names=tuple(str(t) for t in range(10)),
        divide_by=divide_by,
    )


def _load_mnist_like(
    name: str,
    data_dir: Path,
    label_names: tuple[str, ...],
    splits: tuple[str, ...] = ("train", "t10k"),
) -> Dataset:
    if not data_dir.is_dir():
        hint = " (install Debian's dataset-fashion-mnist)" if name == "fashion-mnist" else ""
        raise DataError(f"{name}: data directory {data_dir} does not exist{hint}")
    parts = [load_idx_pair(data_dir, split) for split in splits]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts]).astype(np.int64)
    divide_by = 255.0
    return Dataset(
        name=name,
        images=(images.astype(np.float32) / divide_by)[:, None, :, :],
        labels=labels,
        label_names=label_names,
        divide_by=divide_by,
    )


def load_split(name: str, data_dir: str | Path | None = None) -> tuple[Dataset, Dataset]:
    """(train, test): the official split for the IDX data sets; for digits, which has none, a
    fixed 80/20 split (seed 0)."""
    if name == "digits":
        full = _load_digits()
        order = np.random.default_rng(0).permutation(len(full.labels))
        cut = round(0.8 * len(order))
        train, test = order[:cut], order[cut:]
        return (
            Dataset(name, full.images[train], full.labels[train], full.label_names, 16.0),
            Dataset(name, full.images[test], full.labels[test], full.label_names, 16.0),
        )
    label_names: tuple[str, ...]
    if name == "fashion-mnist":
        directory, label_names = Path(data_dir or FASHION_MNIST_DIR), FASHION_MNIST_LABELS
    elif name == "mnist" and data_dir is not None:
        directory, label_names = Path(data_dir), tuple(str(i) for i in range(10))
    else:
        load_dataset(name, data_dir)  # raises the DataError that says what is missing
        raise DataError(f"{name}: no train/test split")
    return (
        _load_mnist_like(name, directory, label_names, ("train",)),
        _load_mnist_like(name, directory, label_names, ("t10k",)),
    )


def load_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load a data set by name; ``data_dir`` overrides where IDX files are read from."""
    if name == "digits":
        return _load_digits()
    if name == "fashion-mnist":
        return _load_mnist_like(name, Path(data_dir or FASHION_MNIST_DIR), FASHION_MNIST_LABELS)
    if name == "mnist":
        if data_dir is None:
            raise DataError("mnist: pass --data-dir, the directory holding MNIST's IDX files")
        return _load_mnist_like(name, Path(data_dir), tuple(str(i) for i in range(10)))
    raise DataError(f"unknown data set {name!r}; choose one of: {', '.join(DATASETS)}")
