"""Tensors to fingerprint and the digest's definition evaluated in plain Python integers, shared
by the tests of the definition (``lrft.api.digest``), of the fast sums (``lrft.kernels``) and of
the direct sync's copy that fingerprints what it writes."""

from __future__ import annotations

import functools

import torch

from lrft.kernels import ROW_WORDS as ROW_WORDS

ROW_BYTES = ROW_WORDS * 4


def reference_sums(tensor: torch.Tensor) -> tuple[int, int]:
    """``sum(w_p)`` and ``sum((2p + 1) * w_p)`` over the little-endian signed 32-bit words of
    the tensor's bytes (last word zero-padded), before reduction modulo ``2**64``."""
    raw = bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())
    raw += bytes(-len(raw) % 4)
    words = [int.from_bytes(raw[i : i + 4], "little", signed=True) for i in range(0, len(raw), 4)]
    return sum(words), sum((2 * p + 1) * w for p, w in enumerate(words))


def reference_digest(tensor: torch.Tensor, sums: tuple[int, int] | None = None) -> str:
    plain, weighted = reference_sums(tensor) if sums is None else sums
    dims = "x".join(str(d) for d in tensor.shape)
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}[{dims}]:{plain % 2**64:016x}{weighted % 2**64:016x}"


def random_words(count: int, seed: int, low: int = -(2**31), high: int = 2**31) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (count,), generator=generator, dtype=torch.int64).to(
        torch.int32
    )


def cases() -> dict[str, torch.Tensor]:
    """Every dtype width, byte counts that are not a multiple of 4, non-contiguous layouts, a
    tensor of exactly one of ``lrft.kernels``' rows and one a word longer, and sums that leave
    the int64 range before the modulo."""
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(40, 70, generator=generator)
    return {
        "fp32": torch.randn(3, 1000, generator=generator),
        "bf16": torch.randn(7, 333, generator=generator).to(torch.bfloat16),
        "fp16": torch.randn(2049, generator=generator).to(torch.float16),
        "int64": torch.randint(-(2**62), 2**62, (999,), generator=generator),
        "uint8": torch.randint(0, 256, (10_001,), generator=generator, dtype=torch.uint8),
        "bool": torch.rand(77, generator=generator) > 0.5,
        "three_bf16": torch.randn(3, generator=generator).to(torch.bfloat16),
        "five_uint8": torch.tensor([255, 1, 128, 7, 9], dtype=torch.uint8),
        "scalar": torch.tensor(-3.5),
        "empty": torch.empty(0, 5),
        "transposed": matrix.t(),
        "strided": matrix[::3, 1::2],
        "one_row": random_words(ROW_WORDS, 1),
        "one_row_and_a_word": random_words(ROW_WORDS + 1, 2),
        # large enough that the sums leave the int64 range before the modulo
        "large_signed": random_words(300_000, 3, high=2**30),
        "large_positive": random_words(250_000, 4, low=0),
    }


@functools.cache
def case_sums() -> dict[str, tuple[int, int]]:
    """:func:`reference_sums` of every case (computed once: a few seconds in Python)."""
    return {name: reference_sums(tensor) for name, tensor in cases().items()}


@functools.cache
def case_digests() -> dict[str, str]:
    """:func:`reference_digest` of every case."""
    sums = case_sums()
    return {name: reference_digest(tensor, sums[name]) for name, tensor in cases().items()}
