"""The shipped smollm2-handbooks study (issue 52): replicated over handbooks, never on validation facts, the anchor
gated on OPD's progress beside an early-fixed deafness arm, probes on every held-out item (the model is not loaded)."""

from __future__ import annotations

from mechopd.pipeline import named
from mechopd.pipeline.demo import fast_values
from mechopd.tasks import get_task

NAME = "smollm2-handbooks"


def test_the_study_draws_a_handbook_per_seed_from_the_evaluation_part():
    spec = named.load_named(NAME)
    assert spec.task == "facts" and spec.task_options["part"] == "evaluation"
    assert spec.task_options["answer_format"] == "strict"
    task = get_task(spec.task, **spec.task_options)
    assert max(spec.seeds) < task.blocks  # first round only: every seed its own facts, disjoint handbooks
    held = [e.uid for s in spec.seeds for e in task.examples("test", spec.eval_n, s)]
    assert len(held) == len(set(held)) == len(spec.seeds) * task.max_items("test")  # every held-out item, once
    assert spec.train["pool_size"] == task.max_items("train")


def test_the_anchor_waits_for_opds_answers_and_the_deafness_arm_starts_it_early_beside_its_control():
    spec = named.load_named(NAME)
    assert spec.runs["nca"]["method"] == "nca" and 0 < spec.runs["nca"]["nca_gate_acc"] <= 1
    assert "nca_start" not in spec.runs["nca"] and "nca_gate" not in spec.runs["nca"]
    assert spec.runs["nca_early"]["method"] == "nca" and spec.runs["nca_early"]["nca_start"] > 0
    assert "nca_gate" not in spec.runs["nca_early"] and "nca_gate_acc" not in spec.runs["nca_early"]
    assert spec.runs["anchor_only"]["method"] == "anchor_only"  # the anchor alone: does it make the view deaf?
    assert set(spec.probes["drift"]["models"]) == {"opd", "nca", "nca_early", "anchor_only"}  # which view moved


def test_probes_read_at_least_32_items_per_seed_and_fast_is_a_smoke_run():
    spec = named.load_named(NAME)
    assert spec.probe_n >= 32 and spec.eval["other_contexts"] is True
    assert {"similarity", "lens", "deltas", "weightpatch", "localization"} <= set(spec.probes)
    doc = named.shrink(spec, fast=True)
    values = {**fast_values(), **named.study_fast_values(NAME)}
    assert doc["seeds"] == spec.seeds[:1] and doc["train"]["steps"] == values["steps"] < spec.train["steps"]
    assert doc["runs"]["nca"]["nca_gate_window"] == 1  # the smoke run's gate checks every step, on eval_n items
    assert doc["runs"]["nca"]["nca_gate_n"] == values["eval_n"]


def test_interventions_select_the_items_opd_learned_or_was_harmed_on_except_in_the_smoke_run():
    spec = named.load_named(NAME)
    assert spec.probes["weightpatch"]["select"] == spec.probes["localization"]["select"] == "opd"
    assert "select" not in spec.probes["similarity"]  # the similarity, lens and deltas probes: every held-out item
    fast = named.shrink(spec, fast=True)
    assert not any("select" in opts for opts in fast["probes"].values())  # a 2-step model learned nothing
    assert fast["probes"]["weightpatch"]["layers"] == "all" != spec.probes["weightpatch"]["layers"]  # 5 patched models
    assert fast["probes"]["weightpatch"]["modules"] == spec.probes["weightpatch"]["modules"]  # every group exercised
    assert named.shrink(spec, fast=False)["probes"]["weightpatch"]["select"] == "opd"
