"""Labels before and after a change: `python bench/label_parity.py REV` compares `pipeline.stages.method_label` at git
revision REV with the working tree's, over every run a study, a training recipe or the demo defines, plus edge cases
(each with and without a kept fraction); prints every difference and the distinct labels."""

import dataclasses
import glob
import itertools
import subprocess
import sys

import yaml

from mechopd.config import TrainConfig
from mechopd.pipeline.demo import DemoConfig
from mechopd.pipeline.stages import method_label as new

old_src = subprocess.run(
    ["git", "show", sys.argv[1] + ":mechopd/pipeline/stages.py"], capture_output=True, text=True
).stdout
a, b = old_src.index("def method_label("), old_src.index("def labels_for(")
ns = {"TrainConfig": TrainConfig, "Any": object}
exec("from typing import Any\n" + old_src[a:b], ns)
old = ns["method_label"]

cases = []
for f in sorted(glob.glob("mechopd/data/studies/*.yaml") + glob.glob("training/studies/*.yaml")):
    doc = yaml.safe_load(open(f))
    for name, over in (doc.get("runs") or {}).items():
        cases.append((f"{f}:{name}", name, dict(over or {})))

for task, fast in itertools.product(("rules", "frozenlake", "sokoban"), (False, True)):
    for name, over in DemoConfig(task=task, fast=fast, workers=1).methods().items():
        cases.append((f"demo {task} fast={fast}:{name}", name, over))
for f in sorted(glob.glob("training/**/*.yaml", recursive=True)):
    doc = yaml.safe_load(open(f))
    if isinstance(doc, dict) and "runs" not in doc:
        cases.append((f, doc.get("method", "x"), {k: v for k, v in doc.items() if not isinstance(v, dict)}))
full = {
    f.name: getattr(TrainConfig, f.name)
    for f in dataclasses.fields(TrainConfig)
    if not callable(getattr(TrainConfig, f.name, None)) and hasattr(TrainConfig, f.name)
}
edge = [
    {},
    {"method": "nca"},
    {"method": "nca", "beta": 0.25},
    {"method": "opd", "selector": "ta_opd", "budget": 0.2},
    {"method": "opd", "selector": "ta_opd", "budget": 0.1, "k": 16},
    {"method": "nca", "nca_gate": 0.1, "follow_weight": 0.5},
    {"method": "nca", "nca_start": 0},
    {"method": "opd", "lora_rank": 8},
    {"method": "nca", "lora_rank": 4, "nca_start": 5},
    {"method": "nca", "selector": "ta_opd", "budget": 0.1},
    {"method": "dual_opd"},
    {"method": "sym_kl", "beta": 0.3},
    {**full, "method": "nca"},
    {**full, "method": "opd", "selector": "ta_opd"},
]
for i, over in enumerate(edge):
    cases.append((f"edge {i}", "opd" if i % 2 else "mine", over))
n_same = 0
for where, name, over in cases:
    for kept in (None, 0.1234):
        o, n = old(name, over, kept), new(name, over, kept)
        if o != n:
            print("DIFF", where, repr(o), repr(n))
        else:
            n_same += 1
labels = sorted({old(name, over, None) for _, name, over in cases})
print(f"{n_same} of {2 * len(cases)} (run, kept) cases identical; {len(labels)} distinct labels:")
for text in labels:
    print("  ", text)
