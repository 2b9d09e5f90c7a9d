"""Hostile inputs, round 3: the newest inputs get the old checks (#32). Each refusal: exit 2, one ``error:`` line
naming the problem and its fix, no traceback, the disk unchanged (`tests.cli.hostile.check`); figures written whole
or not at all; other contexts held to the length rule of the main one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.hostile import Hostile, check_in_workspace, evaluate, train, write


def _demo_dir(w: Path, probe_n, organism: str) -> Path:
    """A demo dir as `probe --run` reads it: demo.json (config.probe_n, organism), one trained run's config and
    final/."""
    d = w / "demo"
    write(
        d,
        "demo.json",
        json.dumps({"task": "rules", "methods": ["opd"], "organism": organism, "config": {"probe_n": probe_n}}),
    )
    write(d, "train/opd/config.yaml", "task: rules\n")
    write(d, "train/opd/final/config.json", "{}")
    return d


def _sim_run(o: Path, w: Path, probe_n, organism: str | None = None) -> list[str]:
    return ["probe", "similarity", "--run", str(_demo_dir(w, probe_n, organism or str(o))), "--out", str(w / "sim")]


def _cwd_relative_organism(o: Path, w: Path) -> list[str]:
    """demo.json records its organism as ``org`` (relative): the run has none there, the cwd has a model there."""
    from tests.cli.hostile import copy_org

    copy_org(o, w, "org")
    return _sim_run(o, w, 4, "org")


DEEP = "[" * 100000 + "]" * 100000

CASES = [
    Hostile(
        "follow",
        "follow-contexts-unknown-weight-0",
        lambda o, w: train(o, w, "--set", "follow_contexts=[nope]"),
        "follow_contexts: 'nope' is not an other context",
        before_load=False,
    ),
    Hostile(
        "causal",
        "cross-one-model-twice",
        lambda o, w: [
            "probe",
            "patching",
            "--task",
            "rules",
            "--models",
            f"opd={o}",
            "--n",
            "2",
            "--cross",
            "opd,opd",
            "--out",
            str(w / "p"),
        ],
        "names one model twice",
    ),
    Hostile("demo-json", "probe-n-text", lambda o, w: _sim_run(o, w, "8x"), "config.probe_n='8x' is not an integer"),
    Hostile("demo-json", "probe-n-float", lambda o, w: _sim_run(o, w, 2.5), "config.probe_n=2.5 is not an integer"),
    Hostile("demo-json", "organism-relative-to-the-cwd", _cwd_relative_organism, "relative"),
    Hostile(
        "eval",
        "csv-name-is-a-directory",
        lambda o, w: evaluate(o, "--out", str(w / "r.json")) if (w / "r.csv").mkdir() is None else [],
        "where the records CSV goes, is a directory",
    ),
    Hostile(
        "jsonl",
        "task-data-100000-deep",
        lambda o, w: evaluate(o, "--task", "jsonl", "--option", f"path={write(w, 'deep.jsonl', DEEP + chr(10))}"),
        "line 1: nests too deeply",
    ),
    Hostile(
        "yaml",
        "config-alias-bomb",
        lambda o, w: [
            "train",
            str(
                write(
                    w,
                    "cfg.yaml",
                    "a: &a [x,x,x,x,x,x,x,x,x]\n"
                    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
                )
            ),
            "--out",
            str(w / "run"),
        ],
        "more than 20 aliases",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_new_inputs_get_the_old_checks(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)


def test_other_contexts_fit_the_model_like_the_main_one(organism_tokenizer):
    """A 40k-word other context on a model of 2048 positions: refused by the one length rule (`pinning.check_fits`),
    naming the other context; the same items without it pass."""
    from mechopd.core.errors import TaskError
    from mechopd.core.views import RenderSpec
    from mechopd.evaluation.pinning import check_fits
    from mechopd.tasks.base import OtherContext, get_task

    task = get_task("rules")
    items = task.examples("test", 3, 0)

    class Long:
        def other_contexts(self, ex):
            return [OtherContext("short", "shift:2", None), OtherContext("huge", " ".join(["a"] * 40000), None)]

    spec = RenderSpec(placement=task.placement)
    check_fits(organism_tokenizer, items, spec, 8, 2048, task)
    with pytest.raises(
        TaskError,
        match="other context 'huge' \\+ prompt \\(\\d+ tokens\\) plus max_new_tokens 8 "
        "exceeds the model's maximum length 2048",
    ):
        check_fits(organism_tokenizer, items, spec, 8, 2048, Long())


def test_a_killed_figure_write_leaves_the_old_file_or_none(tmp_path, monkeypatch):
    """savefig killed half-way: the final name holds the previous complete image (or nothing), never a truncated
    one; no temporary file is left."""
    from matplotlib.figure import Figure

    from mechopd.plots import _common

    fig = _common.new_figure(2, 2) if hasattr(_common, "new_figure") else Figure()
    good = _common._save(fig, tmp_path, "fig")
    before = {p.name: p.read_bytes() for p in good}

    def killed(self, fh, **kw):
        fh.write(b"\x89PNG\r\n\x1a\n half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", killed)
    with pytest.raises(KeyboardInterrupt):
        _common._save(Figure(), tmp_path, "fig")
    with pytest.raises(KeyboardInterrupt):
        _common._save(Figure(), tmp_path, "new")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
