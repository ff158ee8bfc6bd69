"""The KV pool: per layer K and V tensors indexed by token slot.

Layout per layer: ``k[layer]`` and ``v[layer]`` are ``[pool_slots, kv_heads, head_dim]`` (page size 1:
one slot holds one token). Slot 0 is reserved (padding / never handed out by the cache service), so
``capacity_tokens = pool_slots - 1``. Which slot holds which token is decided by the cache service and
the scheduler; the worker only reads and writes the slots it is told.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker_svc.model.config import ModelConfig

RESERVED_SLOTS = 1  # slot 0 at page size 1; the first page in general (see geometry)


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class PoolGeometry:
    """Sizes of a KV pool. ``capacity_tokens = pool_slots - page_size``: the first page (slots
    ``0 .. page_size-1``) is reserved for padding and is never written by a request."""

    pool_slots: int
    capacity_tokens: int
    page_size: int
    kv_bytes_per_token: int


def geometry(cfg: ModelConfig, dtype: torch.dtype, *, kv_tokens: int | None = None, kv_fraction: float | None = None,
             free_bytes: int | None = None, page_size: int = 1) -> PoolGeometry:
    """Pool size from an explicit token count, or from ``kv_fraction`` of ``free_bytes``.

    Exactly one of ``kv_tokens`` / ``kv_fraction`` (with ``free_bytes``) must be given. The page size is the
    cache service's allocation granularity: the K/V tensors stay token-granular (one slot per token, which
    both attention backends index directly), the capacity is rounded down to whole pages and the first
    page is reserved, as the cache service expects (its usable slots are ``page_size .. pool_slots-1``).
    Raises ValueError when the result would hold no whole page, or for a page size below 1.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    per_token = cfg.kv_bytes_per_token(dtype_bytes(dtype))
    if (kv_tokens is None) == (kv_fraction is None):
        raise ValueError("give exactly one of kv_tokens or kv_fraction")
    if kv_tokens is not None:
        capacity = int(kv_tokens)
    else:
        if not 0.0 < kv_fraction <= 1.0:
            raise ValueError(f"kv_fraction must be in (0, 1], got {kv_fraction}")
        if free_bytes is None:
            raise ValueError("kv_fraction needs free_bytes")
        capacity = int(free_bytes * kv_fraction) // per_token - page_size
    capacity -= capacity % page_size
    if capacity < page_size:
        raise ValueError(f"KV pool would hold {capacity} tokens ({per_token} bytes per token, pages of {page_size});"
                         " give more memory")
    return PoolGeometry(pool_slots=capacity + page_size, capacity_tokens=capacity, page_size=page_size,
                        kv_bytes_per_token=per_token)


class KVPool:
    """K and V tensors of every layer. ``k[layer]``, ``v[layer]``: ``[pool_slots, kv_heads, head_dim]``."""

    def __init__(self, cfg: ModelConfig, geom: PoolGeometry, dtype: torch.dtype, device: torch.device | str):
        self.geometry = geom
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (geom.pool_slots, cfg.kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layer)]

    @property
    def pool_slots(self) -> int:
        return self.geometry.pool_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores k, v ``[T, kv_heads, head_dim]`` at ``slots`` (int64 ``[T]``, validated by the caller)."""
        self.k[layer][slots] = k.to(self.dtype)
        self.v[layer][slots] = v.to(self.dtype)

    def paged(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) viewed as pages of one token: ``[pool_slots, 1, kv_heads, head_dim]`` (flashinfer NHD)."""
        return self.k[layer].unsqueeze(1), self.v[layer].unsqueeze(1)
