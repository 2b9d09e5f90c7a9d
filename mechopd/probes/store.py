"""The activation store on disk: both views' activations at the response positions, per model, in bounded shards.

Layout of a store directory (written by ``mechopd probe cache``, read by ``similarity`` / ``lens`` ``--cache DIR``):

    cache_manifest.json         format, sites, dtype, positions, items file, per model: path, sha256 of its weight
                                files, shards (file, first item, item count, bytes, sha256); the probe settings
    cache_items.jsonl           the items (uid, prompt_ids_x, prompt_ids_c, response_ids): the runner's items file
    <label>.shard-00000.safetensors   per site and view a tensor ``"<site>|<view>"`` ``[rows, d]`` (the model's
                                dtype) and ``"offsets"`` ``[items + 1]`` int64: item j's rows are
                                offsets[j] .. offsets[j+1]

Positions, per item with n real response tokens: n + 1 rows, row 0 the last prompt token (whose output predicts
response token 0) and row 1 + t the hidden state OF response token t. Hence ``positions="response"`` = rows 1..n
and ``positions="predict"`` = rows 0..n-1 (the scorer's and the lens's positions), ``positions="predict_stop"`` =
all n + 1 (capture.py's: the predicting states, then the last token's own; the two-view cosine's); index t is the same
token in both views (core/views.py). Padded slots are not stored.

Memory: the writer holds at most one shard (``shard_bytes``, plus the item that closes it); the reader reads one shard
at a time and hands out ``[items, R, d]`` padded copies of it, so a pass over the store peaks at about three shards,
whatever the number of items.

What a store proves before it is used (else one `DataError`): every shard is a plain file name of the store directory
(no path, no link leading out of it); the shard counts add up to the items; a shard's bytes hash to the sha256 the
manifest records, hold every site and view, and its offsets cut exactly its rows into its item count; and the models
a probe reads it for (`check_models`) have the weight files whose sha256 the store recorded (seed 1's models never
read seed 0's store).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mechopd.core.artifacts import write_json
from mechopd.core.errors import DataError
from mechopd.core.provenance import weight_hashes

FORMAT = "mechopd-activations/1"
MANIFEST = "cache_manifest.json"
ITEMS = "cache_items.jsonl"
VIEWS = ("x", "c")
POSITIONS = {"response": slice(1, None), "predict": slice(None, -1), "predict_stop": slice(None)}  # of the n + 1 rows


class StoreWriter:
    """Writes one model's items shard by shard: `add` per item (in item order), `close` at the end."""

    def __init__(self, root: Path, label: str, sites: Sequence[str], shard_bytes: int):
        self.dir, self.label, self.sites, self.limit = Path(root), label, list(sites), shard_bytes
        self.shards: list[dict[str, Any]] = []
        self._reset(0)

    def _reset(self, first: int) -> None:
        self.rows: dict[tuple[str, str], list[torch.Tensor]] = {}
        self.first, self.offsets, self.bytes = first, [0], 0

    def add(self, acts: dict[tuple[str, str], torch.Tensor]) -> None:
        """One item: ``{(site, view): [n + 1, d]}`` for every site and view."""
        for key, t in acts.items():
            self.rows.setdefault(key, []).append(t.detach().cpu())
        self.offsets.append(self.offsets[-1] + next(iter(acts.values())).shape[0])
        self.bytes += sum(t.numel() * t.element_size() for t in acts.values())
        if self.bytes >= self.limit:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save

        count = len(self.offsets) - 1
        if not count:
            return
        name = f"{self.label}.shard-{len(self.shards):05d}.safetensors"  # flat: one directory, one file set
        tensors = {f"{s}|{v}": torch.cat(self.rows[(s, v)]).contiguous() for s in self.sites for v in VIEWS}
        tensors["offsets"] = torch.tensor(self.offsets, dtype=torch.int64)
        data = save(tensors)  # bytes: hashed as written (a full disk is the OSError the CLI reports in one line)
        try:
            (self.dir / name).write_bytes(data)
        except BaseException:
            (self.dir / name).unlink(missing_ok=True)  # our own half-written shard
            raise
        digest = hashlib.sha256(data).hexdigest()
        self.shards.append({"file": name, "first": self.first, "count": count, "bytes": self.bytes, "sha256": digest})
        self._reset(self.first + count)

    def close(self) -> list[dict[str, Any]]:
        self._flush()
        return self.shards


def write_manifest(
    root: Path,
    sites: Sequence[str],
    dtype: str,
    models: dict[str, dict[str, Any]],
    n_items: int,
    settings: dict[str, Any],
) -> Path:
    return write_json(
        Path(root) / MANIFEST,
        {
            "format": FORMAT,
            "sites": list(sites),
            "dtype": dtype,
            "positions": "n + 1 rows per item: last prompt token, then response "
            "tokens (response = rows 1.., predict = rows ..n-1)",
            "items_file": ITEMS,
            "n_items": n_items,
            "models": models,
            "settings": settings,
        },
    )


class ActivationStore:
    """A store directory opened for reading (module docstring). ``labels``, ``sites``, ``items`` (dicts with uid,
    prompt_ids_x, prompt_ids_c, response_ids), ``path_of(label)``; `batches` streams it shard by shard."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        try:
            self.manifest = json.loads((self.root / MANIFEST).read_text())
            self.items = [json.loads(x) for x in (self.root / ITEMS).read_text().splitlines() if x.strip()]
        except (OSError, ValueError) as e:
            raise DataError(
                f"--cache {self.root}: not an activation store ({type(e).__name__}: no readable "
                f"{MANIFEST} / {ITEMS}); write one with mechopd probe cache --out DIR"
            ) from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise DataError(
                f"--cache {self.root}: format {found!r} is not {FORMAT!r}; rewrite it with this version's mechopd "
                "probe cache"
            )
        self._check_layout()
        self.sites, self.labels = list(self.manifest["sites"]), list(self.manifest["models"])

    def _bad(self, what: str) -> DataError:
        return DataError(f"--cache {self.root}: {what}; rewrite the store with mechopd probe cache --out DIR")

    def _check_layout(self) -> None:
        """The manifest's sites, models and shards are well formed; every shard is a file of this directory (no path,
        no link out of it) and each model's shard counts add up to the store's items."""
        sites, models = self.manifest.get("sites"), self.manifest.get("models")
        if not isinstance(sites, list) or not all(isinstance(s, str) for s in sites) or not isinstance(models, dict):
            raise self._bad(f"{MANIFEST} lacks its sites list or models mapping")
        if not all(isinstance(it, dict) for it in self.items):
            raise self._bad(f"{ITEMS} holds a line that is not an item object")
        here = self.root.resolve()
        for label, rec in models.items():
            shards = rec.get("shards") if isinstance(rec, dict) else None
            if not isinstance(shards, list) or not all(isinstance(sh, dict) for sh in shards):
                raise self._bad(f"{MANIFEST} gives model {label!r} no shard list")
            for sh in shards:
                name = sh.get("file")
                if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                    raise self._bad(f"model {label!r}'s shard {name!r} is not a file name inside the store")
                if (self.root / name).resolve().parent != here:
                    raise self._bad(f"model {label!r}'s shard {name} is a link that leads out of the store")
                if not isinstance(sh.get("count"), int) or sh["count"] < 1:
                    raise self._bad(f"model {label!r}'s shard {name} has no item count")
            if sum(sh["count"] for sh in shards) != len(self.items):
                raise self._bad(
                    f"model {label!r}'s shards hold {sum(sh['count'] for sh in shards)} items, the store "
                    f"{len(self.items)}"
                )

    def check_models(self, models: Mapping[str, str | Path]) -> None:
        """Each label's model is the one the store was written from: its weight files' sha256 are the recorded ones
        (else one DataError: another seed's or another run's store)."""
        for label, path in models.items():
            rec = self.manifest["models"].get(label)
            if not isinstance(rec, dict):
                continue  # `check` names a missing label
            if weight_hashes(path) != rec.get("sha256"):
                raise DataError(
                    f"--cache {self.root} was written from other weights for {label!r} (it recorded "
                    f"{rec.get('path')}, this run's is {path}: their weight files' sha256 differ); write a store "
                    "of these models with mechopd probe cache, or drop --cache"
                )

    @classmethod
    def open(cls, cache: str | Path | None, setup: Any) -> tuple[ActivationStore | None, Any]:
        """(the store, `setup` taking its responses) for ``--cache DIR``; (None, `setup`) without one."""
        if cache is None:
            return None, setup
        store = cls(cache)
        return store, dataclasses.replace(setup, responses_from=store.responses_file())

    def feed(self, label: str, sites: Sequence[str], positions: str, add: Any, items_file: str | Path) -> None:
        """``add(site, h_x, h_c, mask)`` for every site of every shard of `label` (`batches`), once the probe's saved
        items are checked to be the store's (`check_items`)."""
        self.check_items(items_file)
        for mask, pairs in self.batches(label, sites, positions):
            for s in sites:
                add(s, *pairs[s], mask)

    def path_of(self, label: str) -> str:
        return self.manifest["models"][label]["path"]

    def check(self, labels: Sequence[str], sites: Sequence[str]) -> None:
        """Every label and site asked for is in the store (else one DataError naming what is there)."""
        for what, asked, have in (("model", labels, self.labels), ("site", sites, self.sites)):
            missing = [a for a in asked if a not in have]
            if missing:
                raise DataError(
                    f"--cache {self.root} holds no {what} {missing[0]!r} (it holds {', '.join(have)}); "
                    f"run mechopd probe cache with it, or drop --cache"
                )

    def check_items(self, items_file: str | Path) -> None:
        """The probe's saved items (``<probe>_items.jsonl``: uid and both views' prompt ids) are the store's, in order
        (else one DataError: other --n / --seed / --split / render than the store was written with)."""
        mine = [json.loads(x) for x in Path(items_file).read_text().splitlines() if x.strip()]
        keys = ("uid", "prompt_ids_x", "prompt_ids_c", "response_ids")
        if [[r[k] for k in keys] for r in mine] != [[it[k] for k in keys] for it in self.items]:
            raise DataError(
                f"--cache {self.root} holds other items than this probe's ({len(self.items)} vs "
                f"{len(mine)}; written for {(self.manifest.get('settings') or {}).get('run')}); use the --run / --n / "
                "--seed / --split / render it was written with, or drop --cache"
            )

    def responses_file(self) -> str:
        """The store's items file, as a ``--responses-from`` source (uid + response_ids per line)."""
        return str(self.root / ITEMS)

    @property
    def responses(self) -> list[list[int]]:
        return [list(it["response_ids"]) for it in self.items]

    def batches(self, label: str, sites: Sequence[str], positions: str) -> Iterator[tuple[torch.Tensor, dict]]:
        """Per shard of `label`: ``(mask [B, R] bool, {site: (h_x [B, R', d], h_c [B, R', d])})`` at `positions`
        (``response`` | ``predict``: R' = R; ``predict_stop``: R' = R + 1), items in store order, R = the shard's
        longest response, padding zero."""
        self.check([label], sites)
        keep = POSITIONS[positions]
        for shard in self.manifest["models"][label]["shards"]:
            tensors, off = self._read_shard(shard, sites)
            n = [b - a - 1 for a, b in zip(off, off[1:])]  # response tokens per item
            B, R = len(n), max(n)
            mask = torch.arange(R)[None, :] < torch.tensor(n)[:, None]  # [B, R]
            out = {}
            for s in sites:
                pair = []
                for v in VIEWS:
                    rows = tensors[f"{s}|{v}"]  # [rows, d]
                    h = rows.new_zeros(B, R + (positions == "predict_stop"), rows.shape[-1])
                    for j in range(B):
                        got = rows[off[j] : off[j + 1]][keep]
                        h[j, : got.shape[0]] = got
                    pair.append(h)
                out[s] = tuple(pair)
            yield mask, out

    def _read_shard(self, shard: dict[str, Any], sites: Sequence[str]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """One shard's tensors and offsets, once its bytes hash to the recorded sha256 and its offsets cut exactly its
        rows into its item count (a truncated, corrupted or edited shard is one DataError)."""
        from safetensors.torch import load

        name = shard["file"]
        try:
            data = (self.root / name).read_bytes()
        except OSError as e:
            raise self._bad(f"shard {name} is unreadable ({e.strerror or type(e).__name__})") from None
        if "sha256" in shard and hashlib.sha256(data).hexdigest() != shard["sha256"]:
            raise self._bad(f"shard {name} is not the file it wrote (its sha256 differs: truncated or changed)")
        try:
            tensors = load(data)
        except Exception as e:  # safetensors' own error type for a damaged header or data
            raise self._bad(
                f"shard {name} is not a readable safetensors file ({str(e).splitlines()[0][:80]})"
            ) from None
        off_t = tensors.get("offsets")
        off = off_t.tolist() if off_t is not None and off_t.dim() == 1 else []
        keys = [f"{s}|{v}" for s in sites for v in VIEWS]
        sizes = {tensors[k].shape[0] for k in keys if k in tensors and tensors[k].dim() == 2}
        ok = (
            len(off) == shard["count"] + 1
            and off[0] == 0
            and all(b - a >= 1 for a, b in zip(off, off[1:]))
            and all(k in tensors for k in keys)
            and sizes == {off[-1]}
        )
        if not ok:
            raise self._bad(f"shard {name}'s offsets and rows do not describe its {shard['count']} items")
        return tensors, off
