"""Hostile inputs, run locks (`mechopd.core.runlock`): a lock file that cannot be turned against the user.

A ``.mechopd.lock`` planted as a symbolic link, a directory, a FIFO or a hard link to a user's file is refused with one
line naming it, and the file it points to is left as it was; a live holder whose record is malformed is named "an
unknown process" instead of crashing the second process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mechopd.core.runlock import LOCK_NAME, RunLockedError, hold
from tests.cli.hostile import Hostile, check_in_workspace, train, write

REPO = Path(__file__).resolve().parents[2]


def _planted(ws: Path, how: str) -> Path:
    """``ws/run/.mechopd.lock`` planted as `how`; a user's file ``ws/precious.txt`` it may point to."""
    target = write(ws, "precious.txt", "the user's data\n")
    lock = ws / "run" / LOCK_NAME
    lock.parent.mkdir()
    if how == "symlink":
        lock.symlink_to(target)
    elif how == "dangling":
        lock.symlink_to(ws / "created-outside.txt")
    elif how == "dir":
        lock.mkdir()
    elif how == "fifo":
        os.mkfifo(lock)
    elif how == "hardlink":
        os.link(target, lock)
    return lock


CASES = [
    Hostile("lock", "symlink-to-a-file", lambda o, w: (_planted(w, "symlink"), train(o, w))[1], "is a symbolic link"),
    Hostile("lock", "dangling-symlink", lambda o, w: (_planted(w, "dangling"), train(o, w))[1], "is a symbolic link"),
    Hostile("lock", "directory", lambda o, w: (_planted(w, "dir"), train(o, w))[1], "is a directory"),
    Hostile("lock", "fifo", lambda o, w: (_planted(w, "fifo"), train(o, w))[1], "is not a regular file"),
    Hostile("lock", "hardlink-to-a-file", lambda o, w: (_planted(w, "hardlink"), train(o, w))[1], "is a hard link"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_planted_lock_file_is_refused_and_nothing_written(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    line = check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)
    assert LOCK_NAME in line and "remove" in line
    ws = tmp_path / "ws"
    assert (ws / "precious.txt").read_text() == "the user's data\n" and not (ws / "created-outside.txt").exists()


def test_an_immutable_lock_file_is_refused(tmp_path):
    lock = _planted(tmp_path, "none")
    lock.write_text("")
    if subprocess.run(["chattr", "+i", str(lock)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs CAP_LINUX_IMMUTABLE and a file system that has the flag")
    try:
        with pytest.raises(Exception, match="is not writable") as e:
            with hold(lock.parent, "train"):
                pass
        assert not isinstance(e.value, RunLockedError) and "\n" not in str(e.value)
    finally:
        subprocess.run(["chattr", "-i", str(lock)])


@pytest.mark.parametrize(
    "record",
    [
        '{"pid": "abc", "host": "h"}',
        '{"pid": 99999999999999999999}',
        '{"pid": -3}',
        "[1, 2]",
        '{"pid": true}',
        "\xff\xfe not json",
        '{"host": "h"}',
    ],
)
def test_a_live_holder_with_a_malformed_record_is_an_unknown_process(tmp_path, record):
    """The holder keeps the flock while its record is garbage: the second process refuses with one line."""
    lock = tmp_path / "d" / LOCK_NAME
    lock.parent.mkdir()
    code = textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, {record.encode("utf-8", "surrogateescape")!r})
        print("held", flush=True)
        time.sleep(600)
        """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as e:
            with hold(lock.parent, "train"):
                pass
        msg = str(e.value)
        assert "in use by an unknown process" in msg and str(lock) in msg and "\n" not in msg, msg
    finally:
        p.kill()
        p.wait()


def test_a_held_lock_with_a_huge_newline_laden_record_is_one_short_line(tmp_path):
    lock = tmp_path / "d" / LOCK_NAME
    lock.parent.mkdir()
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    os.write(fd, ('{"pid": 1, "host": "x", "verb": "' + "a\\n# injected\\n" * 10 + '"}').encode())
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, os, time\nfd = os.open({str(lock)!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as e:
            with hold(lock.parent, "train"):
                pass
        assert "\n" not in str(e.value) and len(str(e.value)) < 400 and "mechopd a # injected" in str(e.value)
    finally:
        p.kill()
        p.wait()
        os.close(fd)
