"""What `mechopd explore` reads, checked: the run's evaluation reports and causal-probe files, strictly.

Every file is read as UTF-8 and parsed strictly: JSON with a bare ``NaN`` / ``Infinity`` (which mechopd's writers
never emit: `mechopd.core.artifacts` writes ``null``), a record without the fields the page draws, a number that is not
finite in a per-token list, or a CSV without the columns the page shows is one `DataError` naming the file, the line
and the fix. CSV cells keep `mechopd.core.artifacts`' policy (``nan`` / ``inf`` / empty are valid cells): the page shows
them as written.

Inputs (``RUN`` a run dir, its ``probes/`` dir, or a ``mechopd eval --compare`` directory):
  ``RUN/eval/<model>.json``          per item: uid, response_x / response_xc, correct_x / correct_xc, prompt, context,
                                     target (reports written before the texts were recorded show "not recorded"),
                                     ``other_records`` (answers under other contexts) and the summary
  ``RUN/probes/lens_tokens.jsonl``   per model and detail item: tokens, per-token KL(p_c ‖ p_x) per site, top tokens
  ``RUN/probes/patching_tokens.jsonl``, ``attention_tokens.jsonl`` and ``lens.csv``, ``patching.csv``,
  ``attention.csv``                  where present
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from mechopd.core.errors import DataError

EVAL_FIELDS = ("uid", "correct_x", "correct_xc", "response_x", "response_xc")
TABLES = {
    "lens": ("model", "site", "kl_c_x", "top1_agree"),
    "patching": ("model", "site", "component", "direction", "window", "recovered"),
    "attention": ("model", "layer", "head", "context_share"),
}


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (byte {e.start}); rewrite it as UTF-8 or rerun the command that wrote it"
        ) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str, where: str) -> Any:
    """``json.loads`` that refuses NaN / Infinity (`DataError` naming ``where``)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        kind = "NaN / Infinity (not JSON; mechopd writes null)" if "not JSON" in str(e) else "not valid JSON"
        raise DataError(f"{where} is {kind}; rerun the command that wrote it") from None


def read_json(path: Path) -> Any:
    return loads(read_text(path), str(path))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            rec = loads(line, f"{path} line {i}")
            if not isinstance(rec, dict):
                raise DataError(f"{path} line {i} is not a JSON object; rerun the probe that wrote it")
            out.append(rec)
    return out


def read_table(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """Rows of a probe CSV (cells as text) that has every one of ``columns``."""
    rows = list(csv.DictReader(io.StringIO(read_text(path), newline="")))
    have = set(rows[0]) if rows else set()
    missing = [c for c in columns if c not in have]
    if rows and missing:
        raise DataError(f"{path} lacks the column(s) {', '.join(missing)}; rerun the probe that wrote it")
    if any(None in r or any(v is None for v in r.values()) for r in rows):
        raise DataError(f"{path} has a row whose cell count differs from the header; rerun the probe that wrote it")
    return rows


def _finite_list(v: Any, n: int | None, where: str) -> list[float]:
    ok = isinstance(v, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v
    )
    if not ok or (n is not None and len(v) != n):
        raise DataError(f"{where}: expected a list of {n if n is not None else 'the'} finite numbers; rerun the probe")
    return v


def _series(rec: dict[str, Any], key: str, n: int, where: str, required: bool = False) -> dict[str, list[float]]:
    """``rec[key]``: {site or layer: per-token values} with one finite value per response token."""
    val = rec.get(key)
    if val is None and not required:
        return {}
    if not isinstance(val, dict) or (required and not val):
        raise DataError(f"{where}: '{key}' must be an object of per-token lists; rerun the probe")
    return {str(k): _finite_list(v, n, f"{where} '{key}.{k}'") for k, v in val.items()}


def token_record(rec: dict[str, Any], where: str) -> tuple[str, int, str, list[str]]:
    """(model, item, uid, tokens) of one ``*_tokens.jsonl`` record, checked."""
    model, item, uid = rec.get("model"), rec.get("item"), rec.get("uid")
    if not isinstance(model, str) or not isinstance(item, int) or isinstance(item, bool) or not isinstance(uid, str):
        raise DataError(f"{where}: expected string 'model', integer 'item' and string 'uid'; rerun the probe")
    tokens = rec.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise DataError(f"{where}: 'tokens' must be a list of strings; rerun mechopd probe lens")
    return model, item, uid, tokens


def _tops(v: Any, n: int, where: str) -> list[Any]:
    if v is None:
        return []
    ok = (
        isinstance(v, list)
        and len(v) == n
        and all(
            isinstance(pos, list)
            and all(
                isinstance(p, list)
                and len(p) == 2
                and isinstance(p[0], str)
                and isinstance(p[1], (int, float))
                and math.isfinite(p[1])
                for p in pos
            )
            for pos in v
        )
    )
    if not ok:
        raise DataError(f"{where}: top tokens must be one list of [token, probability] pairs per response token")
    return v


def lens_records(path: Path) -> list[dict[str, Any]]:
    """``lens_tokens.jsonl`` checked: per record model, item, uid, tokens, kl {site: [R]}, top_x / top_c."""
    out = []
    for i, rec in enumerate(read_jsonl(path), 1):
        where = f"{path} record {i}"
        model, item, uid, tokens = token_record(rec, where)
        kl = _series(rec, "kl", len(tokens), where, required=True)
        out.append(
            {
                "model": model,
                "item": item,
                "uid": uid,
                "tokens": tokens,
                "kl": kl,
                "top_x": _tops(rec.get("top_x"), len(tokens), where),
                "top_c": _tops(rec.get("top_c"), len(tokens), where),
            }
        )
    return out


def _matrix(v: Any, where: str) -> dict[str, list[list[float]]]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DataError(f"{where}: expected an object of per-layer matrices; rerun mechopd probe attention")
    return {
        str(k): [_finite_list(row, None, where) for row in (m if isinstance(m, list) else [None])] for k, m in v.items()
    }


def side_records(path: Path, key: str, n_tokens: dict[tuple[str, str], int]) -> dict[tuple[str, str], dict]:
    """``patching_tokens.jsonl`` (key ``kl_patched``) or ``attention_tokens.jsonl`` (``ctx_share``), checked against the
    lens' token counts, keyed by (model, uid)."""
    if not path.is_file():
        return {}
    out = {}
    for i, rec in enumerate(read_jsonl(path), 1):
        where = f"{path} record {i}"
        model, _, uid, _ = token_record({"tokens": [], **rec}, where)
        n = n_tokens.get((model, uid))
        got: dict[str, Any] = {key: _series(rec, key, n, where, required=True) if n is not None else {}}
        if key == "ctx_share":
            got.update(heads=_matrix(rec.get("ctx_heads"), where), keys=_matrix(rec.get("ctx_keys"), where))
            toks = rec.get("ctx_tokens", [])
            if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
                raise DataError(f"{where}: 'ctx_tokens' must be a list of strings; rerun mechopd probe attention")
            got["ctx_tokens"] = toks
        out[(model, uid)] = got
    return out


def _eval_record(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, dict) or any(k not in rec for k in EVAL_FIELDS):
        raise DataError(f"{where}: a record needs {', '.join(EVAL_FIELDS)}; rerun mechopd eval")
    if not isinstance(rec["uid"], str) or not all(isinstance(rec[k], str) for k in ("response_x", "response_xc")):
        raise DataError(f"{where}: 'uid' and the responses must be strings; rerun mechopd eval")
    if not all(isinstance(rec[k], bool) for k in ("correct_x", "correct_xc")):
        raise DataError(f"{where}: correct_x / correct_xc must be true or false; rerun mechopd eval")
    for k in ("prompt", "context"):
        if rec.get(k) is not None and not isinstance(rec[k], str):
            raise DataError(f"{where}: '{k}' must be a string; rerun mechopd eval")
    return rec


def _other(rec: Any, where: str) -> dict[str, Any]:
    keys = ("uid", "label", "response", "follow", "stick")
    if (
        not isinstance(rec, dict)
        or any(k not in rec for k in keys)
        or not all(isinstance(rec[k], str) for k in keys[:3])
        or not all(isinstance(rec[k], bool) for k in keys[3:])
    ):
        raise DataError(
            f"{where}: an other-context record needs string uid, label, response and boolean follow, "
            "stick; rerun mechopd eval --other-contexts"
        )
    return rec


def eval_report(path: Path) -> dict[str, Any] | None:
    """An evaluation report checked (None: a JSON file of that directory that is not one, e.g. a manifest)."""
    doc = read_json(path)
    if not isinstance(doc, dict) or ("records" not in doc and "summary" not in doc):
        return None
    recs, summary = doc.get("records"), doc.get("summary")
    if not isinstance(recs, list) or not isinstance(summary, dict):
        raise DataError(f"{path}: 'records' must be a list and 'summary' an object; rerun mechopd eval")
    records = [_eval_record(r, f"{path} record {i}") for i, r in enumerate(recs, 1)]
    others = doc.get("other_records") or []
    if not isinstance(others, list):
        raise DataError(f"{path}: 'other_records' must be a list; rerun mechopd eval --other-contexts")
    other = [_other(r, f"{path} other record {i}") for i, r in enumerate(others, 1)]
    return {"summary": summary, "records": records, "other": other}


def eval_dir(run: Path) -> Path | None:
    """``RUN/eval`` (a run), or RUN itself when it is a ``mechopd eval --compare`` directory."""
    for d in (run / "eval", run.parent / "eval" if run.name == "probes" else None, run):
        if d is not None and d.is_dir() and (d.name == "eval" or (d / "compare.csv").is_file()):
            return d
    return None
