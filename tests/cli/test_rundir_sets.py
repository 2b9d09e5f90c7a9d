"""Multi-file artifacts land as one set (`artifacts.FileSet`), the demo's skip-if-done requires the whole set, and
`aggregate` takes only distinct seeds of one study and never writes into an input."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.artifacts import FileSet


def _write_set(d: Path, name: str, content: str) -> None:
    with FileSet(d, name) as stage:
        (stage.dir / f"{name}.json").write_text(content)
        (stage.dir / f"{name}.csv").write_text(content * 2)


def test_a_set_is_all_or_nothing(tmp_path, monkeypatch):
    _write_set(tmp_path, "r", "old")
    assert FileSet.complete(tmp_path, "r", ("r.json", "r.csv"))
    with pytest.raises(RuntimeError):  # killed / failed while staging: the older set is untouched, no stage left
        with FileSet(tmp_path, "r") as stage:
            (stage.dir / "r.json").write_text("new")
            raise RuntimeError("boom")
    assert (tmp_path / "r.json").read_text() == "old" and FileSet.complete(tmp_path, "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.fileset", "r.csv", "r.json"]
    real_replace, calls = os.replace, []

    def dies_after_first(src, dst):  # a kill between the renames of the commit
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dies_after_first)
    with pytest.raises(KeyboardInterrupt):
        _write_set(tmp_path, "r", "new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert not FileSet.complete(tmp_path, "r")  # mixed old/new files never read as a complete set
    _write_set(tmp_path, "r", "new")  # the rerun completes
    assert FileSet.complete(tmp_path, "r") and (tmp_path / "r.csv").read_text() == "newnew"
    (tmp_path / "r.csv").write_text("edited")
    assert FileSet.complete(tmp_path, "r") and not FileSet.complete(tmp_path, "r", verify=True)  # size / sha256
    (tmp_path / "r.csv").unlink()
    assert not FileSet.complete(tmp_path, "r")  # a member gone
    assert not FileSet.complete(tmp_path, "r", ("r.json", "r.md"))


def test_eval_report_and_compare_are_sets(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    org = str(tiny_rules_organism)
    assert main(["eval", "--task", "rules", "--model", org, "--n", "3", "--out", "e/r.json"]) == 0
    assert FileSet.complete(tmp_path / "e", "r", ("r.json", "r.csv"))
    assert main(["eval", "--task", "rules", "--compare", f"a={org}", f"b={org}", "--n", "3", "--out", "c"]) == 0
    assert FileSet.complete(tmp_path / "c", "compare", ("a.json", "a.csv", "b.json", "b.csv", "compare.md"))
    assert not [p for p in (tmp_path / "c").iterdir() if ".stage-" in p.name]


def test_demo_skips_only_complete_sets(tmp_path, monkeypatch):
    """A probe killed between its files (the first output present, the set not committed) is run again."""
    from mechopd.pipeline import demo as demo_mod
    from mechopd.pipeline.stages import run_probes

    ran = []

    class Spec:
        name, outputs, demo = "fake", ("fake.csv", "fake.json"), {}

        def __call__(self, setup, out, **kw):
            ran.append(out)
            return []

    monkeypatch.setattr("mechopd.probes.registry.probes", lambda: [Spec()])
    monkeypatch.setattr("mechopd.probes.setup.ProbeSetup", lambda **kw: None)
    cfg = demo_mod.DemoConfig(fast=True, out=str(tmp_path))
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "fake.csv").write_text("x")  # only the first file, as a kill leaves it
    run_probes(cfg, {}, tmp_path)
    assert len(ran) == 1
    with FileSet(tmp_path / "probes", "fake") as stage:
        for f in Spec.outputs:
            (stage.dir / f).write_text("done")
    run_probes(cfg, {}, tmp_path)
    assert len(ran) == 1  # complete: skipped


# ------------------------------------------------------------------------------------------------------ aggregate
def _demo_run(d: Path, **cfg) -> Path:
    from mechopd.pipeline.demo import DemoConfig

    d.mkdir(parents=True)
    conf = dataclasses.asdict(DemoConfig(out=str(d), **cfg))
    (d / "demo.json").write_text(json.dumps({"task": "rules", "methods": ["opd"], "config": conf}))
    return d


@pytest.mark.parametrize(
    "case,needle",
    [
        ("same-run-twice", "are the same run"),
        ("copy-of-a-seed", "are both seed 0"),
        ("fast-and-full", "fast True -> False"),
        ("out-is-an-input", "is the input"),
        ("out-inside-an-input", "inside the input"),
        ("an-aggregate-as-input", "is itself an aggregate"),
    ],
)
def test_aggregate_refuses_non_seeds_and_writing_into_inputs(tmp_path, monkeypatch, capsys, case, needle):
    monkeypatch.chdir(tmp_path)
    s0 = _demo_run(tmp_path / "s0", fast=True, seed=0)
    s1 = lambda name="s1", **kw: str(_demo_run(tmp_path / name, **{"fast": True, "seed": 1, **kw}))  # noqa: E731
    runs, out = {
        "same-run-twice": lambda: (["s0", "./s0"], "agg"),
        "copy-of-a-seed": lambda: (["s0", s1("copy", seed=0)], "agg"),
        "fast-and-full": lambda: (["s0", s1("full", fast=False)], "agg"),
        "out-is-an-input": lambda: (["s0", s1()], "s0"),
        "out-inside-an-input": lambda: (["s0", s1()], "s0/agg"),
        "an-aggregate-as-input": lambda: (["s0", s1("a")], "agg"),
    }[case]()
    if case == "an-aggregate-as-input":
        doc = json.loads((tmp_path / "a" / "demo.json").read_text())
        (tmp_path / "a" / "demo.json").write_text(json.dumps({**doc, "aggregate": True}))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    mtime = s0.stat().st_mtime_ns
    assert main(["aggregate", *runs, "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before and s0.stat().st_mtime_ns == mtime
