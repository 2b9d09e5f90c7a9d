"""The one training loop on a tiny rules organism: methods, metrics, resume, refusal, NaN guard."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from mechopd.config import TrainConfig
from mechopd.core.errors import TrainingError
from mechopd.train.trainer import train

BASE = dict(task="rules", batch_size=8, steps=3, lr=1e-3, max_new_tokens=8, seed=1, pool_size=64)


def _cfg(student, **kw):
    return TrainConfig(student=str(student), **{**BASE, **kw})


def _weights(d):
    return load_file(str(d / "model.safetensors"))


@pytest.mark.parametrize(
    "method,selector", [("opd", "full"), ("nca", "full"), ("opd", "ta_opd"), ("dual_opd", "full"), ("sym_kl", "random")]
)
def test_methods_run_and_log(tiny_rules_organism, tmp_path, method, selector):
    final = train(_cfg(tiny_rules_organism, method=method, selector=selector), tmp_path / "run", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert r["loss/opd"] >= 0 and r["tokens_per_s"] > 0 and 0 < r["kept_fraction"] <= 1
        assert torch.isfinite(torch.tensor(r["loss"]))
    if method == "nca":
        assert "loss/nca" in lines[0]
    if selector == "ta_opd":
        assert lines[0]["kept_fraction"] < 0.5
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(final)  # loadable HF checkpoint


def test_loss_falls_on_rules_organism(tiny_rules_organism, tmp_path):
    train(_cfg(tiny_rules_organism, steps=12, lr=3e-3, estimator="full"), tmp_path / "r", progress=False)
    kl = [json.loads(x)["kl/teacher_student"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3


def test_resume_equals_uninterrupted(tiny_rules_organism, tmp_path):
    full = train(_cfg(tiny_rules_organism, steps=4, save_every=2, method="nca"), tmp_path / "a", progress=False)
    train(_cfg(tiny_rules_organism, steps=2, save_every=2, method="nca"), tmp_path / "b", progress=False)
    resumed = train(
        _cfg(tiny_rules_organism, steps=4, save_every=2, method="nca"), tmp_path / "b", resume=True, progress=False
    )
    wa, wb = _weights(full), _weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_existing_run_is_refused_without_resume(tiny_rules_organism, tmp_path):
    train(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(TrainingError, match="--resume"):
        train(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before


def test_nan_loss_stops_and_names_step_and_term(tiny_rules_organism, tmp_path):
    from mechopd.train.trainer import Trainer

    trainer = Trainer(_cfg(tiny_rules_organism, save_every=1), tmp_path / "r", progress=False)
    with torch.no_grad():  # NaN teacher in memory (a NaN checkpoint is refused at load time, see below)
        trainer.teacher.model.norm.weight.fill_(float("nan"))
    with pytest.raises(TrainingError, match=r"loss term 'opd' became nan at step 1"):
        trainer.run()
    assert not (tmp_path / "r" / "checkpoints").exists() and not (tmp_path / "r" / "final").exists()


def test_nan_teacher_checkpoint_is_refused_at_load(tiny_rules_organism, tmp_path):
    from mechopd.core.errors import ModelError
    from mechopd.models import atomic_save, load_model, load_tokenizer

    bad = load_model(tiny_rules_organism)
    with torch.no_grad():
        bad.model.norm.weight.fill_(float("nan"))
    atomic_save(bad, load_tokenizer(tiny_rules_organism), tmp_path / "nan_teacher")
    with pytest.raises(ModelError, match=r"nan_teacher/model.safetensors: tensor 'model.norm.weight' holds 32 NaN"):
        train(_cfg(tiny_rules_organism, teacher=str(tmp_path / "nan_teacher")), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def _records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_anchor_schedule_beta_zero_equals_opd_and_ramps_with_a_selector(tiny_rules_organism, tmp_path):
    """nca_start >= steps: β_eff = 0 on every step, so NCA's update is OPD's; with a ramp the logged β_eff follows
    m(s) = min(1, (s − start + 1)/warmup) after start, and works with TA-OPD and nca_positions=selected."""
    opd = train(_cfg(tiny_rules_organism, steps=2), tmp_path / "opd", progress=False)
    late = train(_cfg(tiny_rules_organism, steps=2, method="nca", nca_start=2), tmp_path / "late", progress=False)
    wa, wb = _weights(opd), _weights(late)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=0, rtol=0)
    assert [r["beta_eff"] for r in _records(tmp_path / "late")] == [0.0, 0.0]
    train(
        _cfg(
            tiny_rules_organism,
            steps=4,
            method="nca",
            beta=0.5,
            nca_start=1,
            beta_warmup=2,
            selector="ta_opd",
            nca_positions="selected",
        ),
        tmp_path / "ramp",
        progress=False,
    )
    recs = _records(tmp_path / "ramp")
    assert [r["beta_eff"] for r in recs] == [0.0, 0.25, 0.5, 0.5]
    assert all(r["kept_fraction"] < 0.5 for r in recs)


def test_ta_opd_kept_fraction_is_the_true_fraction_of_response_tokens(tiny_rules_organism, tmp_path):
    import math

    train(_cfg(tiny_rules_organism, steps=2, selector="ta_opd", budget=0.1), tmp_path / "r", progress=False)
    for r in _records(tmp_path / "r"):
        n = r["response_tokens"]
        assert round(r["kept_fraction"] * n) == math.ceil(0.1 * n)  # exactly ⌈ρN⌉ (the paper's text) by default
    train(
        _cfg(tiny_rules_organism, steps=1, selector="ta_opd", budget=0.1, min_one_per_response=True),
        tmp_path / "m",
        progress=False,
    )
    r = _records(tmp_path / "m")[0]
    assert round(r["kept_fraction"] * r["response_tokens"]) >= r["samples"]  # the released code's ≥ 1 per response


def test_grad_stats_steps_log_the_stats_and_apply_the_same_update(tiny_rules_organism, tmp_path):
    plain = train(_cfg(tiny_rules_organism, steps=2, method="nca"), tmp_path / "a", progress=False)
    stats = train(_cfg(tiny_rules_organism, steps=2, method="nca", grad_stats_every=2), tmp_path / "b", progress=False)
    wa, wb = _weights(plain), _weights(stats)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=1e-5)  # Σ of per-term grads = the total's grad
    first, second = _records(tmp_path / "b")
    assert not any(k.startswith("grad/") for k in first)
    keys = {k for k in second if k.startswith("grad/")}
    assert {
        "grad/norm/opd",
        "grad/norm/nca",
        "grad/cos/opd__nca",
        "grad/dominance/opd",
        "grad/dominance/nca",
        "grad/cos_group/opd__nca/0.q_proj",
        "grad/cos_group/opd__nca/none.embed_tokens",
    } <= keys
    assert all(k.startswith(("grad/norm/", "grad/cos/", "grad/cos_group/opd__nca/", "grad/dominance/")) for k in keys)
    assert abs(second["grad/dominance/opd"] + second["grad/dominance/nca"] - 1) < 1e-9
    assert -1 <= second["grad/cos/opd__nca"] <= 1 and second["grad/norm/nca"] > 0


def test_anchor_gate_opens_from_the_logged_kl_and_resumes(tiny_rules_organism, tmp_path):
    """nca_gate: β_eff = 0 until the mean logged kl/teacher_student of the window reaches the level, then β; the
    opening is logged once, saved in training.json and in checkpoints (a resumed run equals an uninterrupted one)."""
    cfg = dict(steps=4, method="nca", beta=0.5, nca_gate=1e6, nca_gate_window=2, save_every=2)
    full = train(_cfg(tiny_rules_organism, **cfg), tmp_path / "a", progress=False)
    recs = _records(tmp_path / "a")
    assert [r["beta_eff"] for r in recs] == [0.0, 0.0, 0.5, 0.5]  # open after step 2 (a window of 2)
    assert [r.get("nca_gate/open_step") for r in recs] == [None, 2, None, None]
    assert recs[1]["nca_gate/kl_mean"] == pytest.approx(
        (recs[0]["kl/teacher_student"] + recs[1]["kl/teacher_student"]) / 2
    )
    assert json.loads((full / "training.json").read_text())["nca_gate"]["open_step"] == 2
    train(_cfg(tiny_rules_organism, **{**cfg, "steps": 2}), tmp_path / "b", progress=False)  # stops with the gate open
    resumed = train(_cfg(tiny_rules_organism, **cfg), tmp_path / "b", resume=True, progress=False)
    assert [r["beta_eff"] for r in _records(tmp_path / "b")] == [0.0, 0.0, 0.5, 0.5]
    wa, wb = _weights(full), _weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)


def test_anchor_gate_that_never_opens_warns_and_trains_as_opd(tiny_rules_organism, tmp_path, capsys):
    opd = train(_cfg(tiny_rules_organism, steps=2, nca_gate=1e-9), tmp_path / "opd", progress=False)
    assert "anchor gate" not in capsys.readouterr().out  # an OPD run has no anchor to gate
    shut = train(_cfg(tiny_rules_organism, steps=2, method="nca", nca_gate=1e-9), tmp_path / "shut", progress=False)
    assert "warning: the anchor gate never opened" in capsys.readouterr().out
    assert [r["beta_eff"] for r in _records(tmp_path / "shut")] == [0.0, 0.0]
    assert json.loads((shut / "training.json").read_text())["nca_gate"]["open_step"] is None
    wa, wb = _weights(opd), _weights(shut)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=0, rtol=0)
    assert all("nca_gate/kl_mean" not in r for r in _records(tmp_path / "opd"))


def _hf_greedy_replies(tr, model, items, with_context):
    """An independent decode: transformers' own greedy `generate`, one item at a time, cut after its stop id."""
    p, out = tr.parts, []
    for ex in items:
        ids = torch.tensor([tr._render(ex.prompt, ex.context if with_context else None)])
        gen = model.generate(
            ids,
            max_new_tokens=p.sampling.max_new_tokens,
            do_sample=False,
            eos_token_id=list(p.sampling.stop),
            pad_token_id=p.tokenizer.pad_token_id,
        )[0, ids.shape[1] :].tolist()
        out.append(next((gen[: k + 1] for k, t in enumerate(gen) if t in p.sampling.stop), gen))
    return out


def test_accuracy_gate_measures_training_items_against_generate_and_resumes(tiny_rules_organism, tmp_path):
    """nca_gate_acc: on every nca_gate_window-th step the student's greedy no-context replies on nca_gate_n
    training items (and once the teacher's with the context) are transformers' generate's, scored by the task;
    β = 0 until the accuracy reaches the share; the state resumes."""
    from mechopd.train.trainer import Trainer

    cfg = dict(steps=4, method="nca", beta=0.5, nca_gate_acc=1.0, nca_gate_window=2, nca_gate_n=6, save_every=2)
    tr = Trainer(_cfg(tiny_rules_organism, **cfg), tmp_path / "probe", progress=False)
    pool, tok = tr.parts.pool, tr.parts.tokenizer
    items = [pool[i * len(pool) // 6] for i in range(6)]
    assert not {ex.uid for ex in items} & {ex.uid for ex in tr.parts.task.examples("test", 50, 1)}
    student, teacher = tr.parts.models.student, tr.parts.models.teacher
    with torch.no_grad():  # the tiny organism ends every reply at once: noise makes the replies differ
        for j, m in enumerate((student, teacher)):
            g = torch.Generator().manual_seed(j)
            for w in m.parameters():
                w.add_(torch.randn(w.shape, generator=g) * w.std().nan_to_num(1.0))
            m.get_output_embeddings().weight[list(tr.parts.sampling.stop)] = 0.0  # no reply ends at once
    decoded: list[list[int]] = []
    real_decode = tok.decode
    tok.decode = lambda ids, **kw: decoded.append(list(ids)) or real_decode(ids, **kw)
    try:
        acc_x, acc_f = tr._gate_accuracy()
    finally:
        tok.decode = real_decode
    want = _hf_greedy_replies(tr, student, items, False) + _hf_greedy_replies(tr, teacher, items, True)
    assert decoded == want and len({tuple(r) for r in want}) > 2  # the same 12 replies, not all alike
    score = tr.parts.task.score
    hits = [score(ex, real_decode(r, skip_special_tokens=True)) for ex, r in zip(items + items, want)]
    assert (acc_x, acc_f) == (sum(hits[:6]) / 6, sum(hits[6:]) / 6)
    tr.close()
    with pytest.raises(Exception, match="exclusive"):
        _cfg(tiny_rules_organism, **cfg, nca_gate=0.1)
    full = train(_cfg(tiny_rules_organism, **cfg), tmp_path / "a", progress=False)
    recs = _records(tmp_path / "a")
    checks = [r["step"] for r in recs if "nca_gate/acc_x" in r]
    opened = json.loads((full / "training.json").read_text())["nca_gate"]["open_step"]
    assert checks == ([2, 4] if opened is None else [s for s in (2, 4) if s <= opened])
    assert 0 <= recs[1]["nca_gate/acc_teacher"] <= 1
    assert [r["beta_eff"] for r in recs] == [0.0 if opened is None or r["step"] <= opened else 0.5 for r in recs]
    train(_cfg(tiny_rules_organism, **{**cfg, "steps": 2}), tmp_path / "b", progress=False)
    resumed = train(_cfg(tiny_rules_organism, **cfg), tmp_path / "b", resume=True, progress=False)
    assert [r["beta_eff"] for r in _records(tmp_path / "b")] == [r["beta_eff"] for r in recs]
    wa, wb = _weights(full), _weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)


def test_anchor_gate_with_a_selector(tiny_rules_organism, tmp_path):
    """NCA + TA-OPD with the gate: the gate reads the all-token KL (not the selected tokens'), the anchor follows."""
    train(
        _cfg(
            tiny_rules_organism,
            steps=3,
            method="nca",
            selector="ta_opd",
            nca_gate=1e6,
            nca_gate_window=1,
            nca_positions="selected",
        ),
        tmp_path / "r",
        progress=False,
    )
    recs = _records(tmp_path / "r")
    assert [r["beta_eff"] for r in recs] == [0.0, 0.5, 0.5] and all(r["kept_fraction"] < 0.5 for r in recs)
    assert recs[0]["nca_gate/kl_mean"] == recs[0]["kl/teacher_student"]


def test_a_trainer_driven_step_by_step_releases_its_lock_on_close(tiny_rules_organism, tmp_path):
    """`train_step` called by the user (as bench/train_step.py does): the run dir stays locked until `close` (or the
    end of a ``with`` block); then the lock file is gone and the dir can be resumed."""
    from mechopd.core.runlock import LOCK_NAME, held
    from mechopd.train.trainer import Trainer

    run = tmp_path / "r"
    with Trainer(_cfg(tiny_rules_organism, save_every=1), run, progress=False) as trainer:
        trainer.train_step()
        assert held(run) and (run / LOCK_NAME).exists()
    assert not held(run) and not (run / LOCK_NAME).exists()
    Trainer(_cfg(tiny_rules_organism, save_every=1), run, resume=True, progress=False).close()
    assert not held(run)


def test_a_trainer_never_closed_exits_quietly(tiny_rules_organism, tmp_path):
    """A script that drops a trainer without `close` exits 0 with no 'Exception ignored' from the lock's finalizer
    (interpreter shutdown clears module globals before the generator holding the lock is finalized)."""
    import subprocess
    import sys

    code = (
        "from mechopd.config import TrainConfig\nfrom mechopd.train.trainer import Trainer\n"
        f"t = Trainer(TrainConfig(student={str(tiny_rules_organism)!r}, task='rules', batch_size=2, steps=1, "
        f"max_new_tokens=4, pool_size=8), {str(tmp_path / 'r')!r}, progress=False)\nt.train_step()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
