"""Every verb end to end on each family of the zoo, from the CLI: train (OPD, NCA cross-model, TA-OPD), eval in both
views, the four probes, figures, TransformerLens and nnsight, on the JSONL task with the ~512-token context file.

On the JSONL task the probes run from `--run RUN_DIR` alone (task options and render spec read from the run); their
flag form also runs on the qwen3 fixture with the option-less `rules` task."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from mechopd.core.views import RenderSpec
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task

from .helpers import FAMILIES, NO_CONTEXT_SYSTEM, TEMPLATE_KWARGS, cli, jsonl_sets, render_sets

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
    "--set",
    "eval_every=2",
    "--set",
    "eval_n=2",
]
METHODS = {"opd": ["--method", "opd"], "nca": ["--method", "nca"], "ta_opd": ["--method", "ta_opd"]}


def spec_of(family: str, placement: str = "system") -> RenderSpec:
    return RenderSpec(placement, NO_CONTEXT_SYSTEM[family], dict(TEMPLATE_KWARGS[family]))


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, zoo, tmp_path_factory):
    """One run directory per family in the `mechopd demo` layout: train/<method>, eval/, probes/."""
    family = request.param
    root = tmp_path_factory.mktemp(f"run-{family}")
    sets = [x for s in render_sets(family) for x in ("--set", s)]
    for method, flags in METHODS.items():
        teacher = ["--teacher", zoo.teacher(family)] if method == "nca" else []  # cross-model, padded vocabulary
        cli(
            "train",
            "--task",
            "jsonl",
            *flags,
            "--student",
            zoo.student(family),
            *teacher,
            *TRAIN,
            *jsonl_sets(zoo),
            *sets,
            "--out",
            root / "train" / method,
        )
    return family, root


def test_train_writes_loadable_checkpoints_and_learning_metrics(run, zoo):
    family, root = run
    for method in METHODS:
        recs = [json.loads(x) for x in (root / "train" / method / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in recs if "loss" in r]
        assert [r["step"] for r in steps] == [1, 2]
        assert all(torch.isfinite(torch.tensor(r["loss"])) and r["kl/teacher_student"] > 0 for r in steps)
        assert any("eval/acc_x" in r for r in recs)
        cfg = (root / "train" / method / "config.yaml").read_text()
        assert "no_context_system: ''" in cfg if NO_CONTEXT_SYSTEM[family] == "" else "no_context_system: null" in cfg
        final = load_model(root / "train" / method / "final")
        assert type(final).__name__ == type(load_model(zoo.student(family))).__name__
    selected = [json.loads(x) for x in (root / "train" / "ta_opd" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kept_fraction", 1.0) < 1.0 for r in selected)  # the teachability selector kept a subset
    nca = (root / "train" / "nca" / "metrics.jsonl").read_text()
    assert "loss/nca" in nca
    # the trained student moved away from the initial weights
    a, b = load_model(zoo.student(family)), load_model(root / "train" / "opd" / "final")
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_eval_both_views_and_probes_then_figures(run, zoo, capsys):
    family, root = run
    models = {"base": zoo.student(family), **{m: root / "train" / m / "final" for m in METHODS}}
    opts = [x for k, v in zoo.jsonl_options(max_new_tokens=6).items() for x in ("--option", f"{k}={v}")]
    nocs = [] if NO_CONTEXT_SYSTEM[family] is None else ["--no-context-system", NO_CONTEXT_SYSTEM[family]]
    cli(
        "eval",
        "--task",
        "jsonl",
        *opts,
        "--n",
        "4",
        *nocs,
        "--out",
        root / "eval",
        "--compare",
        *[f"{k}={v}" for k, v in models.items()],
    )
    rep = json.loads((root / "eval" / "opd.json").read_text())
    assert rep["summary"]["n"] == 4 and len(rep["records"]) == 4
    assert {"correct_x", "correct_xc", "len_x", "len_xc"} <= set(rep["records"][0])
    assert rep["settings"]["no_context_system"] == NO_CONTEXT_SYSTEM[family]
    _probes_on_jsonl(family, root, zoo, models)
    cli(
        "probe",
        "deltas",
        "--base",
        zoo.student(family),
        "--models",
        f"opd={models['opd']}",
        f"nca={models['nca']}",
        "--out",
        root / "probes",
    )
    capsys.readouterr()
    cli("figures", root)
    drawn = {p.stem for p in (root / "figures").glob("*.png")}
    assert {
        "training_curves",
        "removability",
        "layer_cosine",
        "gradient_alignment",
        "parameter_deltas",
        "teachability",
    } <= drawn, drawn
    assert (root / "report.md").read_text().strip()


def _probes_on_jsonl(family: str, root: Path, zoo, models: dict) -> None:
    """similarity, gradients and teachability on the JSONL task from `--run RUN_DIR` alone: the task options and the
    render spec (no_context_system, chat_template_kwargs) come from the run's config.yaml."""
    out = root / "probes"
    cli("probe", "similarity", "--run", root / "train" / "opd", "--n", "4", "--out", out)
    with open(out / "similarity.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["model"] for r in rows} >= {"base", "opd"}
    assert all(-1.0 - 1e-5 <= float(r["cos_mean"]) <= 1.0 + 1e-5 for r in rows)
    cli("probe", "gradients", "--run", root / "train" / "nca", "--n", "2", "--out", out)
    assert (out / "gradients.csv").exists()
    cli("probe", "teachability", "--run", root / "train" / "ta_opd", "--n", "4", "--out", out)
    assert "gap" in json.loads((out / "teachability_summary.json").read_text())


@pytest.mark.parametrize("family", ["qwen3"])
def test_probe_cli_on_a_bpe_checkpoint(family, zoo, tmp_path):
    """The probe commands as a user types them today (the option-less rules task; byte-level BPE covers its text)."""
    s = zoo.student(family)
    cli(
        "probe",
        "similarity",
        "--models",
        f"a={s}",
        f"b={zoo.teacher(family)}",
        "--task",
        "rules",
        "--n",
        "3",
        "--out",
        tmp_path / "sim",
    )
    with open(tmp_path / "sim" / "similarity.csv") as f:
        assert {r["model"] for r in csv.DictReader(f)} == {"a", "b"}
    cli(
        "probe",
        "gradients",
        "--model",
        s,
        "--teacher",
        zoo.teacher(family),
        "--task",
        "rules",
        "--n",
        "2",
        "--out",
        tmp_path / "grad",
    )
    cli(
        "probe",
        "teachability",
        "--student",
        s,
        "--trained",
        zoo.teacher(family),
        "--teacher",
        s,
        "--task",
        "rules",
        "--n",
        "3",
        "--out",
        tmp_path / "teach",
    )
    assert (tmp_path / "grad" / "gradients.csv").exists() and (tmp_path / "teach" / "bank.json").exists()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_probe_cli_refuses_an_implicit_no_context_view(family, zoo, tmp_path, capsys):
    """Without a render spec on the CLI, a template that renders a system block is refused, not silently used."""
    from mechopd.cli import main

    rc = main(
        [
            "probe",
            "similarity",
            "--models",
            f"a={zoo.student(family)}",
            "--task",
            "rules",
            "--n",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "no_context_system" in errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_transformer_lens_and_nnsight_agree_with_our_hooks(family, zoo):
    from mechopd.probes.interop import to_nnsight, to_transformer_lens, two_view_cosine_nnsight, two_view_cosine_tl
    from mechopd.probes.items import make_batches
    from mechopd.probes.view_cosine import two_view_cosine

    path = zoo.student(family)
    task = get_task("jsonl", **zoo.jsonl_options(max_new_tokens=5))
    items = make_batches(load_tokenizer(path), task, 3, 0, 3, load_model(path), spec_of(family))
    ours = two_view_cosine(load_model(path), items).rows
    for rows in (
        two_view_cosine_tl(to_transformer_lens(path), items).rows,
        two_view_cosine_nnsight(to_nnsight(path), items).rows,
    ):
        assert [r["site"] for r in rows] == [r["site"] for r in ours]
        for a, b in zip(rows, ours):
            assert abs(a["cos_mean"] - b["cos_mean"]) <= 1e-4, (family, a["site"], a["cos_mean"], b["cos_mean"])
