"""`pipeline.reuse`: what a rerun of a study may reuse of the run already in ``--out``."""

from __future__ import annotations

from mechopd.pipeline.reuse import Stale, config_fields_differ, stale_after


def _config(**kwargs):
    return {"task": "facts", "method": "opd", "lr": 1e-4, "chat_template_kwargs": kwargs}


def test_a_date_pinned_by_training_is_not_a_changed_config():
    """Training records the date it pinned (``date_string``); a rerun of the study that sets none is the same run."""
    recorded = _config(date_string="06 Dec 2026")
    assert config_fields_differ(recorded, _config()) == []
    assert config_fields_differ(recorded, _config(date_string="07 Dec 2026"))  # a date the study sets still counts


def test_a_flag_the_render_read_as_a_boolean_is_not_a_changed_config():
    """``enable_thinking: "false"`` is recorded as ``False`` (the render's reading); the rerun compares the same."""
    assert config_fields_differ(_config(enable_thinking=False), _config(enable_thinking="false")) == []
    assert config_fields_differ(_config(enable_thinking=True), _config(enable_thinking="false"))


def test_a_changed_evaluation_reruns_the_probes_that_select_from_it(tmp_path):
    """``select: opd`` probes pick their items from the evaluation: a new evaluation reruns them, not the others."""
    old = {
        "eval": {"n": 32},
        "probe_n": 32,
        "probes": {"weightpatch": {"select": "opd"}, "localization": {"select": "opd"}, "similarity": {}},
    }
    stale = stale_after(tmp_path, old, {**old, "eval": {"n": 16}})
    assert stale is not None and stale.evaluations
    assert stale.probes == ("localization", "weightpatch")
    assert stale_after(tmp_path, old, {**old, "probe_n": 32}) == Stale()
