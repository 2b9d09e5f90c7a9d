"""Several files written as ONE artifact (`FileSet`): all of them or none, committed by renames under a manifest.
Re-exported by `mechopd.core.artifacts`, the module of the single-file writers."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


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
        import shutil

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
        import shutil

        for p in self.root.glob(f".{self.name}.stage-*"):
            pid = p.name.split("stage-", 1)[1].split("-", 1)[0]
            try:
                os.kill(int(pid), 0)
            except (ProcessLookupError, ValueError):
                shutil.rmtree(p, ignore_errors=True)
            except PermissionError:
                pass

    def _commit(self) -> None:
        import hashlib

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
        import hashlib

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
