"""Linear CKA over tokens from running sums (the similarity probe's ``--cka``; docs/method.md):

CKA(X, Y) = ||X~^T Y~||_F^2 / (||X~^T X~||_F ||Y~^T Y~||_F),   X~ = X - mean(X) (centred over tokens)
"""

from __future__ import annotations

import math

import torch


class StreamingCKA:
    """Linear CKA over tokens from running sums (module docstring). Feed ``[n, d]`` chunks of both views.

    Sums are taken of shifted values (shift = the first chunk's mean), which leaves the centred cross-products
    unchanged and keeps float32 chunk products accurate; the sums themselves are float64.
    """

    def __init__(self) -> None:
        self.n = 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x, y: ``[n, d]`` the same tokens in the two views."""
        if x.shape[0] == 0:
            return
        x, y = x.float(), y.float()
        if self.n == 0:
            d = x.shape[1]
            self.mx, self.my = x.mean(0), y.mean(0)
            f64, dev = torch.float64, x.device
            self.sxx, self.syy, self.sxy = (torch.zeros(d, d, dtype=f64, device=dev) for _ in range(3))
            self.sx, self.sy = torch.zeros(d, dtype=f64, device=dev), torch.zeros(d, dtype=f64, device=dev)
        xs, ys = x - self.mx, y - self.my  # [n, d]
        self.sxx += (xs.T @ xs).double()
        self.syy += (ys.T @ ys).double()
        self.sxy += (xs.T @ ys).double()
        self.sx += xs.sum(0).double()
        self.sy += ys.sum(0).double()
        self.n += x.shape[0]

    def value(self) -> float:
        if self.n < 2:
            return float("nan")
        cxx = self.sxx - torch.outer(self.sx, self.sx) / self.n  # X~^T X~
        cyy = self.syy - torch.outer(self.sy, self.sy) / self.n
        cxy = self.sxy - torch.outer(self.sx, self.sy) / self.n  # X~^T Y~
        den = math.sqrt(float((cxx**2).sum()) * float((cyy**2).sum()))
        return float((cxy**2).sum()) / den if den > 0 else float("nan")
