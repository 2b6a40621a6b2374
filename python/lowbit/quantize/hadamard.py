"""Scaled Hadamard rotations for the block-input rotation of QoQ (001 App. B.2.1, after QuaRot).

H_n / sqrt(n) is orthogonal, so x -> x·H and W -> W·H (input modules), W -> Hᵀ·W (output modules) leave the
float model unchanged. Orders are built as Kronecker products of a Sylvester 2^a matrix and one Paley-I matrix
of order q + 1 (q prime, q = 3 mod 4): e.g. 576 = 8 · 72 (q = 71) for SmolLM2's hidden size.
"""
from __future__ import annotations

import numpy as np


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def _paley1(q: int) -> np.ndarray:
    """Paley construction I: Hadamard matrix of order q + 1 for a prime q = 3 (mod 4)."""
    residues = {(x * x) % q for x in range(1, q)}
    chi = np.array([0] + [1 if a in residues else -1 for a in range(1, q)], dtype=np.int64)
    jac = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]  # Jacobsthal matrix Q[i, j] = chi(j - i)
    s = np.zeros((q + 1, q + 1), dtype=np.int64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
    return s + np.eye(q + 1, dtype=np.int64)


def _sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def hadamard(n: int) -> np.ndarray:
    """An n x n matrix of ±1 with H·Hᵀ = n·I. Raises ValueError for orders this construction cannot reach."""
    if n <= 0:
        raise ValueError(f"hadamard: order must be positive, got {n}")
    two = n & -n  # largest power of two dividing n
    m = n // two
    if m == 1:
        return _sylvester(n)
    # n = 2^a * (q + 1) with q + 1 = m * 2^b, b <= a
    while two >= 1:
        if (m - 1) % 4 == 3 and _is_prime(m - 1):
            return np.kron(_sylvester(two), _paley1(m - 1))  # Kronecker products of Hadamards are Hadamard
        m, two = m * 2, two // 2
    raise ValueError(f"hadamard: no Sylvester x Paley-I Hadamard matrix of order {n} "
                     "(the block-input rotation needs one for the hidden size)")


def scaled_hadamard(n: int) -> np.ndarray:
    """Orthogonal H_n / sqrt(n) in float64."""
    return hadamard(n).astype(np.float64) / np.sqrt(n)
