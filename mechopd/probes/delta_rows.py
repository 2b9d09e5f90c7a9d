"""The rows of the parameter-delta table (`mechopd.probes.deltas`) and their files: ``deltas.csv`` / ``deltas.json``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from mechopd.core.artifacts import read_csv, read_float, read_json, write_csv, write_json
from mechopd.core.errors import DataError


@dataclass(frozen=True)
class DeltaRow:
    """One value of the parameter-delta table. ``model``: a label, "base" on w0_norm rows; ``vs``: "base" (update
    from W0), a label (pair rows), "" (w0_norm); ``site``: a probe address, in aggregates also ``layers.3``,
    ``layers.*.self_attn.q_proj``, ``*``; ``layer``: None outside decoder layers; ``module``: ``q_proj``,
    ``embed_tokens``, ... ("*" for many); ``param``: ``weight`` / ``bias`` ("*" aggregated); ``numel``: parameters
    covered; ``tied_to``: "embed_tokens" on lm_head rows of tied checkpoints, else ""; ``metric``: one of METRICS;
    ``value``: NaN where undefined (cos of a zero update, ratio 0/0)."""

    model: str
    vs: str
    site: str
    layer: int | None
    module: str
    param: str
    numel: int
    tied_to: str
    metric: str
    value: float


def write_table(rows: Iterable[DeltaRow], path: str | os.PathLike) -> list[Path]:
    """Write ``<path>.csv`` and ``<path>.json`` atomically (a suffix on ``path`` is replaced); returns both paths.

    The `mechopd.core.artifacts` policy: CSV floats as repr (``nan``, ``inf``), layer empty when None; JSON a list of
    objects with every non-finite value as null (read back as NaN).
    """
    rows, stem = list(rows), Path(path).with_suffix("")
    cols = [f.name for f in fields(DeltaRow)]
    return [
        write_csv(stem.with_name(stem.name + ".csv"), rows, cols),
        write_json(stem.with_name(stem.name + ".json"), rows, indent=0),
    ]


def read_table(path: str | os.PathLike) -> list[DeltaRow]:
    """Read a table written by ``write_table`` (``.csv`` or ``.json``)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"table {p} does not exist; write it with mechopd probe deltas")
    records = read_json(p) if p.suffix == ".json" else read_csv(p)
    try:
        return [
            DeltaRow(
                model=str(rec["model"]),
                vs=str(rec["vs"]),
                site=str(rec["site"]),
                layer=None if rec["layer"] in (None, "") else int(rec["layer"]),
                module=str(rec["module"]),
                param=str(rec["param"]),
                numel=int(rec["numel"]),
                tied_to=str(rec["tied_to"]),
                metric=str(rec["metric"]),
                value=read_float(rec["value"]),
            )
            for rec in records
        ]
    except (KeyError, ValueError, TypeError, AttributeError, DataError) as err:
        raise DataError(f"{p} is not a parameter-delta table ({err!r}); rewrite it with write_table") from None
