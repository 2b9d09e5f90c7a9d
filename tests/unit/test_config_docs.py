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
TASK_HEAD = """
# Task options

Each task's options (`--option KEY=VALUE` on train, eval and probe; a study's `task_options:`; `--set
task_options.KEY=VALUE`), generated from the task's options dataclass (`register_task(name, options=...)`,
`mechopd.tasks.base.task_options_docs`); `--help` of those verbs lists the same. A game's `engine=textarena` takes
the options of its own table instead.
"""


ORGANISM_HEAD = """
# Organism options

An embedded model organism's fields, generated from `mechopd.organisms.pretrain.OrganismConfig`; `mechopd pretrain`
takes {flags} (and the held-out check's `--n`), Python callers any field (`pretrain_organism(task, **fields)`).
"""
DEMO_HEAD = """
# Demo options

The demo's fields, generated from `mechopd.pipeline.demo.DemoConfig` (a null field takes the task's built-in study's
value); `mechopd demo` takes {flags}, Python callers any field (`DemoConfig(...)`).
"""


def _flags(facts, names) -> str:
    return ", ".join(f"`{f.flag}`" for f in facts if f.name in names)


def render() -> str:
    from mechopd.cli.study_cmd import DEMO_FLAGS
    from mechopd.cli.train_cmd import PRETRAIN_FIELDS
    from mechopd.config import TrainConfig
    from mechopd.core.options import docs_table, field_facts
    from mechopd.evaluation.config import EVAL_FACTS
    from mechopd.organisms.pretrain import OrganismConfig
    from mechopd.pipeline.demo import DemoConfig
    from mechopd.tasks.base import task_options_docs

    organism, demo = field_facts(OrganismConfig), field_facts(DemoConfig)
    return (
        HEAD
        + "\n"
        + docs_table(field_facts(TrainConfig))
        + EVAL_HEAD
        + "\n"
        + docs_table(EVAL_FACTS)
        + ORGANISM_HEAD.format(flags=_flags(organism, PRETRAIN_FIELDS))
        + "\n"
        + docs_table(organism, typed=True, sections=False)
        + DEMO_HEAD.format(flags=_flags(demo, DEMO_FLAGS))
        + "\n"
        + docs_table(demo, typed=True, sections=False)
        + TASK_HEAD
        + "\n"
        + task_options_docs()
    )


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


def test_the_organism_and_demo_fields_are_documented_with_their_flags():
    """pretrain's and demo's flags are generated from OrganismConfig / DemoConfig: the docs name them the same way."""
    from mechopd.core.options import field_facts
    from mechopd.organisms.pretrain import OrganismConfig
    from mechopd.pipeline.demo import DemoConfig

    text = render()
    for f in field_facts(OrganismConfig) + field_facts(DemoConfig):
        assert f"| `{f.name}` `" in text
    assert "| `num_layers` `--layers` | int | `3` | >= 1 and <= 48 |" in text
    assert "| `steps` `--steps` | int or null | `None` | >= 1 |" in text  # the demo's: null = the study's
    assert "`mechopd pretrain`\ntakes `--task`, `--arch`, `--layers`" in text


def test_every_task_option_is_documented() -> None:
    """Each registered task's options (and a game engine's) have a table row with their range: issue 56 item 2."""
    from mechopd.core.options import field_facts, limits
    from mechopd.tasks.base import option_sets

    text = render()
    labels = [label for label, _ in option_sets()]
    assert {"rules", "jsonl", "facts", "sokoban", "frozenlake", "sokoban engine=textarena"} <= set(labels)
    for label, cls in option_sets():
        assert f"## {label}\n" in text
        for f in field_facts(cls):
            assert f"| `{f.name}` `--option {f.name}=VALUE` |" in text and limits(f).replace("|", "\\|") in text
    assert "| `min_len` `--option min_len=VALUE` | int | `3` | >= 1 and <= 64 |" in text


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
