"""Hostile inputs, round 5 (#57): ``--out`` holds only what the study made; a finished study edited (#54).

A directory the study did not write is refused before any job (never replaced, never reused); a trained run whose
config.yaml records another config than the study's is refused naming the field; a study record without its inputs
record is "unknown inputs", not "done". A finished study whose evaluation or probe options change reuses every
trained model and reruns only what depends on the change. Each refusal: exit 2, one ``error:`` line, nothing on disk
changed (`tests.cli.hostile.check`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.cli.hostile import Hostile, check_in_workspace, copy_org, write
from tests.cli.test_hostile_study_run import study


def _users_killed_run(o: Path, w: Path) -> list[str]:
    """The user's own killed `mechopd train` run at ``out/train/opd`` (config.yaml and metrics.jsonl)."""
    write(w, "out/train/opd/config.yaml", "task: rules\nlr: 0.001\n")
    write(w, "out/train/opd/metrics.jsonl", '{"step": 1, "loss": 0.5}\n')
    return study(w, copy_org(o, w))


def _users_files(o: Path, w: Path) -> list[str]:
    write(w, "out/notes.txt", "my notes\n")
    return study(w, copy_org(o, w))


CASES = [
    Hostile("out", "users-killed-train-run-inside-out", _users_killed_run, "no run of this study wrote it"),
    Hostile("out", "users-files-in-out", _users_files, "holds notes.txt but no study_run.yaml"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_directory_the_study_did_not_write_is_refused(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)


@pytest.fixture(scope="module")
def finished(tiny_rules_organism, tmp_path_factory):
    """A finished one-step study (OPD, eval n=2, the similarity probe on 2 items): its workspace; tests copy it."""
    import contextlib
    import io

    from mechopd.cli import main

    ws = tmp_path_factory.mktemp("finished")
    argv = study(ws, copy_org(Path(tiny_rules_organism), ws), probes={"similarity": {"n": 2}})
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(argv) == 0, err.getvalue()[-2000:]
    return ws


def _copy(finished: Path, tmp_path: Path, monkeypatch) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(finished, ws, symlinks=True)
    doc = yaml.safe_load((ws / "s.yaml").read_text())
    doc["student"] = str(ws / "org")
    (ws / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (ws / "out" / "study_run.yaml").write_text(  # the copy's student path, as if the study had run here
        (ws / "out" / "study_run.yaml").read_text().replace(str(finished / "org"), str(ws / "org"))
    )
    monkeypatch.chdir(ws)
    return ws


def _refused(ws: Path, capsys, needle: str) -> str:
    from mechopd.cli import main
    from tests.cli.hostile import snapshot

    before = snapshot(ws)
    capsys.readouterr()
    code = main(["run", str(ws / "s.yaml"), "--out", str(ws / "out")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert snapshot(ws) == before
    return lines[0]


def test_a_reused_training_run_of_another_config_is_refused_naming_the_field(finished, tmp_path, monkeypatch, capsys):
    """The study's train/opd/config.yaml says lr 1e-3 where the study asks another lr: not "done, skipped"."""
    ws = _copy(finished, tmp_path, monkeypatch)
    cfg = ws / "out" / "train" / "opd" / "config.yaml"
    doc = yaml.safe_load(cfg.read_text())
    doc["lr"] = 0.001
    cfg.write_text(yaml.safe_dump(doc))
    line = _refused(ws, capsys, "train/opd/config.yaml records another config than the study's runs.opd")
    assert "lr: 0.001 ->" in line, line


def test_a_trained_run_linked_in_from_outside_is_refused_before_any_job(finished, tmp_path, monkeypatch, capsys):
    """train/opd replaced by a link to the user's own finished run elsewhere (same config): refused, not reused."""
    ws = _copy(finished, tmp_path, monkeypatch)
    shutil.move(ws / "out" / "train" / "opd", ws / "mine")
    (ws / "out" / "train" / "opd").symlink_to(ws / "mine")
    _refused(ws, capsys, "outside the run")


def test_a_missing_inputs_record_is_unknown_inputs_not_done(finished, tmp_path, monkeypatch, capsys):
    """study_inputs.json deleted (and the student's weights changed): the rerun refuses, never 'nothing to run'."""
    from tests.cli.reliability_harness import poison

    ws = _copy(finished, tmp_path, monkeypatch)
    (ws / "out" / "study_inputs.json").unlink()
    poison(ws / "org", 0.5)
    _refused(ws, capsys, "not its study_inputs.json: the models and data its results were made from are unknown")


def test_a_probe_removed_from_a_finished_study_is_refused(finished, tmp_path, monkeypatch, capsys):
    ws = _copy(finished, tmp_path, monkeypatch)
    doc = yaml.safe_load((ws / "s.yaml").read_text())
    del doc["probes"]
    (ws / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    _refused(ws, capsys, "no longer lists probes.similarity")


def _tree(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in sorted(d.rglob("*")) if p.is_file()}


def _content(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("edit", ["eval-n", "probe-n"])
def test_an_edited_finished_study_reuses_every_trained_model(edit, finished, tmp_path, monkeypatch, capsys):
    """eval.n 2 -> 3: no training job, every evaluation rerun with 3 items, the probe reused; the similarity probe's n
    2 -> 3: that probe rerun, the evaluations reused. Then a rerun of the edited study is done."""
    import json

    from mechopd.cli import main

    ws = _copy(finished, tmp_path, monkeypatch)
    doc = yaml.safe_load((ws / "s.yaml").read_text())
    if edit == "eval-n":
        doc["eval"]["n"] = 3
    else:
        doc["probes"]["similarity"]["n"] = 3
    (ws / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out = ws / "out"
    trained, evals, probes = _tree(out / "train"), _content(out / "eval"), _tree(out / "probes")
    capsys.readouterr()
    argv = ["run", str(ws / "s.yaml"), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    said = capsys.readouterr().out
    assert "train opd: done, skipped" in said and "(new)" not in said and "(resuming)" not in said, said
    assert _tree(out / "train") == trained  # every trained model reused, untouched
    base = json.loads((out / "eval" / "base.json").read_text())
    if edit == "eval-n":
        assert base["summary"]["n"] == 3 and _tree(out / "probes") == probes
    else:
        assert _content(out / "eval") == evals and _tree(out / "probes") != probes
        assert json.loads((out / "probes" / "similarity.json").read_text())["settings"]["n"] == 3
    capsys.readouterr()
    assert main(argv) == 0
    assert "done, nothing to run" in capsys.readouterr().out


def test_the_deltas_probe_of_an_unchanged_model_writes_no_update_and_the_study_finishes(
    tiny_rules_organism, tmp_path, monkeypatch, capsys
):
    """A checkpoint run identical to the student (a zero update) under the deltas probe with ``svd``: its tables
    written (zeros), the report says "no update", the study finishes; the rerun is done (it failed the same way)."""
    from mechopd.cli import main

    monkeypatch.chdir(tmp_path)
    org = Path(tiny_rules_organism)
    argv = study(
        tmp_path,
        copy_org(org, tmp_path),
        runs={role: {"checkpoint": str(copy_org(org, tmp_path, role))} for role in ("opd", "nca")},
        probes={"deltas": {"svd": True}},
    )
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    out = tmp_path / "out"
    assert (out / "probes" / "deltas_svd.csv").is_file() and (out / "probes" / "deltas.csv").is_file()
    report = (out / "report.md").read_text()
    assert "opd (`probes/deltas_svd.csv`): no update" in report
    assert "opd 0 (no update), nca 0 (no update)" in report and "= undefined (a zero update)" in report
    capsys.readouterr()
    assert main(argv) == 0 and "done, nothing to run" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "false", "False", "1", "true"])
def test_a_boolean_chat_template_kwarg_reads_as_a_boolean(value, tiny_rules_organism):
    """``--chat-template-kwarg enable_thinking=0`` turns a Qwen3-style flag off: the template tests ``is false``,
    which the number 0 never passes."""
    from transformers import AutoTokenizer

    from mechopd.core.config_parse import parse_options
    from mechopd.core.views import RenderSpec, render_prompt_text

    tok = AutoTokenizer.from_pretrained(tiny_rules_organism)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and enable_thinking is false %}<no-think>{% endif %}"
        "{% if enable_thinking is defined and enable_thinking is true %}<think>{% endif %}"
    )
    kwargs = parse_options([f"enable_thinking={value}"], "--chat-template-kwarg")
    text = render_prompt_text(tok, "hi", None, RenderSpec("system", None, kwargs))
    assert ("<no-think>" in text) == (value.lower() in ("0", "false")), text
    assert ("<think>" in text) == (value.lower() in ("1", "true")), text


# ------------------------------------------------------------------------------------- references that can be scored
def _qa(w: Path, lines: list[dict], fmt: str, *more: str) -> list[str]:
    """``mechopd eval`` of the organism on a jsonl file of ``lines`` under ``answer_format`` ``fmt``."""
    import json

    data = write(w, "qa.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    ctx = write(w, "ctx.txt", "The capital of Veldra is Oskar.\n")
    return [
        "eval", "--task", "jsonl", "--option", f"path={data}", "--option", f"context_file={ctx}",
        "--option", f"answer_format={fmt}", *more, "--model", str(w / "org"), "--n", "1",
    ]  # fmt: skip


def _jsonl(lines: list[dict], fmt: str, *more: str):
    def argv(o: Path, w: Path) -> list[str]:
        copy_org(o, w)
        return _qa(w, lines, fmt, *more)

    return argv


def _other_file(o: Path, w: Path) -> list[str]:
    copy_org(o, w)
    return _qa(w, [{"prompt": "Capital of Veldra?", "answer": "Oskar", "other_answer": "Brun"}], "exact") + [
        "--option",
        f"other_context_file={write(w, 'other.txt', 'The capital of Veldra is Oskar.')}",
    ]


Q = "What is the capital of Veldra?"
MC = {"question": Q, "options": ["Oskar", "Brun"], "answer": "A"}
JSONL_CASES = [
    Hostile("score", "exact-answer-only-punctuation", _jsonl([{"prompt": Q, "answer": "?"}], "exact"), "nothing"),
    Hostile(
        "score", "answer-only-zero-width", _jsonl([{"prompt": Q, "answer": "\u200b\u200b"}], "tag"), "normalises to"
    ),
    Hostile(
        "score", "first-line-two-line-answer", _jsonl([{"prompt": Q, "answer": "Oskar\nCity"}], "first_line"), "lines"
    ),
    Hostile(
        "score",
        "one-question-three-answers",
        _jsonl([{"prompt": Q, "answer": a} for a in ("Oskar", "Brun", "Tal")], "exact"),
        "line 2: repeats the question of line 1 with another answer",
    ),
    Hostile(
        "score",
        "one-id-two-questions",
        _jsonl([{"id": 7, "prompt": Q, "answer": "Oskar"}, {"id": 7, "prompt": "Capital?", "answer": "Brun"}], "tag"),
        "line 2: id 7 is also line 1's",
    ),
    Hostile(
        "score",
        "options-equal-up-to-case",
        _jsonl([{**MC, "options": ["Oskar", "OSKAR."]}], "tag"),
        "options A and B are the same text up to case",
    ),
    Hostile(
        "score",
        "contains-options-nested",
        _jsonl([{**MC, "options": ["black cat", "cat"]}], "contains"),
        "option B ('cat') is inside option A",
    ),
    Hostile("score", "other-context-file-is-the-context", _other_file, "is the distilled context itself"),
    Hostile(
        "score",
        "item-other-context-is-its-context",
        _jsonl([{"prompt": Q, "answer": "Oskar", "context": "C.", "other_context": "C.", "other_answer": "B"}], "tag"),
        "'other_context' is the item's own context",
    ),
    Hostile(
        "score",
        "contains-answer-in-its-question",
        _jsonl([{"prompt": "Is Oskar the capital of Veldra?", "answer": "Oskar"}], "contains"),
        "appears in the item's own question",
    ),
    Hostile(
        "score",
        "contains-right-option-in-its-question",
        _jsonl([{**MC, "question": "Oskar or Brun: which is the capital?"}], "contains"),
        "options[A] = 'Oskar' appears in the item's own question",
    ),
    Hostile("score", "contains-one-letter", _jsonl([{"prompt": Q, "answer": "a"}], "contains"), "too short"),
    Hostile("score", "contains-stop-words", _jsonl([{"prompt": Q, "answer": "of the"}], "contains"), "only stop words"),
]


@pytest.mark.parametrize("case", JSONL_CASES, ids=lambda c: c.name)
def test_a_reference_that_cannot_be_scored_is_refused_at_load(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("fmt", ["tag", "exact", "first_line", "contains"])
def test_invisible_characters_are_stripped_from_both_sides_before_any_format(fmt):
    """A leading right-to-left mark, a zero-width space inside the word, a BOM: "Paris" stays right, on either side."""
    from mechopd.tasks.jsonl_answer import score_response

    def reply(text: str) -> str:
        return f"<answer>{text}</answer>" if fmt == "tag" else text

    for said, ref in (("\u200fParis", "Paris"), ("Par\u200bis", "Paris"), ("Paris", "\ufeff\u200eParis")):
        assert score_response(reply(said), ref, None, fmt), (fmt, said, ref)
    assert not score_response(reply("\u200fLyon"), "Paris", None, fmt)
    options = {"A": "\u200fOskar", "B": "Brun"}
    assert score_response(reply("Oskar" if fmt != "tag" else "A"), "A", options, fmt)


def test_the_shipped_data_files_load_under_their_studies_formats():
    """The shipped files pass the load-time checks: the sample under every format but contains (its options "3" and
    "4" are one character), the SmolLM2 facts under every format (its study's is contains)."""
    from mechopd.tasks.base import get_task
    from mechopd.tasks.jsonl import DATA_DIR

    for fmt in ("tag", "exact", "first_line", "contains"):
        facts = get_task("jsonl", path=DATA_DIR / "smollm2_facts.jsonl", context_file=DATA_DIR / "smollm2_handbook.txt",
                         answer_format=fmt, other_context_file=DATA_DIR / "smollm2_handbook_other.txt")  # fmt: skip
        assert sum(facts.split_sizes().values()) == 96
        if fmt != "contains":
            sample = get_task("jsonl", path=DATA_DIR / "sample_qa.jsonl", context_file=DATA_DIR / "sample_context.txt",
                              answer_format=fmt)  # fmt: skip
            assert sum(sample.split_sizes().values()) == 40


# ---------------------------------------------------------------------------- checkpoints and families, before any job
def _edited(o: Path, w: Path, **keys) -> Path:
    """A copy of the organism whose config.json sets ``keys`` (as a user editing it would)."""
    import json

    d = copy_org(o, w, "edited")
    doc = json.loads((d / "config.json").read_text())
    doc.update(keys)
    (d / "config.json").write_text(json.dumps(doc))
    return d


def _eval_edited(**keys):
    def argv(o: Path, w: Path) -> list[str]:
        return ["eval", "--task", "rules", "--model", str(_edited(o, w, **keys)), "--n", "2"]

    return argv


def _recurrent_gemma(o: Path, w: Path) -> list[str]:
    from transformers import AutoConfig

    d = w / "rg"
    AutoConfig.for_model(
        "recurrent_gemma", num_hidden_layers=3, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        lru_width=32, vocab_size=64,
    ).save_pretrained(d)  # fmt: skip
    return ["eval", "--task", "rules", "--model", str(d), "--n", "2"]


def _tied_with_another_head(o: Path, w: Path) -> list[str]:
    """The organism (tie_word_embeddings: true) whose file also holds an lm_head.weight that is not the embedding."""
    from safetensors.torch import load_file, save_file

    d = copy_org(o, w, "tied")
    tensors = load_file(d / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return ["eval", "--task", "rules", "--model", str(d), "--n", "2"]


def _resized(o: Path, w: Path, name: str, **keys) -> Path:
    """A model of the organism's family and tokenizer with other sizes (``keys`` over its config), saved whole."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = copy_org(o, w, name)
    config = AutoConfig.from_pretrained(d)
    doc = {k: v for k, v in config.to_dict().items() if k != "layer_types"}  # rebuilt for the new depth
    AutoModelForCausalLM.from_config(type(config)(**{**doc, **keys})).save_pretrained(d)
    return d


def _study_over(o: Path, w: Path, **keys) -> list[str]:
    return study(w, copy_org(o, w), runs={"old": {"checkpoint": str(_resized(o, w, "c", **keys))}})


FAMILY_CASES = [
    Hostile(
        "family", "hidden-act-swishy", _eval_edited(hidden_act="swishy"), "hidden_act='swishy' is not an activation"
    ),
    Hostile(
        "family",
        "kv-heads-do-not-divide",
        _eval_edited(num_key_value_heads=3),
        "num_attention_heads=4 is not a multiple of num_key_value_heads=3",
    ),
    Hostile(
        "family",
        "dbrx-experts-under-ffn-config",
        _eval_edited(ffn_config={"moe_num_experts": 4, "moe_top_k": 1}),
        "ffn_config.moe_num_experts=4: a mixture-of-experts model",
    ),
    Hostile(
        "family", "recurrent-gemma-by-structure", _recurrent_gemma, "has no attention block mechopd's module map knows"
    ),
    Hostile(
        "family",
        "tied-config-another-head-in-file",
        _tied_with_another_head,
        "(tie_word_embeddings) but the files hold them with different values",
    ),
    Hostile(
        "study",
        "checkpoint-run-deeper-than-student",
        lambda o, w: _study_over(o, w, num_hidden_layers=3),
        "runs.old.checkpoint",
    ),
    Hostile(
        "study",
        "checkpoint-run-wider-than-student",
        lambda o, w: _study_over(o, w, intermediate_size=48),
        "intermediate_size 48 vs the student's",
    ),
    Hostile(
        "study",
        "probe-layer-past-the-depth",
        lambda o, w: study(w, copy_org(o, w), probes={"attribution": {"layers": [99]}}),
        "probes.attribution.layers: layer 99 is past the student's 2 decoder layers",
    ),
    Hostile(  # round 4's leftover: refused after training, 37 files written
        "study",
        "probe-layer-past-the-organisms-depth",
        lambda o, w: study(w, "organism:rules", probes={"weightpatch": {"layers": "0,99"}}),
        "probes.weightpatch.layers: layer 99 is past the student's 3 decoder layers",
    ),
]


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.name)
def test_a_checkpoint_or_family_is_refused_before_any_job(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)
    assert not (tmp_path / "ws" / "out").exists()


def test_a_study_killed_before_its_record_is_not_refused_as_foreign(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """A kill between the inputs record and the study record leaves study_inputs.json (and the lock): the rerun runs."""
    from mechopd.cli import main

    monkeypatch.chdir(tmp_path)
    argv = study(tmp_path, copy_org(Path(tiny_rules_organism), tmp_path))
    write(tmp_path, "out/study_inputs.json", "{}")
    write(tmp_path, "out/.mechopd.lock", "")
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    assert (tmp_path / "out" / "report.md").is_file()
