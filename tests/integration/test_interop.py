"""The two-view cosine through mechopd's hooks, TransformerLens and nnsight agree on an organism checkpoint; the
interactive notebook runs as a script and its .ipynb twin holds the same cells."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local checkpoints only (effective when hub modules load after this)

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config  # noqa: E402

from mechopd.core.errors import ModelError  # noqa: E402
from mechopd.models import atomic_save, load_model  # noqa: E402
from mechopd.organisms.tokenizer import build_tokenizer  # noqa: E402
from mechopd.probes.interop import to_nnsight, to_transformer_lens, two_view_cosine_nnsight, two_view_cosine_tl  # noqa: E402
from mechopd.probes.items import make_batches
from mechopd.probes.view_cosine import two_view_cosine
from mechopd.tasks.base import get_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "probes" / "interactive.py"
TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An organism checkpoint as the trainer writes it (atomic_save: safetensors + tokenizer)."""
    task = get_task("rules")
    tok = build_tokenizer(task.vocab())
    cfg = Qwen3Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=len(tok),
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    return atomic_save(AutoModelForCausalLM.from_config(cfg), tok, tmp_path_factory.mktemp("run") / "final")


@pytest.fixture(scope="module")
def items(checkpoint):
    from mechopd.models import load_tokenizer

    return make_batches(load_tokenizer(checkpoint), get_task("rules"), 5, 0, 3, load_model(checkpoint))


def assert_rows_agree(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    assert [r["site"] for r in a] == [r["site"] for r in b]
    for ra, rb in zip(a, b):
        for k in keys:
            assert abs(ra[k] - rb[k]) <= TOL, (ra["site"], k, ra[k], rb[k])


def test_three_backends_agree_on_an_organism_checkpoint(checkpoint, items):
    assert len({len(r) for r in items.responses}) > 1  # padded batches
    ours = two_view_cosine(load_model(checkpoint), items)
    tl = two_view_cosine_tl(to_transformer_lens(checkpoint), items)
    nn = two_view_cosine_nnsight(to_nnsight(checkpoint), items)
    assert [r["site"] for r in ours.rows] == ["embed", "layers.0.resid_post", "layers.1.resid_post", "final_norm"]
    assert min(r["cos_mean"] for r in ours.rows) < 0.999  # the views differ: agreement is not trivial
    for other in (tl, nn):
        assert_rows_agree(ours.rows, other.rows, ("cos_mean", "cos_median", "cos_example_mean"))
        assert_rows_agree(ours.example_rows, other.example_rows, ("cos_mean",))


def test_backends_take_the_same_layer_selection(checkpoint, items):
    layers = [-1, "embed"]
    ours = two_view_cosine(load_model(checkpoint), items, layers)
    nn = two_view_cosine_nnsight(to_nnsight(checkpoint), items, layers)
    assert [r["site"] for r in nn.rows] == ["embed", "layers.1.resid_post"]
    assert_rows_agree(ours.rows, nn.rows, ("cos_mean",))


def test_loaders_refuse_a_directory_without_a_checkpoint(tmp_path):
    for load in (to_transformer_lens, to_nnsight):
        with pytest.raises(ModelError, match="no config.json"):
            load(tmp_path)


def test_notebook_runs_as_a_script(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.pop("MECHOPD_CHECKPOINT", None)
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "cos_mean" in out and "KL(p_c || p_x)" in out and out.rstrip().endswith("done")
    recovered = re.findall(r"(\S+) +(resid|attn|mlp) +recovered ([-+]\d+\.\d+)", out)  # the patching probe's rows
    assert len(recovered) == 2 + 3 * 4 and recovered[-1] == ("final_norm", "resid", "+1.000")


def test_the_docs_bridge_example_runs_on_a_checkpoint(checkpoint, tmp_path):
    """docs/outputs.md's TransformerLens + nnsight example, as written, on a fixture checkpoint (CKPT replaced)."""
    text = (ROOT / "docs" / "outputs.md").read_text()
    code = text.split("## TransformerLens and nnsight", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'CKPT = "runs/demo/seed-0/train/nca/final"' in code
    script = tmp_path / "bridges.py"
    script.write_text(code.replace('"runs/demo/seed-0/train/nca/final"', repr(str(checkpoint))))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TL: layer-0 cosine at the last prompt token" in proc.stdout
    assert "equals TL: True" in proc.stdout, proc.stdout


def percent_cells(text: str) -> list[tuple[str, str]]:
    """A percent-format script as (cell_type, source) pairs; markdown cells lose their leading '# '."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = re.match(r"^# %%( \[markdown\])?\s*$", line)
        if m:
            cells.append(("markdown" if m.group(1) else "code", []))
        elif cells:
            kind, body = cells[-1]
            body.append(
                line[2:]
                if kind == "markdown" and line.startswith("# ")
                else ""
                if kind == "markdown" and line == "#"
                else line
            )
    return [(kind, "\n".join(body).strip("\n")) for kind, body in cells]


def percent_to_ipynb(text: str) -> dict:
    """The .ipynb (nbformat 4, no outputs) holding a percent-format script's cells."""
    cells = []
    for kind, src in percent_cells(text):
        lines = src.split("\n")
        cell = {"cell_type": kind, "metadata": {}, "source": [ln + "\n" for ln in lines[:-1]] + lines[-1:]}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    meta = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return {"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def test_notebook_takes_task_options(tmp_path):
    """`--option KEY=VALUE` reaches the task (#54: a JSONL task failed with "option 'path' is required"); here the
    rules task's distilled rule, which shows in every item's context."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.pop("MECHOPD_CHECKPOINT", None)
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK), "--option", "rule=reverse"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    contexts = re.findall(r"   c: '(.*)'", proc.stdout)
    assert contexts and all("reverse the items" in c for c in contexts), contexts


def test_ipynb_holds_the_same_cells_as_the_script():
    got = json.loads(NOTEBOOK.with_suffix(".ipynb").read_text())
    want = percent_to_ipynb(NOTEBOOK.read_text())
    assert [c["cell_type"] for c in got["cells"]] == [c["cell_type"] for c in want["cells"]]
    assert got == want, "probes/interactive.ipynb is stale: python tests/integration/test_interop.py --write-ipynb"
    assert sum(c["cell_type"] == "code" for c in got["cells"]) >= 5


if __name__ == "__main__" and sys.argv[1:] == ["--write-ipynb"]:
    NOTEBOOK.with_suffix(".ipynb").write_text(json.dumps(percent_to_ipynb(NOTEBOOK.read_text()), indent=1) + "\n")
