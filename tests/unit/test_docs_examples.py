"""The docs' code examples run as written (#54): the TransformerLens / nnsight example of docs/outputs.md (several
layers saved inside one trace too), on a small organism in place of the demo's checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_block(page: Path, heading: str) -> str:
    text = page.read_text()
    m = re.search(rf"## {re.escape(heading)}.*?```python\n(.*?)```", text, flags=re.DOTALL)
    assert m, f"{page}: no python block under '## {heading}'"
    return m.group(1)


def test_the_interop_example_runs_as_written(tiny_rules_organism, tmp_path):
    code = _python_block(ROOT / "docs" / "outputs.md", "TransformerLens and nnsight")
    demo = 'CKPT = "runs/demo/seed-0/train/nca/final"'
    assert demo in code
    script = tmp_path / "example.py"  # a file: nnsight reads the trace's source back
    script.write_text(code.replace(demo, f"CKPT = {str(tiny_rules_organism)!r}"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "equals TL: True" in proc.stdout
    norms = re.search(r"norm per layer \[(.*)\]", proc.stdout)
    assert norms and len(norms.group(1).split(",")) >= 2, proc.stdout
