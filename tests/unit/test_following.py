"""Context following without models: other contexts of the tasks, the summary against a slow reference, deafness,
the compare table, the follow term's draw, and the teachability limits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mechopd.core.errors import ConfigError, DataError
from mechopd.evaluation.following import apply_retention, deaf_verdict, summarize_following
from mechopd.evaluation.removability import compare_table, summarize
from mechopd.probes.teachability_limits import degeneracy, informative_checkpoint
from mechopd.tasks.base import get_task
from mechopd.tasks.rules import apply_rule


def test_rules_other_contexts_are_the_family_minus_the_distilled_rule_with_their_outputs():
    task = get_task("rules", rule="shift:2")
    for ex in task.examples("test", 20, 0):
        others = task.other_contexts(ex)
        labels = [o.label for o in others]
        assert "shift:2" not in labels and set(labels) <= set(task.family)
        for o in others:
            assert o.answer.split() == [str(d) for d in apply_rule(o.label, ex.meta["digits"])]
            assert task.score(o.example(ex), o.answer) and not task.score(ex, o.answer)
    # a rule with the same output on an item is left out (shift:11 == shift:1 on every digit list)
    t2 = get_task("rules", family=["shift:1", "shift:11", "reverse"])
    ex = t2.examples("test", 1, 0)[0]
    assert [o.label for o in t2.other_contexts(ex)] == ["reverse"]


def test_games_define_no_other_contexts():
    task = get_task("frozenlake")
    assert task.other_contexts(task.examples("test", 1, 0)[0]) == []


def _jsonl(tmp_path, rows):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    return p


def test_jsonl_other_context_per_item_overrides_the_file_level_one(tmp_path):
    rows = [
        {"question": f"q{i}?", "options": ["red", "blue"], "answer": "A", "other_answer": "blue"} for i in range(12)
    ]
    rows.append({"prompt": "p?", "answer": "x", "other_context": "own", "other_answer": "y"})
    task = get_task(
        "jsonl", path=str(_jsonl(tmp_path, rows)), context="ctx", other_context="shared one", test_fraction=0.5
    )
    every = task._splits["test"] + task._splits["train"]
    got = {e.prompt.split("\n")[0]: task.other_contexts(e) for e in every}
    assert got["p?"][0].label == "per-item" and got["p?"][0].context == "own" and got["p?"][0].answer == "y"
    mc = got["q0?"][0]
    assert (mc.label, mc.context, mc.answer) == ("shared", "shared one", "B")  # option text -> its letter
    ex = next(e for e in every if e.prompt.startswith("q0?"))
    assert task.score(mc.example(ex), "<answer>B</answer>") and not task.score(ex, "<answer>B</answer>")


@pytest.mark.parametrize(
    "row,opts,needle",
    [
        ({"prompt": "p", "answer": "x", "other_answer": "y"}, {}, "has no other context"),
        ({"prompt": "p", "answer": "x", "other_context": "c"}, {}, "has no 'other_answer'"),
        (
            {"question": "q", "options": ["a", "b"], "answer": "A", "other_answer": "zzz"},
            {"other_context": "o"},
            "names no option",
        ),
        ({"prompt": "p", "answer": "x", "other_answer": 3}, {"other_context": "o"}, "non-empty string"),
    ],
)
def test_jsonl_bad_other_fields_name_line_and_fix(tmp_path, row, opts, needle):
    with pytest.raises(DataError, match=needle):
        get_task("jsonl", path=str(_jsonl(tmp_path, [row])), context="ctx", **opts)


def _records(follow: np.ndarray, stick: np.ndarray, labels: list[str]) -> list[dict]:
    out = []
    for u in range(follow.shape[0]):
        for k, lab in enumerate(labels):
            if not math.isnan(follow[u, k]):
                out.append(
                    {
                        "uid": f"u{u}",
                        "sample": 0,
                        "label": lab,
                        "follow": bool(follow[u, k]),
                        "stick": bool(stick[u, k]),
                    }
                )
    return out


def test_follow_other_is_the_mean_over_contexts_and_its_bootstrap_matches_a_slow_reference():
    rng = np.random.default_rng(0)
    follow = (rng.random((30, 3)) < [0.9, 0.5, 0.1]).astype(float)
    follow[:10, 2] = np.nan  # the third context exists on 20 items only
    stick = (rng.random((30, 3)) < 0.2).astype(float)
    summary, rows = summarize_following(_records(follow, stick, ["a", "b", "c"]), n_boot=200, seed=4)
    per = [np.nanmean(follow[:, k]) for k in range(3)]
    assert summary["follow_other"]["value"] == pytest.approx(np.mean(per))
    assert [r["n"] for r in rows] == [30, 30, 20] and rows[2]["follow"] == pytest.approx(per[2])
    from mechopd.evaluation.removability import resample_blocks

    ref = []
    for idx in resample_blocks(30, 200, 4):
        for row in idx:
            f = follow[row]
            ref.append(np.mean([np.nanmean(f[:, k]) for k in range(3) if np.isfinite(f[:, k]).any()]))
    lo, hi = np.quantile(ref, [0.025, 0.975])
    assert summary["follow_other"]["low"] == pytest.approx(lo) and summary["follow_other"]["high"] == pytest.approx(hi)


def _report(acc_x, acc_xc, follow):
    recs = [{"correct_x": i < acc_x, "correct_xc": i < acc_xc, "len_x": 3, "len_xc": 3} for i in range(10)]
    s = summarize(recs, n_boot=20)
    s["follow_other"] = {"value": follow, "low": None, "high": None}
    s["stick"] = {"value": 0.0, "low": None, "high": None}
    return {"summary": s}


def test_deafness_at_half_the_base_and_a_deaf_regime_c_never_reads_plain_views_agree():
    assert deaf_verdict(0.5, 1.0) == (0.5, True) and deaf_verdict(0.51, 1.0)[1] is False
    assert deaf_verdict(0.0, 0.0) == (None, False) and deaf_verdict(None, 1.0) == (None, None)
    reps = {"base": _report(0, 10, 0.96), "nca": _report(10, 10, 0.01), "ok": _report(10, 10, 0.9)}
    apply_retention(reps)
    nca, ok = reps["nca"]["summary"], reps["ok"]["summary"]
    assert nca["regime"] == "C" and nca["context_deaf"] and nca["regime_reason"].startswith("context-deaf")
    assert "because other contexts are ignored" in nca["regime_reason"]
    assert ok["context_deaf"] is False and ok["regime_reason"].startswith("C (views agree)")
    assert ok["retention"] == pytest.approx(0.9 / 0.96)
    md, csv_text = compare_table({k: r["summary"] for k, r in reps.items()})
    assert "| C, context-deaf |" in md and "follow_other" in md.splitlines()[0]
    assert csv_text.splitlines()[2].split(",")[-5] == "true"  # nca's context_deaf column


def test_follow_config_refuses_bad_values():
    from mechopd.config import TrainConfig

    with pytest.raises(ConfigError, match="follow_weight"):
        TrainConfig(follow_weight=-1.0)
    with pytest.raises(ConfigError, match="follow_contexts"):
        TrainConfig(follow_contexts=[])


def test_follow_term_checks_and_draws_only_allowed_contexts():
    from mechopd.objectives.follow import check_follow_contexts, draw_other

    task = get_task("rules")
    pool = task.examples("train", 10, 0)
    check_follow_contexts(task, pool, ["shift:2"])
    with pytest.raises(ConfigError, match="'shift:9' is not an other context"):
        check_follow_contexts(task, pool, ["shift:9"])
    game = get_task("frozenlake")
    with pytest.raises(ConfigError, match="defines no other contexts"):
        check_follow_contexts(game, game.examples("train", 2, 0), None)
    drawn = {draw_other(task, pool[0], ["shift:2", "reverse"], s).label for s in range(40)}
    assert drawn == {"shift:2", "reverse"}


def _table(C, kl0, kl1):
    C, kl0, kl1 = (np.asarray(v, float) for v in (C, kl0, kl1))
    return {"C_exact": C, "kl0": kl0, "kl1": kl1, "gain_abs": kl0 - kl1}


def test_teachability_degeneracy_names_each_reason():
    rng = np.random.default_rng(1)
    kl0 = rng.random(500) + 0.1
    flat = degeneracy(_table(np.full(500, 0.9999), kl0, kl0 * rng.random(500)))
    assert not flat["measurable"] and "C carries no information" in flat["reasons"][0]
    few = np.where(np.arange(500) < 10, 0.3, 0.9999)  # 10 tokens of 500 below 0.5 (2 %): the default run's case (#44)
    assert "C carries no information" in degeneracy(_table(few, kl0, kl0 * rng.random(500)))["reasons"][0]
    enough = np.where(np.arange(500) < 40, 0.3, 0.9999)  # 8 %: a third of a quartile can move
    assert degeneracy(_table(enough, kl0, kl0 * rng.random(500)))["measurable"]
    conv = degeneracy(_table(rng.random(500), kl0, kl0 * 1e-3))
    assert not conv["measurable"] and "converged" in conv["reasons"][0]
    ok = degeneracy(_table(rng.random(500), kl0, kl0 * rng.random(500)))
    assert ok["measurable"] and ok["reasons"] == [] and 0 < ok["corr_gain_kl0"] < 0.999


def test_informative_checkpoint_is_the_earliest_step_that_moved_but_did_not_converge(tmp_path):
    kl = {1: 8.0, 25: 4.0, 50: 0.5, 75: 0.05}
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "kl/teacher_student": v}) for s, v in kl.items())
    )
    for s in (25, 50, 75):
        (tmp_path / "checkpoints" / f"step-{s}").mkdir(parents=True)
    path, why = informative_checkpoint(tmp_path)
    assert path.name == "step-25" and "0.500" in why  # 4/8 in [0.1, 0.9]; step-50 (0.0625) would not be
    (tmp_path / "checkpoints" / "step-25").rmdir()
    path, why = informative_checkpoint(tmp_path)
    assert path.name == "final" and "degeneracy" in why


def test_context_following_figure_draws_the_saved_rates(tmp_path):
    from mechopd.plots.following import figure_context_following
    from tests.unit.plotting_run import make_run

    run = make_run(tmp_path)
    fig = figure_context_following(run)
    left, right = fig.axes[:2]
    for k, name in enumerate(["base", "opd", "nca", "ta_opd"]):
        rep = json.loads((run / "eval" / f"{name}.json").read_text())
        heights = [p.get_height() for p in left.containers[k]]
        assert heights == pytest.approx([100 * r["follow"] for r in rep["other_contexts"]])
    assert [t.get_text() for t in right.get_xticklabels()] == ["follow_other", "stick"]


def _following(tmp_path, *per_seed):
    from mechopd.report.claims import evaluate_claims
    from tests.unit.claim_runs import seed_runs

    return {c.key: c for c in evaluate_claims(seed_runs(tmp_path, *per_seed))}


def test_following_rows_read_only_the_held_out_contexts(tmp_path):
    from mechopd.report.verdicts import FAILS, HOLDS

    # following the trained contexts (0.95) but not the held-out ones (0.1): the follow term does not generalise
    got = _following(tmp_path / "a", {"follow": {"nca_follow": (0.95, 0.1), "opd": (0.1, 0.9)}})
    assert got["follow_term"].verdict == FAILS and "repeat:2, reverse" in got["follow_term"].criterion
    assert got["keeps_following"].verdict == HOLDS  # OPD follows the held-out contexts: the shifts are not read
    assert "trained on shift:2, shift:3" in got["follow_term"].criterion


@pytest.mark.parametrize(
    ("stick", "compose", "word"), [(0.6, 0.1, "ignores"), (0.1, 0.6, "mixes"), (0.1, 0.1, "breaks")]
)
def test_a_deaf_model_gets_the_word_its_replies_support(tmp_path, stick, compose, word):
    from tests.unit.claim_runs import make_run, spec_with

    spec = spec_with(follow={"opd": (0.1, 0.1)}, stick={"opd": stick}, compose={"opd": compose})
    rep = json.loads((make_run(tmp_path, spec) / "eval" / "opd.json").read_text())
    assert rep["summary"]["context_deaf"] and rep["summary"]["following"] == word
    assert f"context-deaf ({word} other contexts)" in rep["summary"]["regime_reason"]
    assert rep["summary"]["compose"]["value"] == pytest.approx(compose, abs=0.01)


def test_retention_applied_twice_gives_the_same_regime_line():
    reps = {"base": _report(0, 10, 0.96), "nca": _report(10, 10, 0.01)}
    apply_retention(reps)
    once = reps["nca"]["summary"]["regime_reason"]
    apply_retention(reps)  # the demo reapplies it to reused reports
    assert reps["nca"]["summary"]["regime_reason"] == once and once.count("context-deaf") == 1
