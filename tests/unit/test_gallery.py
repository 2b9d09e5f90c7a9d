"""The committed gallery says what the code writes (#54): ``python bench/gallery.py`` regenerates ``figures/`` and
records each sample report's verdict lines and a fingerprint of the verdict code in ``figures/gallery.json``. This
fails when a report's verdict lines differ from the record (edited by hand) or when that code changed since the
gallery was made (its verdicts may no longer be what the code writes): rerun ``python bench/gallery.py``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIX = "python bench/gallery.py (about 25 min on 2 cores) regenerates figures/ and figures/gallery.json"


def _gallery():
    spec = importlib.util.spec_from_file_location("gallery", ROOT / "bench" / "gallery.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_verdict_lines_are_read_from_a_report():
    g = _gallery()
    text = (
        "## Findings\n\n13 of 17 claims decided over 3 training seeds (...)\n\n- **Holds**: OPD causes (...)\n"
        "| OPD causes context-induced degradation | **holds** | OPD Harm 0.5 |\nplain line\n| table | not bold |\n"
    )
    assert g.verdict_lines(text) == text.splitlines()[2:3] + text.splitlines()[4:6]


def test_every_sample_report_is_in_the_gallery_script():
    g = _gallery()
    made = {t for _, files in g.GALLERY.values() for t in files}
    assert {p.name for p in (ROOT / "figures").glob("sample_report*.md")} <= made


def test_the_committed_gallery_says_what_the_code_writes():
    g = _gallery()
    record_path = ROOT / "figures" / "gallery.json"
    assert record_path.is_file(), f"figures/gallery.json is missing: {FIX}"
    record = json.loads(record_path.read_text())
    assert record["verdict_code_fingerprint"] == g.verdict_code_fingerprint(), (
        f"the code that writes verdicts changed since the gallery was made ({record['date']}): {FIX}"
    )
    for name, lines in record["verdict_lines"].items():
        assert g.verdict_lines((ROOT / "figures" / name).read_text()) == lines, f"figures/{name} was edited: {FIX}"
