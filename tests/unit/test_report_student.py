"""The report names the base model by what it is (#54): an organism is an "Organism", a fetched model or any other
checkpoint a "Model"."""

from __future__ import annotations

from mechopd.report import student_word


def test_a_fetched_model_is_not_called_an_organism(tmp_path):
    organism, fetched = tmp_path / "rules", tmp_path / "smollm2-135m-instruct"
    organism.mkdir()
    fetched.mkdir()
    (organism / "organism.json").write_text("{}")
    (fetched / "config.json").write_text("{}")
    assert student_word(str(organism)) == "Organism"
    assert student_word(str(fetched)) == "Model"
    assert student_word("HuggingFaceTB/SmolLM2-135M-Instruct") == "Model"
    assert student_word(None) == "Model"
