"""Every registered probe from ``mechopd probe NAME --run RUN_DIR`` alone: on a rules-organism training run (a real
trainer run of two steps: config.yaml + final/) and on a JSONL run (sample_qa.jsonl + sample_context.txt, a model whose
word-level vocabulary covers the file; only final/training.json, as a copied checkpoint holds it)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from mechopd.cli import main
from mechopd.probes.registry import probes
from mechopd.probes.setup import ProbeSetup

BUILTIN = ("similarity", "gradients", "deltas", "teachability")
RULES_RUN = dict(task="rules", method="opd", batch_size=4, steps=2, lr=1e-3, max_new_tokens=6, seed=3, pool_size=16)


@pytest.fixture(scope="module")
def rules_run(tiny_rules_organism, tmp_path_factory) -> Path:
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import train

    run = tmp_path_factory.mktemp("rules") / "run"
    train(TrainConfig(student=str(tiny_rules_organism), **RULES_RUN), run, progress=False)
    return run


def _jsonl_model(tmp: Path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.tasks.base import get_task
    from mechopd.tasks.jsonl import SAMPLE_CONTEXT, SAMPLE_QA
    from mechopd.tasks.words import split_words

    task = get_task("jsonl", path=SAMPLE_QA, context_file=SAMPLE_CONTEXT)
    words = set(task.vocab())
    for split, size in task.split_sizes().items():
        for e in task.examples(split, size, 0):
            words.update(split_words(f"{e.prompt}\n{e.context}\n{e.answer}"))
    tok = build_tokenizer(sorted(words))
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
    )
    dirs = {}
    for name, seed in (("base", 0), ("final", 1)):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        dirs[name] = tmp / name
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    return tok, dirs


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory) -> Path:
    from mechopd.config import TrainConfig
    from mechopd.tasks.jsonl import SAMPLE_CONTEXT, SAMPLE_QA

    root = tmp_path_factory.mktemp("jsonl")
    tok, dirs = _jsonl_model(root)
    run = root / "run"
    run.mkdir()
    (dirs["final"]).rename(run / "final")
    cfg = TrainConfig(
        task="jsonl",
        task_options={"path": str(SAMPLE_QA), "context_file": str(SAMPLE_CONTEXT)},
        student=str(dirs["base"]),
        method="nca",
        max_new_tokens=5,
        seed=2,
        chat_template_kwargs={},
    )  # a variable the template never reads is refused (test_hostile_*)
    (run / "final" / "training.json").write_text(json.dumps({"step": 3, "config": cfg.to_dict()}))
    return run


def test_setup_from_a_training_run_reads_its_config(rules_run, tiny_rules_organism):
    s = ProbeSetup.from_run(rules_run)
    assert (s.task, s.seed, s.max_new_tokens) == ("rules", 3, 6)
    assert s.models == {"base": str(tiny_rules_organism), "opd": str(rules_run / "final")}
    assert s.trained == ["opd"] and s.model(None, "teacher") == ("base", str(tiny_rules_organism))


def test_setup_from_training_json_only(jsonl_run):
    s = ProbeSetup.from_run(jsonl_run)
    assert s.task == "jsonl" and s.task_options["path"].endswith("sample_qa.jsonl")
    assert s.trained == ["nca"] and s.chat_template_kwargs == {}
    task = s.make_task()
    assert task.max_new_tokens == 5 and s.spec(task).placement == "system"
    assert s.n_for(task, "test") == task.split_sizes()["test"] < 64  # the whole small split by default


def _table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _check_outputs(run: Path, trained: str) -> None:
    out = run / "probes"
    sim = _table(out / "similarity.csv")
    assert {r["model"] for r in sim} == {"base", trained} and all(abs(float(r["cos_mean"])) <= 1 + 1e-5 for r in sim)
    summary = json.loads((out / "similarity.json").read_text())
    assert summary["responses_from"] == trained  # the trained student samples, as in the demo
    glob = [r for r in _table(out / "gradients.csv") if r["scope"] == "global"]
    assert len(glob) == 1 and math.isfinite(float(glob[0]["norm_ratio"]))
    rel = json.loads((out / "deltas_summary.json").read_text())["rel_delta"]
    assert set(rel) == {trained} and rel[trained] > 0  # the trained weights moved
    teach = json.loads((out / "teachability_summary.json").read_text())
    assert teach["n_tokens"] > 0 and teach["settings"]["trained"] == str(run / "final")
    _check_items(out, trained, run)


def _check_items(out: Path, trained: str, run: Path) -> None:
    """The runner saved the exact items each probe scored, and every model's path is in the probe's settings."""
    settings = {
        "similarity": json.loads((out / "similarity.json").read_text())["settings"],
        "gradients": json.loads((out / "gradients.json").read_text())["settings"],
        "teachability": json.loads((out / "teachability_summary.json").read_text())["settings"],
    }
    for probe, s in settings.items():
        items = [json.loads(x) for x in (out / f"{probe}_items.jsonl").read_text().splitlines()]
        assert s["items_file"] == f"{probe}_items.jsonl" and len(items) == s["n"] > 0
        for it in items:
            assert set(it) == {"uid", "prompt_ids_x", "prompt_ids_c", "response_ids"} and it["response_ids"]
            assert it["prompt_ids_c"] != it["prompt_ids_x"]  # the context is in one view only
        assert str(run / "final") in s["model_paths"].values(), probe
    sampled = [json.loads(x) for x in (out / "similarity_responses.jsonl").read_text().splitlines()]
    items = [json.loads(x) for x in (out / "similarity_items.jsonl").read_text().splitlines()]
    assert [r["response_ids"] for r in sampled] == [it["response_ids"] for it in items]
    bank = json.loads((out / "bank.json").read_text())["items"]
    teach = [json.loads(x) for x in (out / "teachability_items.jsonl").read_text().splitlines()]
    assert [b["response_ids"] for b in bank] == [t["response_ids"] for t in teach]
    assert settings["gradients"]["model_labels"] == {"model": trained, "teacher": "base"}


@pytest.mark.parametrize("which", ["rules", "jsonl"])
def test_every_probe_runs_from_the_run_dir_alone(which, rules_run, jsonl_run, capsys):
    run = rules_run if which == "rules" else jsonl_run
    assert {p.name for p in probes()} >= set(BUILTIN)
    for name in BUILTIN:
        assert main(["probe", name, "--run", str(run)]) == 0, capsys.readouterr().err
    _check_outputs(run, "opd" if which == "rules" else "nca")
    bank = json.loads((run / "probes" / "bank.json").read_text())
    if which == "jsonl":
        assert all(len(it["response_ids"]) <= 5 for it in bank["items"])  # the run's max_new_tokens reached sampling
        train_size = ProbeSetup.from_run(run).make_task().split_sizes()["train"]
        assert bank["meta"]["task"] == "jsonl" and len(bank["items"]) == train_size < 64  # the whole train split
    else:
        assert bank["meta"]["n"] == 64


def test_flags_override_the_run(rules_run, tmp_path, capsys):
    out = tmp_path / "sim"
    args = [
        "probe",
        "similarity",
        "--run",
        str(rules_run),
        "--n",
        "3",
        "--option",
        "rule=reverse",
        "--placement",
        "user",
        "--no-context-system",
        "",
        "--out",
        str(out),
    ]
    assert main(args) == 0, capsys.readouterr().err
    settings = json.loads((out / "similarity.json").read_text())["settings"]
    assert settings["n"] == 3 and settings["task_options"] == {"rule": "reverse"}
    assert settings["spec"]["placement"] == "user" and settings["spec"]["no_context_system"] == ""
    responses = [json.loads(x) for x in (out / "similarity_responses.jsonl").read_text().splitlines()]
    assert len(responses) == 3


def test_bad_run_dir_and_option_are_one_line_errors(tmp_path, capsys):
    assert main(["probe", "deltas", "--run", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["probe", "deltas", "--run", str(tmp_path / "empty")]) == 2
    assert "config.yaml" in capsys.readouterr().err
    assert main(["probe", "similarity", "--task", "rules", "--placement", "middle"]) == 2
    assert "placement" in capsys.readouterr().err
    assert main(["probe", "similarity", "--task", "rules"]) == 2  # no models at all
    assert "--run" in capsys.readouterr().err


def _fake_final(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_setup_from_a_demo_dir_and_organism_students(tmp_path):
    from mechopd.config import TrainConfig, dump_yaml
    from mechopd.core.errors import ModelError

    organisms = tmp_path / "organisms"
    _fake_final(organisms / "rules")
    run = tmp_path / "demo"
    for m, kw in (("opd", {}), ("ta_opd", {"selector": "ta_opd"})):
        _fake_final(run / "train" / m / "final")
        dump_yaml(
            TrainConfig(student="organism:rules", organism_dir=str(organisms), seed=5, **kw),
            run / "train" / m / "config.yaml",
        )
    (run / "demo.json").write_text(
        json.dumps(
            {
                "task": "rules",
                "methods": ["opd", "ta_opd"],
                "organism": str(organisms / "rules"),
                "config": {"probe_n": 7},
            }
        )
    )
    s = ProbeSetup.from_run(run)
    assert list(s.models) == ["base", "opd", "ta_opd"] and s.models["base"] == str(organisms / "rules")
    assert (s.n, s.seed, s.trained) == (7, 5, ["opd", "ta_opd"])
    single = ProbeSetup.from_run(run / "train" / "ta_opd")  # a training run: organism:rules resolved, label = selector
    assert single.models == {"base": str(organisms / "rules"), "ta_opd": str(run / "train" / "ta_opd" / "final")}
    (organisms / "rules" / "config.json").unlink()
    with pytest.raises(ModelError, match="mechopd pretrain --task rules"):
        ProbeSetup.from_run(run / "train" / "opd")
