"""What a kernel package's ``selftest`` module declares its checks with (read by :mod:`hf_posenc.selftest`): one
:class:`CheckCase` per comparison of a fast path against its float64 reference, and the case shapes of a preset."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckShapes:
    """Shapes of one check preset. `length` is Lq = Lk of prefill cases, `chunk` the query length of the
    chunked-prefill case (Lq < Lk = length), `decode_length` the cache of the decode cases."""

    batch: int
    q_heads: int
    kv_heads: int
    length: int
    head_dims: tuple[int, ...]
    decode_length: int
    window: int
    chunk: int


@dataclass(frozen=True)
class CheckCase:
    """One comparison: `kernel` (in its family's KERNELS), `variant` names the situation, `options` are the kernel's
    keyword arguments, `masking` adds left padding ("padding") or packed documents ("segments") to the inputs."""

    kernel: str
    variant: str
    dtype: str
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    backward: bool
    options: tuple[tuple[str, object], ...] = ()
    masking: str = "none"
    e_dim: int = 0  # > 0: a positional-state input of this width (TAPE's E)
    positions: bool = False  # with "padding", positions counted over real tokens (TAPA's distances)

    @property
    def name(self) -> str:
        return f"{self.kernel}/{self.variant}/D{self.head_dim}/{self.dtype}"

    def describe(self) -> dict:
        return {"B": self.batch, "Hq": self.q_heads, "Hkv": self.kv_heads, "Lq": self.q_len, "Lk": self.k_len,
                "D": self.head_dim, **({"De": self.e_dim} if self.e_dim else {})}


def case_shapes(s: CheckShapes, dtype: str, **common) -> tuple[dict, ...]:
    """CheckCase keywords (with ``common``) of prefill (Lq = Lk, backward; add head_dim), prefill at the first head
    dim, chunked prefill (Lq = chunk < Lk, backward) and decode (Lk = decode_length, forward; add q_len)."""
    base = dict(common, dtype=dtype, batch=s.batch, q_heads=s.q_heads, kv_heads=s.kv_heads)
    prefill = dict(base, q_len=s.length, k_len=s.length, backward=True)
    return (prefill, dict(prefill, head_dim=s.head_dims[0]),
            dict(base, q_len=s.chunk, k_len=s.length, backward=True, head_dim=s.head_dims[0]),
            dict(base, k_len=s.decode_length, backward=False, head_dim=s.head_dims[0]))
