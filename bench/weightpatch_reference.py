"""Not a timing: `mechopd probe weightpatch`'s Acc_x and Acc_xc against an independent greedy decoder.

For the rows of ``RUN/probes/weightpatch.csv`` with the largest effects (|d_acc_x| + |d_harm|, the top ``--rows``, plus
the unpatched row), this script loads the model with transformers' ``AutoModelForCausalLM``, overwrites the row's
module group with the donor's tensors (its own name matching: ``self_attn.{q,k,v,o}_proj``, ``mlp.*``, the layer
norms; the random-row control ``ctrl_qk`` is skipped: its rows come from the probe's own draw), decodes both views of
every item of ``weightpatch_items.jsonl`` with ``model.generate(do_sample=False)`` one item at a time (no padding; the
saved prompt ids), and scores the reply with the task's own scorer. PASS when every compared value is within
``--tol`` (default 0.05) of the probe's.

    python bench/weightpatch_reference.py RUN_DIR [--model opd] [--rows 4] [--tol 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

GROUPS = {
    "q_proj": ("self_attn.q_proj",),
    "k_proj": ("self_attn.k_proj",),
    "v_proj": ("self_attn.v_proj",),
    "o_proj": ("self_attn.o_proj",),
    "qk": ("self_attn.q_proj", "self_attn.k_proj"),
    "vo": ("self_attn.v_proj", "self_attn.o_proj"),
    "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"),
}


def donor_state(donor: Path, layer: str, module: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(donor.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    keep = {}
    for name, t in sd.items():
        parts = name.split(".")
        if "layers" not in parts:
            continue
        i = parts[parts.index("layers") + 1]
        rest = ".".join(parts[parts.index("layers") + 2 : -1])
        if (layer == "all" or i == layer) and rest in GROUPS[module]:
            keep[name] = t
    return keep


def decode(model, tok, ids: list[int], max_new: int) -> str:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
        )
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechopd.probes.setup import ProbeSetup

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument("--model", default="opd")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tol", type=float, default=0.05)
    a = p.parse_args(argv)
    probes = Path(a.run) / "probes"
    doc = json.loads((probes / "weightpatch.json").read_text())
    settings = doc["settings"]
    import csv

    rows = [r for r in csv.DictReader(open(probes / "weightpatch.csv")) if r["model"] == a.model]
    effect = lambda r: abs(float(r["d_acc_x"] or 0)) + abs(float(r["d_harm"] or 0))  # noqa: E731
    top = [r for r in rows if r["layer"] == "none"] + sorted(
        (r for r in rows if r["layer"] != "none" and r["module"] in GROUPS), key=effect, reverse=True
    )[: a.rows]
    items = [json.loads(line) for line in (probes / "weightpatch_items.jsonl").read_text().splitlines()]
    setup = ProbeSetup.from_run(a.run)
    task = setup.make_task()
    examples = {e.uid: e for e in task.examples("test", len(items), settings["seed"])}
    path = Path(settings["model_paths"][a.model])
    tok = AutoTokenizer.from_pretrained(path)
    worst, lines = 0.0, []
    for r in top:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if r["layer"] != "none":
            missing = model.load_state_dict(
                donor_state(Path(settings["donor_path"]), r["layer"], r["module"]), strict=False
            ).unexpected_keys
            assert not missing, missing
        right = {"x": 0, "xc": 0}
        for rec in items:
            ex = examples[rec["uid"]]
            right["x"] += bool(task.score(ex, decode(model, tok, rec["prompt_ids_x"], task.max_new_tokens)))
            right["xc"] += bool(task.score(ex, decode(model, tok, rec["prompt_ids_c"], task.max_new_tokens)))
        ref = {k: v / len(items) for k, v in right.items()}
        diff = max(abs(ref["x"] - float(r["acc_x"])), abs(ref["xc"] - float(r["acc_xc"])))
        worst = max(worst, diff)
        lines.append(
            f"{r['layer']:>4}/{r['module']:<6} probe Acc_x {float(r['acc_x']):.3f} Acc_xc "
            f"{float(r['acc_xc']):.3f} | generate Acc_x {ref['x']:.3f} Acc_xc {ref['xc']:.3f} | "
            f"max |diff| {diff:.3f}"
        )
    print("\n".join(lines))
    ok = worst <= a.tol
    print(
        f"{'PASS' if ok else 'FAIL'}: max |difference| {worst:.3f} (tolerance {a.tol}) over {len(top)} rows, "
        f"{len(items)} items"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
