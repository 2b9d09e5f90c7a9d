"""Probe artifacts: atomic CSV / JSON writing with ONE non-finite policy, and a typed summary per probe.

Non-finite policy (every writer here, hence every probe table and summary):
  * JSON: a float that is not finite (NaN, +inf, -inf) is written as ``null`` (strict JSON; every reader accepts it).
    Reading a summary back (`read_float`), ``null`` in a numeric field is NaN.
  * CSV: ``None`` is an empty cell; floats are written as Python's ``repr`` (``nan``, ``inf``, ``-inf`` for the
    non-finite ones), which ``float()``, numpy and pandas read back exactly. An empty cell reads back as NaN.
So a CSV keeps the difference between NaN and inf (e.g. ``rel_delta`` of an update of a zero tensor), a JSON file says
"undefined" for both.
Writes are atomic: a temporary file next to the target, then ``os.replace``; a killed run never leaves half a file.
Several files that make ONE artifact (a report's JSON + CSV, a probe's tables and summary) are written as a
`FileSet`: all of them or none, committed by renames under a manifest.

Typed summaries: `Summary` is the base of what each probe writes as its JSON summary and what the report, the claims
and the figures read (``Summary.load``; ``lines()`` are the report's bullets). Each probe defines its own subclass in
its module and names it in its registration (``ProbeSpec.summary``); nothing here lists probes. No model code is
imported here.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from mechopd.core.checks import umask_mode
from mechopd.core.errors import ConfigError, DataError

S = TypeVar("S", bound="Summary")


# ------------------------------------------------------------------------------------------------------------ write
def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float as None, dataclasses as dicts, tuples as lists, paths as strings, numpy
    scalars and arrays as Python values (the JSON side of the module's policy)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalar / array, 0-d tensor
        obj = obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return str(obj)
    return obj


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], binary: bool = False) -> Path:
    """Call ``write(fh)`` on a temporary text (`binary`: bytes) file next to ``path``, then rename it into place: a
    killed writer never leaves a truncated file under the final name. Returns ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.chmod(tmp, umask_mode(directory=False))  # mkstemp's 0600 would outlive the rename
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="") as fh:
            write(fh)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """``obj`` as strict JSON (`json_safe`), atomically."""
    text = json.dumps(json_safe(obj), indent=indent, allow_nan=False)
    return atomic_write(path, lambda fh: fh.write(text))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path``, atomically."""
    return atomic_write(path, lambda fh: fh.write(text))


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> Path:
    """One strict-JSON object per line, atomically."""
    lines = [json.dumps(json_safe(r), allow_nan=False) + "\n" for r in records]
    return atomic_write(path, lambda fh: fh.writelines(lines))


def _cell(value: Any) -> Any:
    return "" if value is None else repr(value) if isinstance(value, float) else value


def _records(rows: Iterable[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) and not isinstance(r, type) else dict(r) for r in rows]


def write_csv(path: str | os.PathLike, rows: Iterable[Any], columns: Sequence[str] | None = None) -> Path:
    """Rows (dicts or dataclasses) as CSV with a header: ``columns`` or the keys in first-seen order; a key a row
    lacks is an empty cell. Floats as ``repr`` (``nan``, ``inf``), None empty (the module's policy)."""
    records = _records(rows)
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in records for k in r))

    def write(fh) -> None:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(cols)
        w.writerows([_cell(r.get(c)) for c in cols] for r in records)

    return atomic_write(path, write)


def write_rows(rows: Iterable[Any], path: str | os.PathLike) -> Path:
    """Rows to ``.csv`` (`write_csv`) or ``.json`` (a list of objects, `write_json`), chosen by the suffix."""
    p = Path(path)
    if p.suffix == ".csv":
        return write_csv(p, rows)
    if p.suffix == ".json":
        return write_json(p, _records(rows))
    raise ConfigError(f"cannot write rows to {p}: use a .csv or .json file name")


# ------------------------------------------------------------------------------------------------------- file sets
class FileSet:
    """Several files written as ONE artifact (an evaluation's ``r.json`` + ``r.csv``, a probe's tables and summary, a
    comparison's reports + ``compare.md``): all of them or none, next to other artifacts in the same directory.

        with FileSet(out_dir, "similarity") as stage:
            write_csv(stage.dir / "similarity.csv", rows)        # any writer, into the staging directory
            write_json(stage.dir / "similarity.json", summary)
        FileSet.complete(out_dir, "similarity")                  # True once the set is in place

    Why a manifest and not a renamed directory: the files of a set share their directory with other sets (every
    probe writes into ``RUN/probes``; a report lands next to the user's files), so the set cannot be one directory
    renamed into place. The files are written into ``DIR/.<name>.stage-<pid>-*`` (same file system), then committed:
    the manifest (file -> size, sha256) is written into the stage, the old manifest ``DIR/.<name>.fileset`` is
    removed, every file is renamed into ``DIR``, the new manifest last. Readers that must not take a partial set
    (the demo's skip-if-done) require `complete`: the manifest exists and every file it lists has its size and hash.
    A failure or kill while staging leaves the older set untouched (the stage is removed, or swept by the next
    `FileSet` of that name); one during the renames leaves the set incomplete, never mixed-and-complete. The commit
    needs no free space (renames only), so a full disk fails while staging, with the older set intact.
    """

    def __init__(self, directory: str | os.PathLike, name: str):
        self.root, self.name = Path(directory), name
        self.dir: Path = self.root  # the staging directory while the block runs

    @staticmethod
    def manifest_path(directory: str | os.PathLike, name: str) -> Path:
        return Path(directory) / f".{name}.fileset"  # not *.json: readers glob the artifacts by suffix

    def __enter__(self) -> FileSet:
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep()
        self.dir = Path(tempfile.mkdtemp(prefix=f".{self.name}.stage-{os.getpid()}-", dir=self.root))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:

        try:
            if exc_type is None:
                self._commit()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def relocate(self, lines: Iterable[str]) -> list[str]:
        """Printed lines that name a staged file, naming its final place instead."""
        return [str(line).replace(str(self.dir), str(self.root)) for line in lines]

    def _sweep(self) -> None:
        """Remove stages of this name left by dead processes (a killed run)."""
        for p in self.root.glob(f".{self.name}.stage-*"):
            pid = p.name.split("stage-", 1)[1].split("-", 1)[0]
            try:
                os.kill(int(pid), 0)
            except (ProcessLookupError, ValueError):
                shutil.rmtree(p, ignore_errors=True)
            except PermissionError:
                pass

    def _commit(self) -> None:

        files = sorted(p for p in self.dir.iterdir() if p.is_file())
        entries = {
            p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in files
        }
        staged_manifest = self.dir / ".manifest"
        staged_manifest.write_text(json.dumps({"name": self.name, "files": entries}, indent=1))
        final_manifest = self.manifest_path(self.root, self.name)
        final_manifest.unlink(missing_ok=True)  # from here until the last rename the set reads as incomplete
        for p in files:
            os.replace(p, self.root / p.name)
        os.replace(staged_manifest, final_manifest)

    @classmethod
    def complete(
        cls, directory: str | os.PathLike, name: str, required: Iterable[str] = (), verify: bool = False
    ) -> bool:
        """True when the set `name` in `directory` is whole: its manifest exists, lists every file of `required`, and
        every file it lists is present (``verify``: also with the recorded size and sha256, i.e. unedited). A commit
        removes the manifest before its first rename, so a set cut short reads as incomplete without ``verify``."""
        try:
            entries = json.loads(cls.manifest_path(directory, name).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if not isinstance(entries, dict) or not set(required) <= set(entries):
            return False
        for fname, meta in entries.items():
            p = Path(directory) / fname
            try:
                if not p.is_file() or (
                    verify
                    and (
                        p.stat().st_size != meta["size"] or hashlib.sha256(p.read_bytes()).hexdigest() != meta["sha256"]
                    )
                ):
                    return False
            except (OSError, KeyError, TypeError):
                return False
        return True


# ------------------------------------------------------------------------------------------------------------- read
def read_float(value: Any) -> float:
    """A JSON number / null or a CSV cell -> float; null, empty and 'None' are NaN (the module's policy)."""
    if value is None or value == "" or value == "None":
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DataError(
            f"{value!r} is not a number; rewrite the artifact with the mechopd probe that owns it"
        ) from None


def finite_or_none(value: Any, where: str) -> float | None:
    """A JSON number read as a float: null, NaN and ±inf are None (n/a, the module's policy); text, a bool, a list or
    an object -> DataError naming `where`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(
            f"{where}: {str(value)[:40]!r} is not a number (null for n/a); rewrite it with the mechopd "
            "command that writes it"
        )
    v = float(value)
    return v if math.isfinite(v) else None


def read_json(path: str | os.PathLike) -> Any:
    """Parsed JSON; DataError naming the file when it is absent, not a file, not UTF-8, malformed or nested too
    deeply to parse."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{p} does not exist; run the probe that writes it (mechopd probe ...)") from None
    except IsADirectoryError:
        raise DataError(
            f"{p} is a directory, not a JSON file; remove it and rerun the command that writes it"
        ) from None
    except UnicodeDecodeError as err:
        raise DataError(f"{p} is not UTF-8 text ({err.reason} at byte {err.start}); rewrite it with mechopd") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{p} is not valid JSON ({err.msg}, line {err.lineno}); rewrite it with mechopd") from None
    except RecursionError:
        raise DataError(f"{p} nests too deeply to be a mechopd artifact; rewrite it with mechopd") from None


def metric_lines(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a metrics.jsonl ([] when absent); a step logged twice keeps its last line. A line that is
    not one JSON object (a bare number, a list, nested too deeply) -> DataError naming the file and line."""
    if not Path(path).is_file():
        return []
    by_step: dict[Any, dict[str, Any]] = {}
    for i, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            rec = None
        if not isinstance(rec, dict) or isinstance(rec.get("step"), (dict, list)):
            raise DataError(
                f"{path} line {i}: not a metrics record; each line must be one JSON object such as "
                '{"step": 1, "loss": 0.5} (restore the file from the run or delete the line)'
            )
        by_step[(rec.get("step"), "eval/acc_x" in rec)] = rec
    return [by_step[k] for k in sorted(by_step, key=lambda k: (_step_key(k[0], path), k[1]))]


def _step_key(step: Any, path: Any) -> float:
    if step is None:
        return -1
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise DataError(f"{path}: step {str(step)[:20]!r} is not a number; restore the file from the run")
    return step


def mean_kept_fraction(train_dir: str | os.PathLike) -> float | None:
    """Mean of ``kept_fraction`` over the steps of ``train_dir/metrics.jsonl`` (None if never logged): the share of
    response positions the selector actually trained on (non-finite values -> DataError)."""
    path = Path(train_dir) / "metrics.jsonl"
    vals = [
        finite_or_none(m["kept_fraction"], f"{path} step {m.get('step')}: kept_fraction")
        for m in metric_lines(path)
        if m.get("kept_fraction") is not None
    ]
    kept = [v for v in vals if v is not None]
    return sum(kept) / len(kept) if kept else None


class Row(dict):
    """A CSV row (cells as text) whose missing column is a DataError naming the file and the column, not a
    KeyError traceback in whichever figure or report line reads it."""

    source: str = ""

    def __missing__(self, key: str) -> str:
        raise DataError(
            f"{self.source} has no column {key!r} (columns: {', '.join(self)}); rewrite it with the mechopd "
            "probe that owns it"
        )


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
    """Rows of a CSV written by `write_csv` (cells as text; `read_float` for numbers); a file that is not UTF-8, not
    a CSV, or has a row with more or fewer cells than its header -> DataError naming the file, line and fix."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; run the probe that writes it (mechopd probe ...)")
    rows: list[dict[str, str]] = []
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            for rec in reader:
                if None in rec or None in rec.values():
                    raise DataError(
                        f"{p} line {reader.line_num}: {'more' if None in rec else 'fewer'} cells than "
                        "its header; rewrite it with the mechopd probe that owns it"
                    )
                row = Row(rec)
                row.source = str(p)
                rows.append(row)
    except UnicodeDecodeError as err:
        raise DataError(f"{p} is not UTF-8 text ({err.reason} at byte {err.start}); rewrite it with mechopd") from None
    except csv.Error as err:
        raise DataError(f"{p} is not a readable CSV ({err}); rewrite it with the mechopd probe that owns it") from None
    return rows


# -------------------------------------------------------------------------------------------------------- summaries
@dataclass
class Summary:
    """Base of the typed probe summaries: ``FILE`` is the JSON file name under ``RUN/probes``."""

    FILE: ClassVar[str] = ""
    PROBE: ClassVar[str] = ""
    FLOATS: ClassVar[tuple[str, ...]] = ()  # top-level numeric fields (null -> NaN when read)

    def save(self, probes_dir: str | os.PathLike, **extra: Any) -> Path:
        """Write ``probes_dir/FILE`` (the summary's fields, plus ``extra`` top-level keys such as a table's rows)."""
        return write_json(Path(probes_dir) / self.FILE, {**dataclasses.asdict(self), **extra})

    @classmethod
    def from_dict(cls: type[S], doc: Mapping[str, Any], where: str = "summary") -> S:
        if not isinstance(doc, Mapping):
            raise DataError(f"{where}: expected a JSON object written by mechopd probe")
        names = {f.name for f in dataclasses.fields(cls)}
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        absent = [k for k in required if k not in doc]
        if absent:
            raise DataError(
                f"{where} lacks {absent[0]!r} (written by an older mechopd?); rerun "
                f"mechopd probe {cls.PROBE} --run RUN_DIR"
            )
        values = {k: doc[k] for k in names if k in doc}
        values.update({k: read_float(values[k]) for k in cls.FLOATS if k in values})
        return cls(**values)

    @classmethod
    def load(cls: type[S], probes_dir: str | os.PathLike) -> S | None:
        """The summary in ``probes_dir``, or None when the probe has not run there."""
        path = Path(probes_dir) / cls.FILE
        if not path.is_file():
            return None
        out = cls.from_dict(read_json(path), str(path))
        out.located(probes_dir)
        return out

    @classmethod
    def require(cls: type[S], probes_dir: str | os.PathLike) -> S:
        """`load` where the summary must be there (its probe has just written it): absent -> DataError."""
        out = cls.load(probes_dir)
        if out is None:
            raise DataError(f"{Path(probes_dir) / cls.FILE} does not exist; run mechopd probe {cls.PROBE}")
        return out

    def located(self, probes_dir: str | os.PathLike) -> None:
        """Remember ``probes_dir``, where the summary's tables are (not a field: not written back)."""
        self.probes_dir = Path(probes_dir)

    def table(self, name: str) -> list[dict[str, str]]:
        """Rows of the CSV ``name`` next to the summary (the probe's tidy table; cells as text)."""
        return read_csv(Path(getattr(self, "probes_dir", ".")) / name)
