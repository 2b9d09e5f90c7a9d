"""Benchmark: the intervention probes against the bare forwards (and SVDs) they need, ratios in the same run.

Model and items: `bench/causal_probes.py`'s (a random-weight Qwen3, ``--hidden`` 256, ``--layers`` 4, 8/4 heads, the
rules tokenizer; N rules items in both views with random responses of 16..48 tokens), the batches built once.

  localization  mechopd.probes.localization.localize (own no-context view as donor, every residual site)
                vs  HF: one no-context forward with output_hidden_states + one context-view forward + one per site
                (plain forwards: the floor of the work; the ratio is the capture/edit overhead)
  attribution   mechopd.probes.attribution.attribute_batch (resid, attn, mlp, heads of every layer; one backward)
                vs  HF: one donor forward with output_hidden_states + one recipient forward and backward of the KL
                (the floor); the exact-patching ratio of the same call is printed too (the faithfulness cost)
  pmi           mechopd.probes.pmi.token_rows (teacher = student = the model)
                vs  HF: the four forwards it needs (teacher c and x, student x and c) and the log-softmaxes
  deltas --svd  mechopd.probes.delta_svd.geometry on every decoder matrix of two saved checkpoints (read included)
                vs  torch.linalg.svd of ΔW and of W0 on the same matrices already in memory
  weightpatch   mechopd.probes.weightpatch_plan.patched around evaluate_model for ``--rows`` rows
                vs  evaluate_model alone, as many times (the patch / restore and bootstrap overhead)

Timing: ``--repeats`` rounds, methods interleaved, median; printed ratio mechopd / reference and PASS when below the
target (2.0 for the forward-bound probes: hooks, float64 log-softmaxes and per-token rows are the probe; 1.5 for
weightpatch; deltas --svd 3.0: it also reads the checkpoints and computes the entry statistics).

    python bench/intervention_probes.py [--n 16] [--batch-size 8] [--repeats 3] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from causal_probes import build, items  # noqa: E402

TARGETS = {"localization": 2.0, "attribution": 2.0, "pmi": 2.0, "deltas_svd": 3.0, "weightpatch": 1.5}


def _kl(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    a, b = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    return ((a.exp() * (a - b)).sum(-1) * mask).sum()


def run_localization(model, batches, ctx):
    from mechopd.probes.capture import resolve_sites
    from mechopd.probes.localization import localize

    localize(model, batches, resolve_sites(model, None))


def ref_localization(model, batches, ctx):
    with torch.inference_mode():
        for b in batches:
            model(**b.view("x"), output_hidden_states=True, use_cache=False)
            for _ in range(1 + model.config.num_hidden_layers + 2):
                model(**b.view("c"), use_cache=False)


def run_attribution(model, batches, ctx):
    from mechopd.probes.attribution import Pair, attribute_batch, sites_of

    sites = sites_of(model, None, ("resid", "attn", "mlp", "head"))
    for b in batches:
        attribute_batch(Pair(model, "x", model, "c"), b, sites, 1.0, 0)


def ref_attribution(model, batches, ctx):
    for b in batches:
        with torch.inference_mode():
            lc = b.response_logits(model(**b.view("c"), output_hidden_states=True, use_cache=False).logits, "c")
        lx = b.response_logits(model(**b.view("x"), output_hidden_states=True, use_cache=False).logits, "x")
        _kl(lc.clone(), lx, b.response_mask).backward()
        model.zero_grad(set_to_none=True)


def run_exact(model, batches, ctx):
    from mechopd.probes.attribution import Pair, exact_batch, sites_of

    sites = sites_of(model, None, ("resid", "attn", "mlp", "head"))
    for b in batches:
        pair = Pair(model, "x", model, "c")
        a_d, a_r = ctx["acts"](pair, b, sites)
        exact_batch(pair, b, sites, 1.0, a_d, a_r)


def run_pmi(model, batches, ctx):
    from mechopd.probes.pmi import token_rows

    for b in batches:
        token_rows(model, model, b, 1.0, [True] * b.batch_size, [str(i) for i in range(b.batch_size)], ctx["tok"])


def ref_pmi(model, batches, ctx):
    with torch.inference_mode():
        for b in batches:
            for _ in range(2):
                for v in "cx":
                    torch.log_softmax(b.response_logits(model(**b.view(v), use_cache=False).logits, v).double(), -1)


def run_svd(model, batches, ctx):
    from mechopd.probes.delta_svd import svd_rows

    svd_rows(ctx["dirs"][0], {"moved": ctx["dirs"][1]})


def ref_svd(model, batches, ctx):
    for w0, w1 in ctx["mats"]:
        torch.linalg.svd((w1 - w0).double(), full_matrices=False)
        torch.linalg.svd(w0.double(), full_matrices=False)


def _acts(pair, b, sites):
    from mechopd.probes.attribution import _donor, hooked

    a_d, _ = _donor(pair, b, sites, 1.0)
    store: dict = {}
    with torch.inference_mode(), hooked(pair.recipient, sites, pair.start(b), b.response_ids.shape[1], store):
        pair.recipient(**b.view(pair.view_r), use_cache=False)
    return a_d, store


def setup_svd(model, tmp: Path):
    from mechopd.core.sites import ATTN_MODULES, MLP_MODULES

    model.save_pretrained(tmp / "base")
    moved = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    model.save_pretrained(tmp / "moved")
    mats = [
        (moved[n], p.detach().clone())
        for n, p in model.named_parameters()
        if n.split(".")[-2] in ATTN_MODULES + MLP_MODULES and p.dim() == 2
    ]
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(moved[n])
    return [str(tmp / "base"), str(tmp / "moved")], mats


def _evaluate(model, ctx):
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.tasks.base import get_task

    return evaluate_model(model, ctx["tok"], get_task("rules"), EvalConfig(n=ctx["n"], n_boot=1000))


def run_weightpatch(model, batches, ctx):
    from mechopd.probes.weightpatch import paired_deltas
    from mechopd.probes.weightpatch_plan import Donor, patched, plan_rows

    donor = Donor(ctx["dirs"][1])
    ref = None
    for row in plan_rows(model, ["all"], ["qk", "mlp"], 1, 0)[: ctx["rows"]]:
        with patched(model, donor, row):
            rep = _evaluate(model, ctx)
        ref = ref or rep
        paired_deltas(ref["records"], rep["records"], 1000, 0)


def ref_weightpatch(model, batches, ctx):
    for _ in range(ctx["rows"]):
        _evaluate(model, ctx)


PAIRS = {
    "weightpatch": (run_weightpatch, ref_weightpatch),
    "localization": (run_localization, ref_localization),
    "attribution": (run_attribution, ref_attribution),
    "attribution_exact": (run_exact, run_attribution),
    "pmi": (run_pmi, ref_pmi),
    "deltas_svd": (run_svd, ref_svd),
}


def timed_pair(name, model, pre, ctx, repeats):
    ours, ref = PAIRS[name]
    times: dict[str, list[float]] = {"mechopd": [], "ref": []}
    for r in range(repeats):
        for method in ["mechopd", "ref"] if r % 2 == 0 else ["ref", "mechopd"]:
            t0 = time.perf_counter()
            (ours if method == "mechopd" else ref)(model, pre, ctx)
            times[method].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=3, help="weightpatch rows (the unpatched one included)")
    a = p.parse_args(argv)
    model, tok = build(a.hidden, a.layers)
    make, _ = items(tok, a.n, a.batch_size)
    pre = list(make())
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        dirs, mats = setup_svd(model, Path(tmp))
        ctx = {"tok": tok, "dirs": dirs, "mats": mats, "acts": _acts, "n": a.n, "rows": a.rows}
        print(f"machine loaded (shared cores); n={a.n}, hidden={a.hidden}, layers={a.layers}, repeats={a.repeats}")
        for name in PAIRS:
            med = timed_pair(name, model, pre, ctx, a.repeats)
            ratio = med["mechopd"] / med["ref"]
            if name == "attribution_exact":
                print(
                    f"{name:>18}: exact patching {med['mechopd']:.3f} s / attribution {med['ref']:.3f} s = "
                    f"{ratio:.2f}x (how much attribution saves; no target)"
                )
                continue
            passed = ratio <= TARGETS[name]
            ok &= passed
            print(
                f"{name:>18}: mechopd {med['mechopd']:.3f} s, reference {med['ref']:.3f} s, ratio {ratio:.2f} "
                f"(target <= {TARGETS[name]}) {'PASS' if passed else 'FAIL'}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
