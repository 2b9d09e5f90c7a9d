"""docs/config.md is generated from the training config's field metadata (`mechopd.core.options.docs_table`): this test
fails when a field's default, help, range or choices changed without regenerating it. Regenerate with
``python -m tests.unit.test_config_docs``."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"
HEAD = """# Training config keys

Generated from the field metadata of `mechopd.config.TrainConfig` (`mechopd.core.options.docs_table`); do not edit by
hand: regenerate with `python -m tests.unit.test_config_docs`. Every key is a YAML key, a `--set KEY=VALUE` override
and (but mappings: `--set KEY.SUB=VALUE`) a `mechopd train --kebab-key VALUE` flag. A registered loss term's or
selector's options add their own keys (`register_term(..., options=)`, `register_selector(..., options=)`).
"""
EVAL_HEAD = """
# Evaluation options

`mechopd eval`'s flags (`--kebab-key VALUE`), generated from `mechopd.evaluation.config.EvalConfig` (`EVAL_FACTS`);
Python callers pass the same fields to `EvalConfig`.
"""


def render() -> str:
    from mechopd.config import TrainConfig
    from mechopd.core.options import docs_table, field_facts
    from mechopd.evaluation.config import EVAL_FACTS

    return HEAD + "\n" + docs_table(field_facts(TrainConfig)) + EVAL_HEAD + "\n" + docs_table(EVAL_FACTS)


def test_config_docs_are_up_to_date():
    assert DOC.read_text() == render(), "docs/config.md is stale: run python -m tests.unit.test_config_docs"


def test_every_key_is_documented_with_its_help_range_and_choices():
    from mechopd.config import TrainConfig
    from mechopd.core.options import field_facts

    text = render()
    for f in field_facts(TrainConfig):
        assert f"| `{f.name}` `" in text and f.help.split()[0] in text
    assert "| `beta` `--beta` | float | `0.5` | >= 0 |" in text and "all \\| selected" in text
    assert "| `n_boot` `--n-boot` | int | `1000` | >= 0 |" in text and "lean \\| hf \\| vllm" in text


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
