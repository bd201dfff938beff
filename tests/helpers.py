"""Helpers shared by the service tests."""

from __future__ import annotations

import numpy as np

# Real digits, scaled as the models expect (pixel / 16).
DIGITS: np.ndarray = np.random.default_rng(0).random((300, 64), dtype=np.float32)


def _load_digits() -> np.ndarray:
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # serving-only install: random inputs of the right shape
        return DIGITS
    return (load_digits().data[:300] / 16.0).astype(np.float32)


DIGITS = _load_digits()


def assert_error(response, status: int, needle: str) -> None:
    """A 4xx/5xx with exactly the one error shape, whose message says what was wrong."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"], body
    assert needle in body["error"], body["error"]
