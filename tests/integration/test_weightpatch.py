"""Weight patching on a tiny rules organism: a 'trained' copy whose attention alone moved, reverted group by group.

Properties: reverting every attention projection gives exactly the base's evaluation (the copy differs from the base
only there); reverting the MLP gives exactly the unpatched copy's; the patch is restored bitwise; the matched control
has q+k's parameter count; the items file and the summary are on disk; an independent greedy decoder
(transformers' ``generate``) reproduces the per-item outcomes of a patched row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model, load_tokenizer
from mechopd.probes.setup import ProbeSetup
from mechopd.probes.weightpatch_plan import Donor, patched, plan_rows


def _perturb_attention(src: Path, dst: Path, seed: int = 3, scale: float = 0.5) -> str:
    model = load_model(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "self_attn" in name and name.endswith("proj.weight"):
                p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    model.save_pretrained(dst)
    load_tokenizer(src).save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("wp")
    return {"base": str(tiny_rules_organism), "opd": _perturb_attention(tiny_rules_organism, root / "opd")}


@pytest.fixture(scope="module")
def result(models, tmp_path_factory) -> Path:
    from mechopd.probes.weightpatch import WeightpatchOptions, run_weightpatch

    out = tmp_path_factory.mktemp("wp_out")
    setup = ProbeSetup(task="rules", n=12, batch_size=4, max_new_tokens=6, seed=1, models=models)
    run_weightpatch(
        setup,
        out,
        WeightpatchOptions(models=["opd"], layers="0,all", modules="q_proj,qk,attn,mlp,ctrl_qk", draws=2, n_boot=50),
        progress=False,
    )
    return out


def _outcomes(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "weightpatch_items.jsonl").read_text().splitlines()]


def test_reverting_the_moved_weights_gives_the_base(result, models):
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.tasks.base import get_task

    base = evaluate_model(
        load_model(models["base"]),
        load_tokenizer(models["base"]),
        get_task("rules"),
        EvalConfig(n=12, seed=1, n_boot=0, max_new_tokens=6),
    )
    items = _outcomes(result)
    got = [rec["outcomes"]["opd"] for rec in items]
    base_pairs = [[r["correct_x"], r["correct_xc"]] for r in base["records"]]
    assert [g["all/attn"] for g in got] == base_pairs
    assert [g["all/mlp"] for g in got] == [g["none/none"] for g in got]
    assert [r["uid"] for r in items] == [r["uid"] for r in base["records"]]
    rows = read_csv(result / "weightpatch.csv")
    none = next(r for r in rows if r["layer"] == "none")
    mlp = next(r for r in rows if (r["layer"], r["module"]) == ("all", "mlp"))
    assert float(mlp["d_acc_x"]) == 0.0 and float(none["d_acc_x"]) == 0.0
    assert float(next(r for r in rows if (r["layer"], r["module"]) == ("all", "attn"))["acc_x"]) == pytest.approx(
        base["summary"]["acc_x"]["value"]
    )


def test_patch_restores_bitwise_and_control_matches_count(models):
    model = load_model(models["opd"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = plan_rows(model, ["0", "all"], ["qk", "ctrl_qk", "norms"], 2, seed=0)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    donor = Donor(models["base"])
    for row in rows[1:]:
        with patched(model, donor, row):
            changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
            assert set(changed) <= {t.name for t in row.targets}
            assert bool(changed) == (row.module != "norms")  # only the attention projections moved
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    for layer in ("0", "all"):
        qk = next(r for r in rows if (r.layer, r.module) == (layer, "qk")).n_params(shapes)
        row_len = model.config.hidden_size
        for c in (r for r in rows if (r.layer, r.module) == (layer, "ctrl_qk")):
            assert qk <= c.n_params(shapes) < qk + 4 * row_len  # rows are at most 2 x hidden long (down_proj)
            assert not any(t.name.endswith(("q_proj.weight", "k_proj.weight")) for t in c.targets)


def test_an_independent_greedy_decoder_agrees(result, models):
    """transformers' generate (greedy) on the saved prompt ids, the attention reverted by load_state_dict."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from mechopd.tasks.base import get_task

    task = get_task("rules")
    tok = load_tokenizer(models["opd"])
    model = AutoModelForCausalLM.from_pretrained(models["opd"]).eval()
    base = load_file(str(Path(models["base"]) / "model.safetensors"))
    model.load_state_dict({k: v for k, v in base.items() if "self_attn" in k and "proj" in k}, strict=False)
    examples = {e.uid: e for e in task.examples("test", 12, 1)}
    for rec in _outcomes(result):
        got = []
        for view in ("prompt_ids_x", "prompt_ids_c"):
            ids = torch.tensor([rec[view]])
            with torch.no_grad():
                gen = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=6,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                )
            got.append(
                bool(task.score(examples[rec["uid"]], tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)))
            )
        assert got == rec["outcomes"]["opd"]["all/attn"], rec["uid"]


def test_summary_and_figure(result, tmp_path):
    from mechopd.plots.interventions import plot_weightpatch
    from mechopd.probes.registry import probe_result

    s = probe_result("weightpatch", result)
    qk = s.qk_control("opd")
    assert qk["qk"]["n_params"] > 0 and qk["ctrl_qk"]["draws"] == 2
    assert s.lines() and "Weight patching" in s.lines()[0]
    run = tmp_path / "run"
    (run / "probes").mkdir(parents=True)
    for f in result.iterdir():
        (run / "probes" / f.name).write_bytes(f.read_bytes())
    assert plot_weightpatch(run, run / "figures")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--modules", "qk,foo"], "--modules"),
        (["--layers", "0,x"], "--layers"),
        (["--control-draws", "0"], "draws"),
        (["--donor", "nope"], "nope"),
    ],
)
def test_bad_flags_are_one_error_line(models, tmp_path, capsys, flags, words):
    from mechopd.cli import main

    code = main(
        [
            "probe",
            "weightpatch",
            "--task",
            "rules",
            "--n",
            "2",
            "--models",
            f"opd={models['opd']}",
            "--out",
            str(tmp_path / "p"),
            *flags,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and words in err[0]
    assert not (tmp_path / "p" / "weightpatch.csv").exists()
