"""The geometry of the update per layer x module: `mechopd probe deltas --svd` (docs/method.md "Interventions and update
geometry").

For every 2-D weight W of a decoder layer (q/k/v/o_proj, gate/up/down_proj), with W0 the base's and ΔW = θ − W0
([m, n]), singular values σ_1 ≥ ... ≥ σ_r of ΔW (r = min(m, n)) and left singular vectors U_Δ, U0 of ΔW and W0:

    eff_rank      = exp(−Σ_i p_i log p_i),  p_i = σ_i / Σ_j σ_j           (Roy & Vetterli 2007; 1 .. r)
    topk_energy   = Σ_{i≤k} σ_i² / Σ_i σ_i²                                (the top-k singular values' share of ‖ΔW‖²_F)
    frac_above_τ  = (1/mn) Σ_ij 1[|ΔW_ij| > τ·|W0_ij|]   τ ∈ THRESHOLDS    (entries that moved by more than τ of
                                                                           their own base magnitude)
    energy90_frac = the smallest share of entries holding 90 % of ‖ΔW‖²_F  (a dense Gaussian ΔW: GAUSS_ENERGY90;
                                                                           a sparse update: far below)
    overlap_k     = ‖U0_kᵀ U_Δ,k‖²_F / k                                   (1: ΔW's top-k output directions are W0's;
                                                                           a random k-subspace of R^m: k / m =
                                                                           ``overlap_random``)

k = ``min(svd_k, r)``. Weights are streamed: two tensors (W0's and θ's) are resident at a time, read with
``safetensors.safe_open``. A zero update has eff_rank, topk_energy, energy90_frac and overlap_k undefined (NaN).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mechopd.core.artifacts import read_csv, read_float, read_json, write_csv, write_json
from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.sites import ATTN_MODULES, MLP_MODULES, natural_key, site_of
from mechopd.models.arch import ParamView

THRESHOLDS = (0.01, 0.1, 1.0)
SVD_K = 8
GAUSS_ENERGY90 = 0.4445  # share of the entries of an i.i.d. Gaussian matrix holding 90 % of its squared mass
#                           (measured on a 4000 x 4000 draw: 0.44453; the limit 2(1 − Φ(t)), ∫_{|x|<t} x² φ = 0.1)
MATRICES = ATTN_MODULES + MLP_MODULES
CSV = "deltas_svd.csv"
JSON = "deltas_svd.json"
COLUMNS = (
    "model",
    "vs",
    "site",
    "layer",
    "module",
    "rows",
    "cols",
    "k",
    "eff_rank",
    "topk_energy",
    *(f"frac_above_{t:g}" for t in THRESHOLDS),
    "energy90_frac",
    "overlap_k",
    "overlap_random",
    "delta_sq",
    "w0_sq",
)


def eff_rank(s: torch.Tensor) -> float:
    """exp of the entropy of σ_i / Σσ (Roy & Vetterli); NaN for an all-zero spectrum. s: [r] singular values."""
    total = float(s.sum())
    if total <= 0:
        return math.nan
    p = s[s > 0].double() / total
    return float(torch.exp(-(p * p.log()).sum()))


def energy_fraction(delta: torch.Tensor, share: float = 0.9) -> float:
    """Smallest share of entries whose squares hold ``share`` of Σ ΔW_ij²; NaN when ΔW = 0. delta: [m, n]."""
    sq = delta.double().flatten().square().sort(descending=True).values
    total = float(sq.sum())
    if total <= 0:
        return math.nan
    need = int(torch.searchsorted(sq.cumsum(0), torch.tensor(share * total, dtype=torch.float64)).item()) + 1
    return min(need, sq.numel()) / sq.numel()


def geometry(w0: torch.Tensor, theta: torch.Tensor, k: int = SVD_K) -> dict[str, Any]:
    """Every quantity of the module docstring for one matrix. w0, theta: [m, n] (any float dtype)."""
    dtype = torch.float64 if w0.numel() <= 1 << 22 else torch.float32  # big matrices: float32 SVD
    a, b = w0.to(dtype), theta.to(dtype)
    d = b - a
    m, n = d.shape
    u_d, s_d, _ = torch.linalg.svd(d, full_matrices=False)
    u_0 = torch.linalg.svd(a, full_matrices=False)[0]
    k = min(k, m, n)
    energy = s_d.square()
    total = float(energy.sum())
    out: dict[str, Any] = {
        "rows": m,
        "cols": n,
        "k": k,
        "eff_rank": eff_rank(s_d),
        "topk_energy": float(energy[:k].sum()) / total if total > 0 else math.nan,
    }
    for t in THRESHOLDS:
        out[f"frac_above_{t:g}"] = float((d.abs() > t * a.abs()).double().mean())
    out["energy90_frac"] = energy_fraction(d)
    overlap = float((u_0[:, :k].T @ u_d[:, :k]).square().sum()) / k
    out["overlap_k"] = overlap if total > 0 else math.nan
    out["overlap_random"] = k / m
    out["delta_sq"], out["w0_sq"] = total, float(a.square().sum())
    return out


def _tensors(path: str | os.PathLike) -> dict[tuple[str, str], tuple[ParamView, Path]]:
    """The decoder weight matrices as canonical views (fused q/k/v and gate/up split, Conv1D transposed)."""
    from mechopd.probes.delta_sums import open_checkpoint

    ckpt = open_checkpoint(path)
    out = {}
    for name, view in ckpt.views.items():
        s = site_of(name)
        if s.layer is not None and s.module in MATRICES and s.param == "weight":
            out[(s.site, s.param)] = (view, ckpt.files[view.raw])
    return out


def _read(entry: tuple[ParamView, Path]) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(entry[1]), framework="pt") as f:
        return entry[0].take(f.get_tensor(entry[0].raw))


def svd_rows(
    base_dir: str | os.PathLike, models: Mapping[str, str], k: int = SVD_K, progress: bool = True
) -> list[dict[str, Any]]:
    """One row per (model, decoder weight matrix) in layer order (`COLUMNS`); ``progress``: a bar over the matrices
    (an SVD per matrix: minutes for a real model on a CPU)."""
    from tqdm.auto import tqdm

    base = _tensors(base_dir)
    rows = []
    order = sorted(base, key=lambda kk: natural_key(site_of(base[kk][0].name)))
    bar = tqdm(total=len(order) * len(models), unit="matrix", desc="deltas svd", disable=not progress)
    for label, path in models.items():
        mine = _tensors(path)
        bar.set_postfix(model=label)
        for key in order:
            bar.update(1)
            if key not in mine:
                raise ModelError(f"{path} has no tensor {base[key][0].name}; compare checkpoints of one architecture")
            w0, theta = _read(base[key]), _read(mine[key])
            s = site_of(base[key][0].name)
            rows.append(
                {
                    "model": label,
                    "vs": "base",
                    "site": s.site,
                    "layer": s.layer,
                    "module": s.module,
                    **geometry(w0, theta, k),
                }
            )
    bar.close()
    return rows


def summarize_svd(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, pooled over its matrices: the MLP's share of Σ‖ΔW‖² and of the parameters, the numel-weighted
    energy90_frac (and the Gaussian reference), the mean overlap_k and the mean overlap_random, the mean eff_rank."""
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m]
        numel = [r["rows"] * r["cols"] for r in mine]
        dsq = sum(r["delta_sq"] for r in mine)
        mlp = [r for r in mine if r["module"] in MLP_MODULES]
        defined = [(r, n) for r, n in zip(mine, numel) if r["energy90_frac"] == r["energy90_frac"]]
        mean = lambda key, mine=mine: (lambda v: sum(v) / len(v) if v else math.nan)(  # noqa: E731
            [r[key] for r in mine if r[key] == r[key]]
        )
        out[m] = {
            "mlp_energy_share": sum(r["delta_sq"] for r in mlp) / dsq if dsq > 0 else math.nan,
            "mlp_param_share": sum(r["rows"] * r["cols"] for r in mlp) / max(1, sum(numel)),
            "energy90_frac": (
                sum(r["energy90_frac"] * n for r, n in defined) / sum(n for _, n in defined) if defined else math.nan
            ),
            "gauss_energy90": GAUSS_ENERGY90,
            "overlap_k": mean("overlap_k"),
            "overlap_random": mean("overlap_random"),
            "eff_rank": mean("eff_rank"),
            "matrices": len(mine),
        }
    return out


def svd_lines(probes_dir: Path) -> list[str]:
    """The report's lines of the update geometry (none when ``--svd`` did not run there)."""
    got = load_svd(probes_dir)
    return [_svd_line(m, s) for m, s in (got[0] if got else {}).items()]


def _svd_line(model: str, s: Mapping[str, Any]) -> str:
    """One model's line; a model equal to its base (ΔW = 0 in every matrix: every ratio undefined) says "no update",
    and an undefined number reads "n/a" (the JSON stores NaN as null)."""

    def num(key: str, places: int = 2) -> str:
        v = s.get(key)
        return "n/a" if not isinstance(v, (int, float)) or v != v else f"{v:.{places}f}"

    head = f"- **Update geometry** {model} (`probes/{CSV}`): "
    if all(num(k) == "n/a" for k in ("eff_rank", "mlp_energy_share", "energy90_frac", "overlap_k")):
        return head + "no update (ΔW = 0 in every matrix: the model equals its base)"
    return (
        head + f"mean eff_rank {num('eff_rank')}; MLP share of ‖ΔW‖² {num('mlp_energy_share')} (of the parameters "
        f"{num('mlp_param_share')}); 90 % of ‖ΔW‖² in {num('energy90_frac')} of the entries (dense Gaussian "
        f"{GAUSS_ENERGY90:.2f}); top-k overlap with W0's subspace {num('overlap_k', 3)} (random "
        f"{num('overlap_random', 3)})"
    )


def run_delta_svd(
    base_dir: str, models: Mapping[str, str], out_dir: str | os.PathLike, k: int = SVD_K, progress: bool = True
) -> list[Path]:
    """Write ``deltas_svd.csv`` (`COLUMNS`) and ``deltas_svd.json`` (settings + `summarize_svd`)."""
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"--svd-k {k!r} must be an integer >= 1")
    rows = svd_rows(base_dir, models, k, progress=progress)
    out = Path(out_dir)
    doc = {
        "settings": {"base": base_dir, "models": dict(models), "k": k, "thresholds": list(THRESHOLDS)},
        "summary": summarize_svd(rows),
    }
    return [write_csv(out / CSV, rows, COLUMNS), write_json(out / JSON, doc)]


def load_svd(probes_dir: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, str | float]]] | None:
    """(summary per model, table rows, numbers as floats) of a probes dir; None when ``--svd`` did not run there."""
    p = Path(probes_dir)
    if not (p / JSON).is_file():
        return None
    rows = [
        {k: (v if k in ("model", "vs", "site", "module") else read_float(v)) for k, v in r.items()}
        for r in read_csv(p / CSV)
    ]
    return read_json(p / JSON)["summary"], rows
