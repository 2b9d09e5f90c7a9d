"""LoRA students and teacher modes end to end on the zoo's Llama-3 fixture (byte-level BPE, date-header template).

The acceptance path: ``mechopd train --method nca --set lora_rank=8`` on a tiny Llama trains, logs a trainable share
under 10 %, and writes a final/ that ``mechopd eval`` and ``mechopd probe deltas`` open (the latter reading ΔW from
the adapter). The zoo's students are hidden-32: their embeddings are so small that rank 8 on all seven projections is
17 % of the parameters, so this file builds the same family at hidden 128 (the share then is 8 %)."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch

from mechopd.models import load_model, load_tokenizer, lora
from mechopd.organisms.recipes import load_train_config
from mechopd.testing.zoo import FAMILY, tiny_model
from mechopd.train.trainer import Trainer

from .helpers import cli, jsonl_sets, render_sets

TRAIN = [
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--lr",
    "1e-3",
    "--no-progress",
    "--set",
    "max_new_tokens=6",
    "--set",
    "pool_size=8",
]


@pytest.fixture(scope="module")
def wide_llama(zoo, tmp_path_factory) -> Path:
    """The zoo's Llama-3 tokenizer on a hidden-128 Llama (2 layers, vocabulary as the zoo's student)."""
    out = tmp_path_factory.mktemp("wide-llama")
    tok = load_tokenizer(zoo.student("llama"))
    vocab = load_model(zoo.student("llama")).config.vocab_size
    model = tiny_model(FAMILY["llama"], tok, vocab, seed=0, hidden=128)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _sets(zoo, *extra: str) -> list[str]:
    return [x for s in [*render_sets("llama"), *extra] for x in ("--set", s)] + jsonl_sets(zoo)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lora_run(zoo, wide_llama, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lora-run") / "nca-lora"
    cli(
        "train",
        "--task",
        "jsonl",
        "--method",
        "nca",
        "--student",
        wide_llama,
        *TRAIN,
        *_sets(zoo, "lora_rank=8"),
        "--out",
        run,
    )
    return run


def test_nca_with_lora_rank_8_trains_and_its_checkpoint_opens_in_eval_and_deltas(lora_run, tmp_path):
    run = lora_run
    recs = _metrics(run)
    assert [r["step"] for r in recs] == [1, 2] and all(0 < r["trainable_share"] < 0.10 for r in recs)
    assert all(torch.isfinite(torch.tensor(r["loss/nca"])) for r in recs)
    adapter = lora.adapter_dir(run / "final")
    assert adapter is not None and json.loads((adapter / lora.ADAPTER_CONFIG).read_text())["r"] == 8
    cli("eval", "--run", run, "--n", "2", "--out", tmp_path / "eval.json")
    assert json.loads((tmp_path / "eval.json").read_text())["summary"]["n"] == 2
    cli("probe", "deltas", "--run", run, "--out", tmp_path / "probes")
    settings = json.loads((tmp_path / "probes" / "deltas_summary.json").read_text())["settings"]
    assert settings["adapters"]["nca"]["path"] == str(adapter.resolve()) and settings["adapters"]["nca"]["r"] == 8
    assert (
        settings["adapters"]["nca"]["sha256"]
        == hashlib.sha256((adapter / lora.ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    )
    rows = {
        r["site"]: float(r["value"])
        for r in csv.DictReader(open(tmp_path / "probes" / "deltas.csv"))
        if r["metric"] == "delta_norm" and r["model"] == "nca"
    }
    deltas = lora.AdapterDeltas(adapter)
    for name in deltas.pairs:  # ‖ΔW‖ of every adapted projection is the adapter's (α/r)‖B A‖, and it moved
        site = name[len("model.") : -len(".weight")]
        assert rows[site] == pytest.approx(float(deltas.delta(name).norm()), rel=1e-9) and rows[site] > 0
    assert rows["embed"] == 0 and rows["layers.0.input_layernorm"] == 0  # nothing else trained


def _trainer(zoo, tmp_path: Path, name: str, *extra: str) -> Trainer:
    from mechopd.core.config_parse import parse_overrides

    sets = _sets(zoo, *extra)[1::2]  # the KEY=VALUE of every --set
    cfg = load_train_config(
        None,
        {
            **parse_overrides(sets),
            "task": "jsonl",
            "method": "nca",
            "steps": 2,
            "student": str(zoo.student("llama")),
            "batch_size": 2,
            "lr": 1e-2,
            "max_new_tokens": 6,
            "pool_size": 8,
        },
    )
    return Trainer(cfg, tmp_path / name, progress=False)


@pytest.mark.parametrize("extra", [(), ("lora_rank=4",)], ids=["full", "lora"])
def test_ema_teacher_follows_the_student_by_its_decay(zoo, tmp_path, extra):
    tr = _trainer(zoo, tmp_path, "ema", "teacher_mode=ema", "ema_decay=0.75", *extra)
    assert tr.teacher is not tr.student and tr.teacher_store is None  # a moving teacher's prefix is not cached
    before = {n: t.clone() for n, t, _ in tr.models.ema}
    assert all(torch.equal(t, s) for _, t, s in tr.models.ema)  # starts as the initial student
    tr.train_step()
    for n, t, s in tr.models.ema:
        torch.testing.assert_close(t, 0.75 * before[n] + 0.25 * s, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(t, before[n]) for n, t, _ in tr.models.ema)
    if extra:  # the averaged tensors are the adapter's only; the base stays shared with the student
        assert all(".lora_" in n for n in before)
    tr.run()
    assert (tmp_path / "ema" / "final" / "config.json").is_file()


def test_live_teacher_is_the_student_and_lora_frozen_teacher_is_its_base(zoo, tmp_path):
    live = _trainer(zoo, tmp_path, "live", "teacher_mode=live", "lora_rank=4")
    frozen = _trainer(zoo, tmp_path, "frozen", "lora_rank=4")
    assert live.teacher is live.student and live.teacher_store is None and frozen.teacher_store is not None
    first = live.train_step(), frozen.train_step()  # step 1: the live teacher IS the initial student (B = 0)
    for key in ("loss", "kl/teacher_student"):
        assert first[0][key] == pytest.approx(first[1][key], rel=1e-6)
    base = load_model(zoo.student("llama"))
    t_params = dict(frozen.teacher.named_parameters())
    for n, p in base.named_parameters():
        assert torch.equal(t_params[n], p), n  # the adapter moved, the teacher (W0) did not
    assert any(float(p.detach().abs().max()) > 0 for n, p in frozen.student.named_parameters() if ".lora_B." in n)


def test_lora_final_opens_in_transformer_lens_and_nnsight(lora_run):
    from mechopd.probes.interop import to_nnsight, to_transformer_lens

    final = lora_run / "final"
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        want = load_model(final)(input_ids=ids).logits
        tl = to_transformer_lens(final)(ids)
        lm = to_nnsight(final)
        with lm.trace(ids):
            got = lm.lm_head.output.save()
    torch.testing.assert_close(tl, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
