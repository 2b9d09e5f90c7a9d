"""`mechopd demo --fast` end to end, then `mechopd figures` reproduces the same files from saved artifacts."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from mechopd.cli import main


def _digests(d):
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.png"))}


@pytest.mark.slow
def test_demo_fast_then_figures(tmp_path, monkeypatch, capsys, fast_demo_two_workers):
    """The session's `mechopd demo --fast` (copied: this test redraws its figures), its output, files and report."""
    shutil.copytree(fast_demo_two_workers.parent, tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    said = (fast_demo_two_workers.parents[1] / "demo.out").read_text()
    first = said.splitlines()[0]
    assert "SMOKE RUN" in first and "too small" in first and "`mechopd demo` (without --fast)" in first
    run = tmp_path / "runs" / "demo"
    assert (run / "report.md").read_text().startswith("> **SMOKE RUN (mechopd demo --fast)")
    assert not (run / "train" / "nca_const").exists()  # the paper's constant β collapses here: not a default run
    _check_the_method_runs(run)
    for f in ("similarity.csv", "gradients.csv", "deltas.csv", "teachability_summary.json"):
        assert (run / "probes" / f).exists(), f
    report = (run / "report.md").read_text()
    assert "Context removability" in report and "regime" in report and "figures/" in report
    labels = json.loads((run / "demo.json").read_text())["labels"]
    kept = [
        json.loads(line)["kept_fraction"]
        for line in (run / "train" / "ta_opd" / "metrics.jsonl").open()
        if "kept_fraction" in json.loads(line)
    ]
    assert labels["ta_opd"] == f"TA-OPD (ρ=0.10, K=2, kept {sum(kept) / len(kept):.2f})" and labels["ta_opd"] in report
    assert labels["nca"] == "NCA (β=0.5, from step 2)" and "nca_const" not in labels
    assert "## The papers' claims" in report and "The anchor's schedule" in report
    follow = (run / "train" / "nca_follow" / "config.yaml").read_text()
    assert "shift:1" in follow and "repeat:2" not in follow  # trained on the shifts, the repeats held out
    # the fast organism does not use its context: the floor rule decides no claim
    assert report.index("## Findings") < report.index("## Context removability")
    assert "0 of " in report.split("## Findings")[1].split("\n\n")[1] and "floor" in report
    assert "## Context following" in report and "Teachability checkpoint" in report
    assert "the distilled student keeps following other contexts" in report
    before = _digests(run / "figures")
    expected = {
        "training_curves",
        "gradient_training",
        "removability",
        "layer_cosine",
        "gradient_alignment",
        "parameter_deltas",
        "teachability",
        "context_following",
    }  # the regime map needs a defined Harm (an item right without the context)
    assert expected <= {n[:-4] for n in before}
    # a second demo (here: one worker, in this process) finds every stage done
    assert main(["demo", "--fast", "--out", "runs/demo"]) == 0
    assert "runs/demo: done, nothing to run" in capsys.readouterr().out
    # redraw from artifacts only: identical files
    for p in (run / "figures").iterdir():
        p.unlink()
    assert main(["figures", "runs/demo"]) == 0
    assert _digests(run / "figures") == before


def _check_the_method_runs(run):
    """Every default method of the demo above trained to a final checkpoint, evaluated in both views and under the
    other contexts."""
    for m in ("opd", "nca", "ta_opd", "nca_follow"):
        assert (run / "train" / m / "final" / "model.safetensors").exists()
        rep = json.loads((run / "eval" / f"{m}.json").read_text())
        assert set(rep["summary"]) >= {
            "acc_x",
            "acc_xc",
            "harm",
            "help",
            "both_correct",
            "delta_len",
            "regime",
            "follow_other",
            "stick",
            "retention",
        }
        assert [r["label"] for r in rep["other_contexts"]] == [
            "shift:1",
            "shift:2",
            "shift:3",
            "shift:4",
            "shift:5",
            "repeat:2",
            "repeat:3",
        ]  # the distilled rule: reverse


@pytest.mark.slow
def test_demo_numbers_do_not_depend_on_the_worker_count(tmp_path, monkeypatch, fast_demo_two_workers):
    """One worker in this process (two intra-op threads outside the jobs) and two worker processes (one thread outside:
    the session's `fast_demo_two_workers`) write the same numbers, organism included (each run pretrains its own)."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    try:
        torch.set_num_threads(2)
        assert main(["demo", "--fast", "--workers", "1", "--out", "runs/demo"]) == 0
    finally:
        torch.set_num_threads(before)
    outs = [tmp_path / "runs" / "demo", fast_demo_two_workers]
    assert outs[0].resolve() != outs[1].resolve()
    for m in ("base", "opd", "nca", "ta_opd", "nca_follow"):
        a, b = (json.loads((o / "eval" / f"{m}.json").read_text()) for o in outs)
        assert a["summary"] == b["summary"] and a["other_contexts"] == b["other_contexts"], m
    for m in ("opd", "nca_follow"):
        a, b = ([json.loads(x).get("loss") for x in (o / "train" / m / "metrics.jsonl").open()] for o in outs)
        assert a == b and any(v is not None for v in a), m


def test_every_demo_stage_runs_on_its_pinned_thread_count(tmp_path, monkeypatch):
    """The organism on ORGANISM_THREADS, every job on --job-threads, whatever the process's own count (the float
    summation order of the organism-sized matmuls depends on it)."""
    import torch

    from mechopd.pipeline import demo as demo_mod
    from mechopd.pipeline import pool as demo_pool
    from mechopd.pipeline.demo import DemoConfig

    seen: dict[str, int] = {}
    (tmp_path / "org").mkdir()  # the seed runs' study checks that its student exists
    monkeypatch.setattr(
        demo_mod, "organism", lambda cfg: seen.setdefault("organism", torch.get_num_threads()) and tmp_path / "org"
    )
    monkeypatch.setattr(
        demo_mod, "train_runs", lambda cfg, s, r, m: seen.setdefault(f"train-{next(iter(m))}", torch.get_num_threads())
    )
    monkeypatch.setattr(
        demo_mod, "finish_seed", lambda cfg, student=None: seen.setdefault("finish", torch.get_num_threads())
    )
    monkeypatch.setattr(demo_mod, "record_wall_time", lambda *a: tmp_path / "report.md")
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        demo_mod._demo(DemoConfig(out=str(tmp_path / "d"), fast=True, workers=1, job_threads=1))
        assert torch.get_num_threads() == 3  # restored
    finally:
        torch.set_num_threads(before)
    assert seen.pop("organism") == demo_pool.ORGANISM_THREADS == 2
    assert seen and set(seen.values()) == {1} and "finish" in seen and "train-nca_follow" in seen


def test_a_chosen_seed_is_a_one_seed_demo_and_seed_with_seeds_is_refused(tmp_path, capsys):
    from mechopd.pipeline.demo import DemoConfig, default_seeds

    assert DemoConfig().seeds == default_seeds("rules") == 6 and DemoConfig(seed=2).seeds == 1
    assert DemoConfig(fast=True).seeds == 1 and DemoConfig(task="sokoban").seeds == 1
    assert main(["demo", "--seed", "3", "--seeds", "2", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--seeds 1" in err and "\n" not in err and not (tmp_path / "d").exists()


def _failing_train(cfg, student, run, methods):
    from mechopd.core.errors import ConfigError

    raise ConfigError(f"boom in {next(iter(methods))}")


def _unused_finish(cfg, student=None):
    raise AssertionError("a finish job ran although its trainings failed")


def test_a_failing_job_stops_the_pool_names_the_job_and_keeps_its_traceback(tmp_path):
    from mechopd.core.errors import ConfigError
    from mechopd.pipeline.demo import DemoConfig
    from mechopd.pipeline.pool import run_seed_runs

    cfg = DemoConfig(out=str(tmp_path / "d"), fast=True, workers=2)
    lines: list[str] = []
    with pytest.raises(ConfigError, match="boom in"):
        run_seed_runs([cfg], tmp_path / "org", 2, lines.append, _failing_train, _unused_finish)
    failed = [ln for ln in lines if "failed" in ln]
    assert len(failed) == 1 and "train-" in failed[0] and "log " in failed[0]
    logs = list((tmp_path / "d" / "logs").glob("train-*.log"))
    assert logs and any("ConfigError: boom in" in p.read_text() for p in logs)


@pytest.mark.slow
def test_demo_seeds_writes_one_run_per_seed_and_the_aggregate(fast_demo_three_seeds):
    """The session's `mechopd demo --fast --seeds 3` (read only; last in this file, so that the README test's worker
    has built it by then)."""
    run = fast_demo_three_seeds
    for k in (0, 1, 2):
        cfg = json.loads((run / f"seed-{k}" / "demo.json").read_text())["config"]
        assert cfg["seed"] == k and cfg["organism_seed"] == 0
    agg = json.loads((run / "aggregate.json").read_text())
    assert agg["models"]["opd"]["acc_x"]["n"] == 3 and "hierarchical" in agg["interval"]
    report = (run / "report.md").read_text()
    assert "3 training seeds" in report and "## The papers' claims" in report
    assert (run / "figures" / "training_curves.png").exists()
    # seeds >= 1 skip what no claim reads (figures, the study's first_seed_only probes); seed 0 has everything
    assert (run / "seed-0" / "figures" / "layer_cosine.png").exists() and not (run / "seed-1" / "figures").exists()
    assert (run / "seed-0" / "probes" / "patching.csv").exists()
    assert not (run / "seed-1" / "probes" / "patching.csv").exists()
    assert (run / "seed-1" / "probes" / "similarity.csv").exists()  # the claims read it on every seed
    for name in ("weightpatch.csv", "weightpatch_items.jsonl", "localization_items.jsonl", "deltas_svd.csv"):
        assert (run / "seed-2" / "probes" / name).exists(), name  # the intervention claims read them on every seed
