"""The lens's "tokens the context promotes most" are ranked by the probability mass the context moves to them (#54):
a token neither view makes likely cannot win by a large log-ratio of two tiny probabilities."""

from __future__ import annotations

import math

import torch

from mechopd.probes.lens import LensAccumulator


def test_a_rare_token_with_a_large_log_ratio_does_not_outrank_a_likely_one():
    common, rare = 0, 3
    p_x = torch.tensor([0.50, 0.30, 0.20 - 1e-9, 1e-9])
    p_c = torch.tensor([0.70, 0.20, 0.10 - 1e-6, 1e-6])  # rare: log-ratio 6.9; common: 0.34, but 0.2 of the mass
    lp_x, lp_c = (p.log().view(1, 1, 4).expand(1, 2, 4).contiguous() for p in (p_x, p_c))
    acc = LensAccumulator(None, ["final_norm"], 1.0, detail=0)  # type: ignore[arg-type]  (no forward here)
    acc._accumulate("final_norm", lp_x, lp_c, torch.ones(1, 2, dtype=torch.bool), [])
    promoted = acc.result("opd", 1).promoted["final_norm"]
    assert promoted[0][0] == common and math.isclose(promoted[0][1], 0.2, rel_tol=1e-6)
    assert [i for i, _ in promoted].index(rare) > 0  # second at best: it moved 1e-6 of the mass
    assert float(lp_c[0, 0, rare] - lp_x[0, 0, rare]) > float(lp_c[0, 0, common] - lp_x[0, 0, common])


def test_the_lens_shows_its_progress_over_the_batches(tiny_rules_organism, capsys):
    """Minutes per model on a real model: a bar per model (#54); off by default for a library caller."""
    from mechopd.models import load_model, load_tokenizer
    from mechopd.probes.items import make_batches
    from mechopd.probes.lens import lens
    from mechopd.tasks.base import get_task

    model, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    items = make_batches(tok, get_task("rules"), n=2, seed=0, batch_size=1, responses_from=model, greedy=True)
    lens(model, items, temperature=1.0, label="opd", progress=True)
    assert "lens opd" in capsys.readouterr().err
    lens(model, items, temperature=1.0, label="opd")
    assert "lens opd" not in capsys.readouterr().err
