"""`mechopd eval` is a thin call of `evaluate.plan_eval` + `evaluate.evaluate_plan`, which `mechopd.run_eval` calls
too: both refuse the same bad inputs with the same message, before any model loads; and both give the same report."""

from __future__ import annotations

import json

import pytest

import mechopd
from mechopd.cli import main
from mechopd.core.errors import MechopdError

BAD = [  # (CLI flags after --model MODEL, run_eval keywords, words of the refusal)
    (["--task", "rules", "--n", "0"], {"task": "rules", "n": 0}, "n"),
    (["--task", "rules", "--samples", "0"], {"task": "rules", "samples": 0}, "samples"),
    (["--task", "rules", "--temperature", "-1"], {"task": "rules", "temperature": -1.0}, "temperature"),
    (["--task", "rules", "--engine", "warp"], {"task": "rules", "engine": "warp"}, "warp"),
    (["--task", "chess"], {"task": "chess"}, "chess"),
    (["--task", "rules", "--option", "rule=nope:9"], {"task": "rules", "task_options": {"rule": "nope:9"}}, "nope"),
    (
        ["--task", "rules", "--chat-template-kwarg", "date_string=x"],
        {"task": "rules", "chat_template_kwargs": {"date_string": "x"}},
        "date_string",
    ),
    ([], {}, "--task is required"),  # a plain checkpoint records no task
]


@pytest.mark.parametrize("flags, kwargs, words", BAD, ids=[b[2] for b in BAD])
def test_run_eval_and_mechopd_eval_refuse_the_same_bad_input(
    flags, kwargs, words, tiny_rules_organism, tmp_path, capsys
):
    model = str(tiny_rules_organism)
    assert main(["eval", "--model", model, "--out", str(tmp_path / "r.json"), *flags]) == 2
    cli_error = capsys.readouterr().err.strip()
    assert cli_error.startswith("error: ") and words in cli_error and "\n" not in cli_error
    with pytest.raises(MechopdError) as e:
        mechopd.run_eval(model, **kwargs)
    assert str(e.value) == cli_error.removeprefix("error: ")
    assert not (tmp_path / "r.json").exists()


def test_a_missing_checkpoint_is_refused_alike(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    assert main(["eval", "--model", missing, "--task", "rules", "--out", str(tmp_path / "r.json")]) == 2
    cli_error = capsys.readouterr().err.strip().removeprefix("error: ")
    with pytest.raises(MechopdError) as e:
        mechopd.run_eval(missing, "rules")
    assert str(e.value) == cli_error


def test_run_eval_and_mechopd_eval_give_the_same_report(tiny_rules_organism, tmp_path, capsys):
    model = str(tiny_rules_organism)
    assert main(["eval", "--model", model, "--task", "rules", "--n", "4", "--out", str(tmp_path / "cli.json")]) == 0
    cli = json.loads((tmp_path / "cli.json").read_text())
    py = mechopd.run_eval(model, "rules", n=4, out=tmp_path / "py.json")
    assert cli["summary"] == json.loads(json.dumps(py["summary"])) and cli["settings"] == py["settings"]


@pytest.mark.parametrize(
    "flags, kwargs",
    [
        (["--task", "chess"], {"task": "chess"}),
        (["--task", "rules", "--n", "0"], {"task": "rules", "n": 0}),
        (["--task", "rules", "--layers", "0"], {"task": "rules", "layers": 0}),
    ],
)
def test_pretrain_organism_and_mechopd_pretrain_refuse_the_same_bad_input(flags, kwargs, tmp_path, capsys):
    """`mechopd pretrain` is a thin call of `pipeline.pretrain.pretrain_organism`: same refusal, nothing written."""
    from mechopd.pipeline.pretrain import pretrain_organism

    assert main(["pretrain", "--out", str(tmp_path / "o"), *flags]) == 2
    cli_error = capsys.readouterr().err.strip().removeprefix("error: ")
    with pytest.raises(MechopdError) as e:
        pretrain_organism(out=tmp_path / "o", **kwargs)
    assert str(e.value) == cli_error and not (tmp_path / "o").exists()
