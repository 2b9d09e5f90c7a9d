"""Probe items that matter (issue 52) on a tiny rules organism: ``select: opd`` draws the held-out items the model
learned or was harmed on, from the run's evaluation, records them, and refuses what it cannot select."""

from __future__ import annotations

import json

import pytest

from mechopd.core.errors import ConfigError
from mechopd.probes.setup import ProbeSetup
from mechopd.tasks import get_task

from .test_weightpatch import _perturb_attention

SEED, EVAL_N = 1, 12


@pytest.fixture(scope="module")
def run_dir(tiny_rules_organism, tmp_path_factory):
    """A run dir with models and an evaluation: opd right without c on items 0-4 (base wrong on all but item 4),
    wrong with c on items 3 and 5: learned 0-3, harmed 3 (and not 5: wrong without c too)."""
    root = tmp_path_factory.mktemp("informative")
    opd = _perturb_attention(tiny_rules_organism, root / "opd", scale=0.2)
    items = get_task("rules").examples("test", EVAL_N, SEED)
    (root / "eval").mkdir()
    for name, right_x, wrong_xc in (("opd", {0, 1, 2, 3, 4}, {3, 5}), ("base", {4}, set())):
        records = [
            {"uid": e.uid, "sample": 0, "correct_x": i in right_x, "correct_xc": i not in wrong_xc}
            for i, e in enumerate(items)
        ]
        (root / "eval" / f"{name}.json").write_text(json.dumps({"records": records}))
    return root, {"base": str(tiny_rules_organism), "opd": opd}, [e.uid for e in items]


def _setup(run_dir, **kw):
    root, models, _ = run_dir
    return ProbeSetup(task="rules", n=16, batch_size=4, max_new_tokens=6, seed=SEED, models=models, run=str(root), **kw)


def test_select_draws_the_learned_and_harmed_items_in_the_evaluations_order(run_dir):
    _, _, uids = run_dir
    task = _setup(run_dir, select="opd").make_task()
    assert task.chosen["learned"] == uids[:4] and task.chosen["harmed"] == [uids[3]]
    assert [e.uid for e in _setup(run_dir, select="opd").examples()] == uids[:4]
    assert [e.uid for e in ProbeSetup(**{**vars(_setup(run_dir, select="opd")), "n": 2}).examples()] == uids[:2]
    assert len(_setup(run_dir).examples()) == 16  # without select: the setup's own draw


def test_a_probe_on_selected_items_records_the_selection(run_dir, tmp_path):
    from mechopd.probes.drift import DriftOptions, run_drift

    _, _, uids = run_dir
    run_drift(_setup(run_dir, select="opd"), tmp_path, DriftOptions(models=["opd"], greedy=True))
    settings = json.loads((tmp_path / "drift.json").read_text())["settings"]
    assert settings["select"] == {"model": "opd", "eval_n": EVAL_N, "learned": uids[:4], "harmed": [uids[3]]}
    assert settings["n"] == 4
    saved = [json.loads(line)["uid"] for line in (tmp_path / "drift_items.jsonl").read_text().splitlines()]
    assert saved == uids[:4]


def test_what_cannot_be_selected_is_refused(run_dir, tmp_path):
    with pytest.raises(ConfigError, match="name a trained model"):
        _setup(run_dir, select="base").make_task()
    with pytest.raises(ConfigError, match="not found"):
        _setup(run_dir, select="nca").make_task()
    with pytest.raises(ConfigError, match="held-out items; drop split=train"):
        _setup(run_dir, select="opd").make_task().examples("train", 4, SEED)
    root, models, _ = run_dir
    with pytest.raises(ConfigError, match="needs --run"):
        ProbeSetup(task="rules", seed=SEED, models=models, select="opd").make_task()
    empty = tmp_path / "run"
    (empty / "eval").mkdir(parents=True)
    for name in ("opd", "base"):
        src = json.loads((root / "eval" / "base.json").read_text())
        (empty / "eval" / f"{name}.json").write_text(json.dumps(src))  # opd = base: nothing learned or harmed
    with pytest.raises(ConfigError, match="learned no item"):
        ProbeSetup(task="rules", seed=SEED, models=models, run=str(empty), select="opd").make_task().examples(
            "test", 4, SEED
        )


def test_weightpatch_and_localization_evaluate_the_selected_items(run_dir, tmp_path):
    from mechopd.probes.localization import LocalizationOptions, run_localization
    from mechopd.probes.weightpatch import WeightpatchOptions, run_weightpatch

    _, _, uids = run_dir
    run_weightpatch(
        _setup(run_dir, select="opd"),
        tmp_path / "wp",
        WeightpatchOptions(models=["opd"], layers="all", modules="attn", draws=1, n_boot=0),
    )
    run_localization(_setup(run_dir, select="opd"), tmp_path / "loc", LocalizationOptions(model="opd", n_boot=0))
    for probe, out in (("weightpatch", tmp_path / "wp"), ("localization", tmp_path / "loc")):
        assert json.loads((out / f"{probe}.json").read_text())["settings"]["select"]["learned"] == uids[:4]
        saved = [json.loads(line)["uid"] for line in (out / f"{probe}_items.jsonl").read_text().splitlines()]
        assert saved == uids[:4], probe
