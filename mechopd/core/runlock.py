"""One writer per run directory: an exclusive ``fcntl.flock`` on ``DIR/.mechopd.lock`` for the life of a command.

Every verb that writes into a directory holds that directory's lock while it writes (`hold`): ``train`` its ``--out``,
``eval`` the directory of its report(s), ``probe`` its output directory, ``demo`` / ``aggregate`` their ``--out``,
``figures`` the run it redraws, ``pretrain`` the organism directory. A second process on the same directory refuses at
once with one line naming the holder (pid, host, command, start time, read from the lock file) and the fix.

- Stale locks: ``flock`` belongs to the open file, and the kernel drops it when the holder dies (``kill -9``
  included), so a lock file left by a dead run is simply taken over; nothing has to be deleted by hand. A lock that is
  still held although its recorded pid is gone (same host) is held by a child process that inherited it; the error
  says so.
- Never turned against the user: the lock file is opened without following links (``O_NOFOLLOW``) and must be a
  regular file with one name (not a link, a directory, a FIFO or a hard link to another file, which the record would
  overwrite); anything else is refused with one line naming the path. A holder's record that is unreadable or
  malformed (a pid that is not a number, or out of range) names "an unknown process".
- Re-entrant within one process (the demo holds RUN and its trainer RUN/train/opd; `aggregate` inside the demo takes
  RUN again): a nested `hold` of a directory this process already holds is a no-op.
- What a refusal leaves: nothing. The lock file (and the directory, if `hold` created it) is removed when the holder
  exits, and when the command failed without writing a top-level entry, the directory's mtime is restored.
- Shared file systems: on NFS (v4, or v3 with lockd) Linux maps ``flock`` onto byte-range locks that the server
  arbitrates between hosts; on a file system without lock support (some FUSE / old NFS mounts) acquiring fails with an
  error that names ``MECHOPD_NO_LOCK=1``, which turns locking off (then two jobs on one ``--out`` are on you).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from mechopd.core.errors import MechopdError

LOCK_NAME = ".mechopd.lock"
_HELD: dict[str, int] = {}  # resolved dir -> nesting depth, for this process


class RunLockedError(MechopdError):
    """Another process is writing into this directory."""


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (one that exists but is another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PID_MAX = 4194304  # Linux's largest pid_max (2**22): a recorded pid outside 1..PID_MAX is not a pid
RECORD_MAX = 4096  # bytes of a lock record read (a planted huge file costs nothing)


def _record(fd: int) -> dict[str, str | int] | None:
    """The holder's record read from the open lock file: None when it is unreadable or malformed (not a JSON object,
    a pid that is not an integer in 1..PID_MAX); {} when the holder has not written it yet."""
    try:
        raw = os.pread(fd, RECORD_MAX, 0)
        info = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    pid = info.get("pid")
    if info and (isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= PID_MAX):
        return None
    return {k: (v if k == "pid" else " ".join(str(v).split())[:80]) for k, v in info.items()}


def _holder(fd: int, lock: Path) -> str:
    """The holder's record as text, e.g. ``mechopd train (pid 12, host h, since 2026-12-01 22:01:02 UTC)``."""
    info = _record(fd)
    if info is None:
        return f"an unknown process (its record in {lock} is unreadable or malformed)"
    if not info:
        return "another process (it has not written its record yet)"
    pid, host = info["pid"], info.get("host")
    text = f"mechopd {info.get('verb', '?')} (pid {pid}, host {host}, since {info.get('since', '?')})"
    if host == socket.gethostname() and not pid_alive(int(pid)):
        text += f"; pid {pid} is gone, so a process it started (a worker) still holds the lock: end that process"
    return text


def _open(lock: Path) -> int:
    """`lock` opened for writing without following a link; refused unless it is a regular file of its own (not a
    link, a directory, a device or a FIFO, nor a hard link to some other file that the record would overwrite)."""
    fix = f"remove {lock} (mechopd recreates it) and rerun"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or lock.is_symlink():
            raise MechopdError(
                f"the run lock {lock} is a symbolic link (mechopd never writes through one); {fix}"
            ) from None
        if e.errno in (errno.EISDIR, errno.ENXIO, errno.EACCES, errno.EPERM, errno.EROFS):
            kind = "a directory" if lock.is_dir() else "not writable (read-only, immutable or another user's)"
            raise MechopdError(f"the run lock {lock} is {kind}; {fix}") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise MechopdError(f"the run lock {lock} is {kind}; {fix}")
    return fd


def _open_locked(lock: Path, wait: bool) -> int:
    """An fd of `lock` holding the exclusive flock (retrying when the file was replaced under us)."""
    while True:
        fd = _open(lock)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if not (wait and e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)):
                    raise
                print(f"waiting for {_holder(fd, lock)} to release {lock.parent}", file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            holder = _holder(fd, lock)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLockedError(
                    f"{lock.parent} is in use by {holder}; wait for it to finish or pass another --out"
                ) from None
            raise MechopdError(
                f"cannot lock {lock} ({e.strerror}): this file system has no lock support; set "
                "MECHOPD_NO_LOCK=1 to run without the run-directory lock"
            ) from None
        try:  # the holder before us may have unlinked the file after we opened it: lock the file at the path
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _created_dirs(root: Path) -> list[Path]:
    """The directories `root.mkdir(parents=True)` will create, deepest first."""
    out, p = [], root
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


@contextlib.contextmanager
def hold(directory: str | os.PathLike, verb: str, wait: bool = False) -> Iterator[Path]:
    """Hold the lock of `directory` (created if missing) while the body runs; see the module docstring.

    wait: block until the holder releases it instead of refusing (a shared cache such as an organism directory)."""
    root = Path(directory)
    key = str(root.resolve())
    if key in _HELD or os.environ.get("MECHOPD_NO_LOCK") == "1":
        _HELD[key] = _HELD.get(key, 0) + 1
        try:
            yield root
        finally:
            if _HELD is not None:  # None: interpreter shutdown (see below)
                _HELD[key] -= 1
                if not _HELD[key]:
                    del _HELD[key]
        return
    if not lockable(root):
        raise MechopdError(
            f"{root} cannot be created or written (a file or a read-only directory is in the way); "
            "pass a directory you can write to"
        )
    created = _created_dirs(root)
    parent_times = {p.parent: p.parent.stat() for p in created[-1:]}
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK_NAME
    had_lock_file = lock.exists()
    before = (root.stat(), sorted(os.listdir(root)))
    try:
        fd = _open_locked(lock, wait)
    except BaseException:  # refused: leave no directory this call created
        _remove_created(created, parent_times)
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "verb": verb,
                    "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                }
            ).encode(),
        )
    except OSError:  # a full disk: the lock is held all the same, the record is only for the error message
        pass
    _HELD[key] = 1
    failed = False
    try:
        yield root
    except BaseException:
        failed = True
        raise
    finally:
        if _HELD is not None:  # None: interpreter shutdown finalizing a lock never released (the OS drops it)
            del _HELD[key]
            _release(fd, lock, root, created, parent_times, had_lock_file, before, failed)


_HOLD_CODE = hold.__wrapped__.__code__  # type: ignore[attr-defined]  # the generator's frames (acquire, release)


def busy(frame: FrameType | None) -> bool:
    """True when the stack from ``frame`` (a signal handler's) is acquiring or releasing a lock: in `hold`'s own code,
    in contextlib entering or leaving a `hold`, or in a helper here. An exception raised there (a stop signal's) could
    leave the lock file behind, so `pipeline.pool` delays such a stop until the lock is held or released. The body
    of a ``with hold(...)`` is not busy: its generator is suspended then, off the stack."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename == __file__:
            return True
        if code.co_filename == contextlib.__file__ and code.co_name in ("__enter__", "__exit__"):
            if getattr(getattr(frame.f_locals.get("self"), "gen", None), "gi_code", None) is _HOLD_CODE:
                return True
        frame = frame.f_back
    return False


def _release(fd, lock, root, created, parent_times, had_lock_file, before, failed) -> None:
    """Unlink the lock file we made (while still holding it), close, and undo what a failed command left."""
    if not had_lock_file:
        with contextlib.suppress(OSError):  # only our own file: the dir may have been replaced by a rename since
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                lock.unlink()
    os.close(fd)
    if not root.exists():  # the holder removed its own directory (a temporary run): nothing left to undo
        return
    if created and not any(root.iterdir()):
        _remove_created(created, parent_times)
        return
    st, names = before
    if failed and root.exists() and sorted(os.listdir(root)) == names:
        with contextlib.suppress(OSError):
            os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))


def _remove_created(created: list[Path], parent_times: dict) -> None:
    """rmdir the (empty) directories `hold` created, deepest first, and restore the first existing parent's times."""
    for d in created:
        with contextlib.suppress(OSError):
            d.rmdir()
    for parent, st in parent_times.items():
        with contextlib.suppress(OSError):
            os.utime(parent, ns=(st.st_atime_ns, st.st_mtime_ns))


def lockable(directory: str | os.PathLike) -> bool:
    """`directory` is one or can be created by this user (else the command's own check reports the bad path)."""
    p = Path(directory)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)


def held(directory: str | os.PathLike) -> bool:
    """True when this process holds `directory`'s lock."""
    return str(Path(directory).resolve()) in _HELD


if sys.platform == "win32":  # pragma: no cover - no fcntl: locking is a POSIX feature here

    @contextlib.contextmanager
    def hold(directory: str | os.PathLike, verb: str, wait: bool = False) -> Iterator[Path]:  # noqa: F811
        yield Path(directory)
