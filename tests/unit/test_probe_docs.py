"""docs/probes.md is generated from the probes' registrations (`python -m mechopd.probes.docs`) and up to date."""

from __future__ import annotations

from mechopd.probes import docs
from mechopd.probes.options import flags
from mechopd.probes.registry import probes


def test_docs_probes_md_is_up_to_date():
    assert docs.DOCS.read_text() == docs.markdown(), "docs/probes.md is stale: run python -m mechopd.probes.docs"


def test_every_flag_of_every_probe_is_documented():
    text = docs.markdown()
    for spec in probes():
        assert f"## `mechopd probe {spec.name}`" in text
        for flag in flags(spec.options):  # the flags the CLI adds, from the options dataclass
            assert f" `{flag}` |" in text, (spec.name, flag)  # the row's key / flag cell
