"""Which weights a weight-patching row replaces, where the donor's values come from, and the in-place patch.

A row of `mechopd probe weightpatch` is (layer, module group): the parameters of the group's modules in that decoder
layer (``all``: in every decoder layer) take the donor's values, weight and bias alike (Qwen2's q/k/v biases
included). Groups (`GROUPS`): one projection (``q_proj`` .. ``o_proj``), ``qk`` (q_proj + k_proj), ``vo`` (v_proj +
o_proj), ``attn`` (all four), ``mlp`` (gate/up/down_proj), ``norms`` (input / post-attention layer norms, Qwen3's
q_norm / k_norm).

The matched-parameter control of the q/k claim (docs/method.md "Interventions and update geometry"):
  * ``vo`` has exactly q+k's parameter count in every Llama / Qwen decoder layer, GQA included
    (q: H·d_h × d, k: K·d_h × d, v: K·d_h × d, o: d × H·d_h): the structural control;
  * ``ctrl_qk`` (draw j): random ROWS of the layer(s)' other weight matrices (v, o, gate, up, down), drawn without
    replacement with a seeded generator until their parameter count reaches q+k's (the last row may overshoot by less
    than one row; the exact count is the row's ``n_params``): the unstructured control.

The patch is in place on the one loaded recipient (`patched`): the touched slices are cloned, overwritten with the
donor's, and restored on exit, bitwise. The donor is read with ``safetensors.safe_open`` one tensor at a time and
only the tensors a row needs are kept (`Donor`), never a second whole model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.sites import ATTN_MODULES, MLP_MODULES, NORM_MODULES, QK_NORMS, site_of
from mechopd.models.arch import ParamView, model_views

GROUPS: dict[str, tuple[str, ...]] = {
    "q_proj": ("q_proj",),
    "k_proj": ("k_proj",),
    "v_proj": ("v_proj",),
    "o_proj": ("o_proj",),
    "qk": ("q_proj", "k_proj"),
    "vo": ("v_proj", "o_proj"),
    "attn": ATTN_MODULES,
    "mlp": MLP_MODULES,
    "norms": NORM_MODULES + QK_NORMS,
}
CONTROL = "ctrl_qk"
CONTROL_POOL = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULES = (*GROUPS, CONTROL)
ALL = "all"
NONE = "none"


@dataclass(frozen=True)
class Target:
    """One patched tensor: its parameter name and the indices replaced along ``dim`` (None: the whole tensor; dim 1:
    a Conv1D weight's output columns). A fused q/k/v (gate/up) projection is patched by its part's exact indices
    (`mechopd.models.arch.ParamView`)."""

    name: str
    rows: tuple[int, ...] | None = None
    dim: int = 0


@dataclass(frozen=True)
class Row:
    """One weight-patching row: ``layer`` ("none", "all" or an index as text), ``module`` (a group, "ctrl_qk" or
    "none"), ``draw`` (the control's draw, else None) and the tensors it replaces."""

    layer: str
    module: str
    targets: tuple[Target, ...]
    draw: int | None = None

    def n_params(self, shapes: dict[str, torch.Size]) -> int:
        total = 0
        for t in self.targets:
            shape = shapes[t.name]
            row = shape.numel() // shape[t.dim] if len(shape) > 1 else 1
            total += shape.numel() if t.rows is None else len(t.rows) * row
        return total

    @property
    def key(self) -> str:
        return f"{self.layer}/{self.module}" + ("" if self.draw is None else f"/{self.draw}")


def parse_modules(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in MODULES]
    if not items or bad:
        raise ConfigError(
            f"--modules {text!r}: {', '.join(bad) or 'nothing named'} unknown; choose from {', '.join(MODULES)}"
        )
    return list(dict.fromkeys(items))


def parse_layers(text: str | None, n_layers: int) -> list[str]:
    """``None``: every layer then ``all``; else comma-separated indices (negative from the end) and ``all``."""
    if text is None:
        return [str(i) for i in range(n_layers)] + [ALL]
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item == ALL:
            out.append(ALL)
            continue
        try:
            i = int(item)
        except ValueError:
            raise ConfigError(f"--layers {text!r}: {item!r} is neither a layer index nor 'all'") from None
        if not -n_layers <= i < n_layers:
            raise ConfigError(f"--layers {text!r}: layer {i} is out of range for a {n_layers}-layer model")
        out.append(str(i % n_layers))
    if not out:
        raise ConfigError(f"--layers {text!r} names nothing; e.g. --layers 0,1,all")
    return list(dict.fromkeys(out))


def _layer_views(model: nn.Module, layer: str, modules: Sequence[str]) -> list[ParamView]:
    """The canonical views (fused projections split) of the group's modules in `layer` ("all": every layer)."""
    out = []
    for name, view in model_views(model).items():
        s = site_of(name)
        if s.layer is not None and s.module in modules and (layer == ALL or s.layer == int(layer)):
            out.append(view)
    return out


def _target(view: ParamView) -> Target:
    return Target(view.raw, None if view.spans is None else tuple(view.indices()), view.out_dim())


def _layer_params(model: nn.Module, layer: str, modules: Sequence[str]) -> list[Target]:
    return [_target(v) for v in _layer_views(model, layer, modules)]


def control_targets(model: nn.Module, layer: str, count: int, seed: int) -> tuple[Target, ...]:
    """Random rows of the layer(s)' v/o/gate/up/down weight matrices (rows of the projection: a Conv1D's columns, a
    fused tensor's part), in a seeded order, until ``count`` parameters."""
    views = [v for v in _layer_views(model, layer, CONTROL_POOL) if len(v.shape) == 2]
    pool = [(v, raw) for v in views for raw in v.indices()]
    g = torch.Generator().manual_seed(seed)
    chosen: dict[tuple[str, int], list[int]] = {}
    total = 0
    for k in torch.randperm(len(pool), generator=g).tolist():
        if total >= count:
            break
        view, r = pool[k]
        chosen.setdefault((view.raw, view.out_dim()), []).append(r)
        total += view.shape[1]
    if total < count:
        raise ConfigError(
            f"weightpatch: layer {layer} has fewer other parameters than q_proj + k_proj ({count}); "
            f"drop {CONTROL} from --modules"
        )
    return tuple(Target(n, tuple(sorted(rows)), dim) for (n, dim), rows in chosen.items())


def plan_rows(model: nn.Module, layers: Sequence[str], modules: Sequence[str], draws: int, seed: int) -> list[Row]:
    """The unpatched row first, then (layer, module) in the given order; a group absent from the model (no q_norm in
    Llama) is skipped; ``ctrl_qk`` gives ``draws`` rows per layer."""
    shapes = {n: p.shape for n, p in model.named_parameters()}
    rows = [Row(NONE, NONE, ())]
    for layer in layers:
        for module in modules:
            if module == CONTROL:
                qk = Row(layer, "qk", tuple(_layer_params(model, layer, GROUPS["qk"])))
                count = qk.n_params(shapes)
                rows += [
                    Row(layer, CONTROL, control_targets(model, layer, count, seed * 1000 + j), j) for j in range(draws)
                ]
                continue
            targets = _layer_params(model, layer, GROUPS[module])
            if targets:
                rows.append(Row(layer, module, tuple(targets)))
    return rows


class Donor:
    """The donor checkpoint's tensors, read one at a time through ``safe_open`` and kept once read (by site)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from mechopd.probes.weights import checkpoint_tensors

        self.path = Path(path)
        self.files = {self._key(n): (n, f) for n, f in checkpoint_tensors(path).items()}
        self.cache: dict[tuple[str, str], torch.Tensor] = {}

    @staticmethod
    def _key(name: str) -> tuple[str, str]:
        s = site_of(name)
        return s.site, s.param

    def tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        from safetensors import safe_open

        key = self._key(name)
        if key not in self.cache:
            if key not in self.files:
                raise ModelError(
                    f"donor {self.path} has no tensor for {name}; the donor must be a checkpoint of the "
                    "same architecture (e.g. the run's base)"
                )
            stored, file = self.files[key]
            with safe_open(str(file), framework="pt") as f:
                self.cache[key] = f.get_tensor(stored)
        t = self.cache[key]
        if t.shape != like.shape:
            raise ModelError(
                f"donor {self.path}: {name} has shape {tuple(t.shape)}, the model {tuple(like.shape)}; "
                "patch between checkpoints of one architecture"
            )
        return t.to(device=like.device, dtype=like.dtype)


@contextmanager
def patched(model: nn.Module, donor: Donor, row: Row) -> Iterator[None]:
    """The row's tensors (or rows of them) replaced by the donor's in place; restored bitwise on exit."""
    params = dict(model.named_parameters())
    saved: list[tuple[nn.Parameter, tuple[int, torch.Tensor] | None, torch.Tensor]] = []
    with torch.no_grad():
        for t in row.targets:
            p = params[t.name]
            src = donor.tensor(t.name, p)
            if t.rows is None:
                saved.append((p, None, p.detach().clone()))
                p.copy_(src)
            else:
                idx = torch.tensor(t.rows, device=p.device)
                saved.append((p, (t.dim, idx), p.index_select(t.dim, idx).detach().clone()))
                p.index_copy_(t.dim, idx, src.index_select(t.dim, idx))
    try:
        yield
    finally:
        with torch.no_grad():
            for param, at, old in reversed(saved):
                if at is None:
                    param.copy_(old)
                else:
                    param.index_copy_(at[0], at[1], old)
