"""Disentanglement law of attention logits (position-generalization-mechanism §3.1–3.2, eq. 2–4, App. A–B).

* Fake-distance fit (§3.2): fix a query ``q`` (the last token's, to see every key), replace the real distance by
  a fake distance ``d`` and build ``W'[d, j] = w(d, q, k_j)`` with the model's own frequencies. Fit
  ``W'[d, j] ≈ a_d + b_j`` (eq. 3, the closed form of App. B: row means + column means − the grand mean) and report
  the linear correlation between ``W'`` and the fit (paper: 0.947 on average for a trained Llama, eq. 4).
* 3-axis fit (§3.1, eq. 2): the real causal logit matrix ``W[i, j] ≈ a_{i−j} + b_i + c_j`` over ``j ≤ i``, solved
  through its normal equations (App. A eq. 8) with the paper's 1e-6 ridge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .capture import capture_window, check_heads, check_ids, check_layers, layer_frequencies, softmax_scale
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import rotate, fake_distance_logits

RIDGE = 1e-6  # the paper's regulariser for the 3-axis solve (App. A footnote)


def correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two equally shaped tensors (NaN when either is constant)."""
    x, y = x.double().flatten(), y.double().flatten()
    x, y = x - x.mean(), y - y.mean()
    denom = torch.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else float("nan")


def additive_fit(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form least squares ``W[d, j] ≈ a_d + b_j`` (eq. 3 / eq. 13): ``a`` and ``b`` each carry half of the
    grand mean, so ``a_d + b_j`` = row mean + column mean − grand mean."""
    w = w.double()
    grand = w.mean()
    return w.mean(dim=1) - grand / 2, w.mean(dim=0) - grand / 2


def additive_fit_reference(w: torch.Tensor) -> torch.Tensor:
    """Reference: the fitted matrix from a dense least-squares solve of the two-way additive model."""
    m, n = w.shape
    design = torch.zeros(m * n, m + n, dtype=torch.float64)
    rows = torch.arange(m * n)
    design[rows, rows // n] = 1.0
    design[rows, m + rows % n] = 1.0
    solution = torch.linalg.lstsq(design, w.double().reshape(-1, 1), driver="gelsd").solution
    return (design @ solution).reshape(m, n)


def additive_correlation(w: torch.Tensor) -> float:
    """Correlation between ``W`` and its additive fit ``a_d + b_j`` (the paper's disentanglement score)."""
    a, b = additive_fit(w)
    return correlation(w, a[:, None] + b[None, :])


def three_axis_fit(w: torch.Tensor, ridge: float = RIDGE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``W[i, j] ≈ a_{i−j} + b_i + c_j`` over the causal triangle ``j ≤ i`` (eq. 2), via the normal equations.

    Returns ``(a, b, c)`` of length ``n`` each (``a`` indexed by distance ``0..n−1``)."""
    n = w.shape[0]
    if w.shape != (n, n):
        raise ValueError(f"the logit matrix must be square, got {tuple(w.shape)}.")
    w = w.double()
    idx = torch.arange(n)
    causal = (idx[None, :] <= idx[:, None]).double()  # [i, j]: j <= i
    dist = idx[:, None] - idx[None, :]
    # Counts and cross-counts of the three one-hot groups over the triangle.
    a_ab = (idx[None, :] >= idx[:, None]).double()  # [d, i]: distance d occurs in row i iff d <= i
    a_ac = (idx[None, :] + idx[:, None] <= n - 1).double()  # [d, j]: distance d occurs in column j iff j + d <= n-1
    a_bc = causal  # [i, j]
    normal = torch.zeros(3 * n, 3 * n, dtype=torch.float64)
    normal[:n, :n] = torch.diag((n - idx).double())
    normal[n : 2 * n, n : 2 * n] = torch.diag((idx + 1).double())
    normal[2 * n :, 2 * n :] = torch.diag((n - idx).double())
    normal[:n, n : 2 * n], normal[n : 2 * n, :n] = a_ab, a_ab.T
    normal[:n, 2 * n :], normal[2 * n :, :n] = a_ac, a_ac.T
    normal[n : 2 * n, 2 * n :], normal[2 * n :, n : 2 * n] = a_bc, a_bc.T
    normal += ridge * torch.eye(3 * n, dtype=torch.float64)
    wt = w * causal
    rhs_a = torch.zeros(n, dtype=torch.float64).index_add_(0, dist[causal.bool()], wt[causal.bool()])
    rhs = torch.cat([rhs_a, wt.sum(1), wt.sum(0)])
    sol = torch.linalg.solve(normal, rhs)
    return sol[:n], sol[n : 2 * n], sol[2 * n :]


def three_axis_reconstruction(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    n = a.shape[0]
    idx = torch.arange(n)
    dist = (idx[:, None] - idx[None, :]).clamp_min(0)
    return a[dist] + b[:, None] + c[None, :]


def three_axis_reference(w: torch.Tensor) -> torch.Tensor:
    """Reference: the fitted triangle from a dense least-squares solve (entries above the diagonal are 0)."""
    n = w.shape[0]
    ii, jj = torch.tril_indices(n, n)
    design = torch.zeros(ii.numel(), 3 * n, dtype=torch.float64)
    r = torch.arange(ii.numel())
    design[r, ii - jj] = 1.0
    design[r, n + ii] = 1.0
    design[r, 2 * n + jj] = 1.0
    sol = torch.linalg.lstsq(design, w.double()[ii, jj].reshape(-1, 1), driver="gelsd").solution
    out = torch.zeros(n, n, dtype=torch.float64)
    out[ii, jj] = (design @ sol).flatten()
    return out


def three_axis_correlation(w: torch.Tensor, ridge: float = RIDGE) -> float:
    """Correlation over the causal triangle between ``W`` and its 3-axis fit (§3.1; paper: 0.865)."""
    fit = three_axis_reconstruction(*three_axis_fit(w, ridge))
    ii, jj = torch.tril_indices(w.shape[0], w.shape[0])
    return correlation(w.double()[ii, jj], fit[ii, jj])


@dataclass
class DisentanglementResult(ResultMixin):
    """Correlations ``[layer][head]`` of the fake-distance additive fit (§3.2) and of the 3-axis fit (§3.1)."""

    analysis = "disentanglement"
    model: str
    layers: list[int]
    heads: list[int]
    length: int
    distances: int
    query_position: int
    fake_distance_correlation: list[list[float]]
    three_axis_correlation: list[list[float]] | None
    mean_fake_distance_correlation: float
    mean_three_axis_correlation: float | None


@torch.no_grad()
def disentanglement(
    model: nn.Module, input_ids: torch.Tensor, *, layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None, length: int = 512, distances: int | None = None, three_axis: bool = True,
    name: str = "",
) -> DisentanglementResult:
    """Fit the disentanglement law on the first ``length`` tokens of a text.

    Args:
        length: tokens used (the keys ``j``; the query is the last of them).
        distances: number of fake distances ``d = 0..distances−1`` (default ``length``, the paper's square ``W'``).
        three_axis: also fit eq. 2 on the real ``length × length`` logit matrix (a ``3·length`` linear solve).
    """
    layers = check_layers(model, layers)
    heads = check_heads(model, heads)
    if length < 3:
        raise ValueError(f"length must be >= 3 tokens, got {length}.")
    input_ids = check_ids(input_ids, length, "disentanglement")[:, :length]
    distances = length if distances is None else distances
    if distances < 2:
        raise ValueError(f"distances must be >= 2, got {distances}.")
    captured = capture_window(model, input_ids, layers, heads, kinds=("q", "k"))
    fake, axis3 = [], []
    positions = torch.arange(length)
    d_values = torch.arange(distances)
    for layer in layers:
        inv_freq, att_scale = layer_frequencies(model, layer)
        scale = softmax_scale(model, layer) * att_scale**2
        q, k = captured[layer]["q"][0].double(), captured[layer]["k"][0].double()  # [H, S, D]
        w_fake = fake_distance_logits(q[:, -1], k, d_values, inv_freq, scale)  # [H, M, S]
        fake.append([additive_correlation(w_fake[h]) for h in range(len(heads))])
        if three_axis:
            logits = torch.einsum("hid,hjd->hij", rotate(q, positions, inv_freq), rotate(k, positions, inv_freq)) * scale
            axis3.append([three_axis_correlation(logits[h]) for h in range(len(heads))])
    return DisentanglementResult(
        model=name, layers=layers, heads=heads, length=length, distances=distances, query_position=length - 1,
        fake_distance_correlation=fake, three_axis_correlation=axis3 if three_axis else None,
        mean_fake_distance_correlation=float(torch.tensor(fake, dtype=torch.float64).nanmean()),
        mean_three_axis_correlation=float(torch.tensor(axis3, dtype=torch.float64).nanmean()) if three_axis else None,
    )


def plot_disentanglement(
    results: DisentanglementResult | Mapping[str, DisentanglementResult], path: str | os.PathLike,
) -> str:
    """Per-layer mean correlation (fake-distance and 3-axis fits), one line per model."""
    named = normalise_named(results, DisentanglementResult)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), squeeze=False)
    for name, res in named.items():
        fake = torch.tensor(res.fake_distance_correlation, dtype=torch.float64)
        axes[0, 0].plot(res.layers, fake.nanmean(1).numpy(), marker="o", label=name)
        if res.three_axis_correlation is not None:
            axis = torch.tensor(res.three_axis_correlation, dtype=torch.float64)
            axes[0, 1].plot(res.layers, axis.nanmean(1).numpy(), marker="o", label=name)
    axes[0, 0].set_title("fake-distance fit W'(d, j) ≈ a_d + b_j (eq. 3)", fontsize=9)
    axes[0, 1].set_title("3-axis fit W(i, j) ≈ a_{i−j} + b_i + c_j (eq. 2)", fontsize=9)
    for ax in axes[0]:
        ax.set_xlabel("layer")
        ax.set_ylabel("correlation (mean over heads)")
        ax.set_ylim(-0.1, 1.05)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
