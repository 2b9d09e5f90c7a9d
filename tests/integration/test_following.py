"""Context following end to end: `mechopd eval --other-contexts` against an independent greedy decoder.

Two small organisms pretrained in the test (seconds): a base that follows every rule of its family, and a
"deaf" one pretrained on one rule only (it answers that rule whatever the context says). The reference decoder here
is plain ``model(ids).logits[:, -1].argmax()`` over the chat template's ids (no KV cache, no mechopd sampler, no
views.py), scored against `apply_rule` for each other rule.
"""

from __future__ import annotations

import json

import pytest
import torch

from mechopd.cli import main
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.rules import apply_rule, rule_text

FAMILY = ["shift:1", "shift:2", "reverse"]
SIZE = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    batch_size=32,
    corpus_size=4000,
    lr=3e-3,
)
N = 24


@pytest.fixture(scope="module")
def organisms(tmp_path_factory):
    from mechopd.organisms.pretrain import OrganismConfig, pretrain

    root = tmp_path_factory.mktemp("following")
    base = pretrain(
        OrganismConfig(task="rules", steps=400, task_options={"family": FAMILY, "max_len": 4}, **SIZE),
        root / "base",
        progress=False,
    )
    deaf = pretrain(
        OrganismConfig(task="rules", steps=200, task_options={"family": ["shift:1"], "max_len": 4}, **SIZE),
        root / "deaf",
        progress=False,
    )
    return {"base": base, "deaf": deaf}


def _reference_follow(path, items) -> float:
    """Mean over the other rules of the share of items whose plain greedy reply is that rule's output."""
    model, tok = load_model(path).eval(), load_tokenizer(path)
    stops = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    per_rule = []
    for rule in FAMILY[1:]:
        right = 0
        for ex in items:
            msgs = [{"role": "system", "content": rule_text(rule)}, {"role": "user", "content": ex.prompt}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            out: list[int] = []
            with torch.no_grad():
                for _ in range(2 * 4 * 2 + 2):
                    nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
                    if nxt in stops:
                        break
                    out.append(nxt)
            target = " ".join(map(str, apply_rule(rule, ex.meta["digits"])))
            right += tok.decode(out, skip_special_tokens=True).split() == target.split()
        per_rule.append(right / len(items))
    return sum(per_rule) / len(per_rule)


def test_eval_other_contexts_matches_independent_decoder_and_names_the_deaf(organisms, tmp_path, capsys):
    from mechopd.tasks.base import get_task

    out = tmp_path / "cmp"
    code = main(
        [
            "eval",
            "--task",
            "rules",
            "--option",
            f"family=[{', '.join(FAMILY)}]",
            "--option",
            "max_len=4",
            "--n",
            str(N),
            "--other-contexts",
            "--compare",
            f"base={organisms['base']}",
            f"deaf={organisms['deaf']}",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    screen = capsys.readouterr().out
    items = get_task("rules", family=FAMILY, max_len=4).examples("test", N, 0)
    reps = {k: json.loads((out / f"{k}.json").read_text()) for k in ("base", "deaf")}
    for name, rep in reps.items():
        ref = _reference_follow(organisms[name], items)
        assert abs(rep["summary"]["follow_other"]["value"] - ref) <= 0.05, (name, ref)
        assert [r["label"] for r in rep["other_contexts"]] == FAMILY[1:]
        assert all(r["n"] == N for r in rep["other_contexts"])
    base, deaf = reps["base"]["summary"], reps["deaf"]["summary"]
    assert base["follow_other"]["value"] >= 0.8  # the base organism reads its contexts: the check is not vacuous
    assert "retention" not in base and "context_deaf" not in base
    assert deaf["context_deaf"] is True and "context-deaf" in deaf["regime_reason"]
    assert deaf["retention"] == pytest.approx(deaf["follow_other"]["value"] / base["follow_other"]["value"])
    assert deaf["stick"]["value"] > 0.3  # the deaf model answers shift:1 under shift:2
    assert "context-deaf" in (out / "compare.md").read_text() and "context-deaf" in screen


@pytest.mark.parametrize(
    "method,selector,micro",
    [("opd", "full", {}), ("nca", "ta_opd", {}), ("nca", "ta_opd", {"micro_batch_size": 2, "logit_chunk": 3})],
)
def test_follow_term_starts_at_zero_and_adds_to_the_loss(tiny_rules_organism, tmp_path, method, selector, micro):
    """Student = teacher at step 1, so L_follow = 0 exactly; the logged loss is Σ weight · term at every step, with
    NCA and with the TA-OPD selector alike; follow_contexts limits what is drawn (a bad label is refused)."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import train

    cfg = TrainConfig(
        task="rules",
        student=str(tiny_rules_organism),
        method=method,
        selector=selector,
        beta=0.5,
        estimator="full",
        batch_size=6,
        lr=1e-2,
        steps=3,
        follow_weight=2.0,
        follow_contexts=["shift:2", "reverse"],
        grad_stats_every=3,
        **micro,
    )
    train(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # 0 up to the float order of the micro-batched kernels (3.7e-9 measured with micro_batch_size=2, logit_chunk=3)
    assert rows[0]["loss/follow"] == pytest.approx(0.0, abs=1e-7) and rows[-1]["loss/follow"] > 1e-4
    for r in rows:
        terms = r["loss/opd"] + (0.5 * r["loss/nca"] if method == "nca" else 0.0) + 2.0 * r["loss/follow"]
        assert r["loss"] == pytest.approx(terms, rel=1e-5, abs=1e-7)
    assert "grad/norm/follow" in rows[-1]
    code = main(
        [
            "train",
            "--set",
            f"student={tiny_rules_organism}",
            "--set",
            "follow_weight=1",
            "--set",
            "follow_contexts=[shift:9]",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "bad"),
        ]
    )
    assert code == 2 and not (tmp_path / "bad").exists()


def test_a_game_without_other_contexts_is_not_measurable_said_once(organism_tokenizer):
    from mechopd.evaluation import following
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.tasks.base import get_task
    from tests.conftest import tiny_model

    task, cfg = get_task("frozenlake"), EvalConfig(n=2, seed=0, n_boot=10)
    reps = {}
    for name in ("base", "opd"):
        model = tiny_model(organism_tokenizer, seed=len(name))
        reps[name] = following.add_following(
            evaluate_model(model, organism_tokenizer, task, cfg), model, organism_tokenizer, task, cfg
        )
    following.apply_retention(reps)
    assert reps["opd"]["summary"]["follow_other"]["value"] is None and reps["opd"]["other_contexts"] == []
    assert "context_deaf" not in reps["opd"]["summary"]
    text = following.format_following(reps)
    assert text.count("not measurable") == 1 and "game 'frozenlake'" in text


def test_follow_gradients_add_the_same_under_micro_batches_and_chunks(tiny_rules_organism, tmp_path):
    """The other-context batch runs its own micro-batched, chunked scorer pass whose gradients ADD to the step's:
    a run with micro_batch_size=2, logit_chunk=3 follows the one-shot run (same losses, per-term gradient norms)."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import train

    runs = {}
    for name, micro in (("one", {}), ("micro", {"micro_batch_size": 2, "logit_chunk": 3})):
        cfg = TrainConfig(
            task="rules",
            student=str(tiny_rules_organism),
            method="nca",
            beta=0.5,
            estimator="full",
            batch_size=6,
            lr=1e-2,
            steps=3,
            follow_weight=1.0,
            grad_stats_every=2,
            seed=3,
            **micro,
        )
        train(cfg, tmp_path / name, progress=False)
        runs[name] = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    one, mic = runs["one"], runs["micro"]
    assert one[1]["grad/norm/follow"] > 0  # the follow term moves the student from step 2 on: not vacuous
    for key in ("loss/follow", "loss/opd", "loss/nca", "grad_norm"):
        for k, (a, b) in enumerate(zip(one, mic)):
            # step 1 from the same weights: equal to float precision; later steps at lr 1e-2 carry the float-order
            # difference of the micro-batched kernels forward (measured 1.2e-4 relative on grad_norm at step 3)
            assert b[key] == pytest.approx(a[key], rel=1e-4 if k == 0 else 1e-3, abs=1e-6), (key, k)
    assert mic[1]["grad/norm/follow"] == pytest.approx(one[1]["grad/norm/follow"], rel=1e-3)
