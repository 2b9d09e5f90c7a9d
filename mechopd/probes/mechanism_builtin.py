"""Registrations of the intervention probes (weightpatch, localization, attribution, pmi): flags, run adapters, demo
options, figures, summaries. Like `mechopd.probes.builtin`, this imports no probe or plotting module (callables as
strings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.probes.registry import Arg, FigureSpec, ProbeSpec, register_probe

MODELS = Arg(("--models",), dict(nargs="+", default=None, metavar="LABEL|NAME=DIR",
                                 help="trained models to patch (default: every trained model of the run)"))


def weightpatch(setup: Any, out: Path, *, models: list[str] | None, donor: str, layers: str | None, modules: str,
                draws: int, follow: bool, n_boot: int) -> list[str]:
    from mechopd.probes.weightpatch import WeightpatchSummary, run_weightpatch

    path = run_weightpatch(setup, out, models=models, donor=donor, layers=layers, modules=modules, draws=draws,
                           follow=follow, n_boot=n_boot)
    return [f"weightpatch table: {path}"] + WeightpatchSummary.load(out).lines()


register_probe(ProbeSpec(
    "weightpatch", "revert (or transplant) weights per layer x module group to a donor's, re-evaluate both views",
    weightpatch,
    arguments=(
        MODELS,
        Arg(("--donor",), dict(default="base", help="whose weights go in: a label of the run (base, nca, ...) or a "
                                                    "checkpoint dir (default base: revert to W0)")),
        Arg(("--layers",), dict(default=None, help="comma-separated decoder layers and/or 'all' (default: every "
                                                   "layer, then all)")),
        Arg(("--modules",), dict(default="q_proj,k_proj,v_proj,o_proj,qk,vo,attn,mlp,norms,ctrl_qk",
                                 help="module groups: q_proj,k_proj,v_proj,o_proj, qk, vo, attn (all four), mlp "
                                      "(gate/up/down), norms, ctrl_qk (random rows of v/o/gate/up/down with q+k's "
                                      "parameter count: the matched control)")),
        Arg(("--control-draws",), dict(dest="draws", type=int, default=3, help="draws of ctrl_qk (default 3)")),
        Arg(("--follow",), dict(action="store_true", help="also follow_other per row (the task's other contexts; "
                                                          "one more generation per item and context)")),
        Arg(("--n-boot",), dict(dest="n_boot", type=int, default=1000, help="paired bootstrap resamples")),
    ),
    outputs=("weightpatch.csv", "weightpatch.json", "weightpatch_items.jsonl"),
    demo={"models": ["opd"], "donor": "base", "layers": "all", "modules": "qk,vo,attn,mlp,ctrl_qk"},
    role_options=("models", "donor"), summary="mechopd.probes.weightpatch:WeightpatchSummary",
    figures=(FigureSpec(
        "weightpatch", "Weight patching: Acc_x and Harm by layer and module group",
        "Each trained model with one module group of one decoder layer (row 'all': of every layer) reverted to the "
        "donor's weights (default: the base W0), both views decoded greedily on the same held-out items. Left: "
        "Acc_x (a drop: the group carries internalised rule); right: Harm (a drop: the group carries the harm). "
        "ctrl_qk: random rows of the other matrices with q_proj+k_proj's parameter count (mean over draws); the "
        "top row is the unpatched model.", "mechopd.plots.interventions:plot_weightpatch"),),
))


def localization(setup: Any, out: Path, *, model: str | None, donor: str, layers: str | None, removed_share: float,
                 n_boot: int) -> list[str]:
    from mechopd.probes.causal_builtin import _list
    from mechopd.probes.localization import LocalizationSummary, run_localization

    path = run_localization(setup, out, model=model, donor=donor, layers=_list(layers, "--layers"),
                            removed_share=removed_share, n_boot=n_boot)
    return [f"localization table: {path}"] + LocalizationSummary.load(out).lines()


register_probe(ProbeSpec(
    "localization", "the depth at which a donor's residual removes the harm from the context view", localization,
    arguments=(
        Arg(("--model",), dict(default=None, help="the model whose harm is localized: a label or dir (default: the "
                                                  "first trained model)")),
        Arg(("--donor",), dict(default="x", help="x: the model's own no-context view (default), or a label / dir "
                                                 "whose context view is the donor (e.g. nca)")),
        Arg(("--layers",), dict(default=None, help="comma-separated decoder layers or site names (default: every "
                                                   "residual site)")),
        Arg(("--removed-share",), dict(dest="removed_share", type=float, default=0.9,
                                       help="share of the harm a site must remove to count (default 0.9)")),
        Arg(("--n-boot",), dict(dest="n_boot", type=int, default=1000, help="item bootstrap resamples")),
    ),
    outputs=("localization.csv", "localization.json", "localization_items.jsonl"),
    demo={"model": "opd", "donor": "x"}, role_options=("model",),
    summary="mechopd.probes.localization:LocalizationSummary",
    figures=(FigureSpec(
        "localization", "Localization: Harm after patching the donor's residual, by depth",
        "The model's context view fed its own correct no-context reply, the residual stream at one site replaced at "
        "every response position by the donor's (its own no-context view, or another model's context view); "
        "teacher-forced Harm = share of the items right without c whose greedy choice leaves the reply, with its "
        "95 % item-bootstrap interval; dashed: unpatched.", "mechopd.plots.interventions:plot_localization"),),
))


def attribution(setup: Any, out: Path, *, models: list[str] | None, cross: str | None, layers: str | None,
                components: str, ig_steps: int, no_exact: bool, greedy: bool) -> list[str]:
    from mechopd.probes.attribution_run import AttributionSummary, run_attribution
    from mechopd.probes.causal_builtin import _cross, _list

    comps = _list(components, "--components") or []
    path = run_attribution(setup, out, models=models, cross=_cross(cross), layers=_list(layers, "--layers"),
                           components=comps, ig_steps=ig_steps, exact=not no_exact, greedy=greedy)
    return [f"attribution table: {path}"] + AttributionSummary.load(out).lines()


register_probe(ProbeSpec(
    "attribution", "attribution patching (gradient x activation difference) per layer x component x head x position, "
    "with its faithfulness against exact patching", attribution,
    arguments=(
        Arg(("--models",), dict(nargs="+", default=None, metavar="LABEL|NAME=DIR",
                                help="models whose c→x pair is attributed (default: every model of the run but the "
                                     "teacher)")),
        Arg(("--cross",), dict(default=None, metavar="DONOR,RECIPIENT",
                               help="also DONOR's context view into RECIPIENT's, e.g. nca,opd")),
        Arg(("--layers",), dict(default=None, help="comma-separated decoder layers (default: all)")),
        Arg(("--components",), dict(default="resid,attn,mlp,head", help="comma-separated of resid,attn,mlp,head "
                                                                        "(head: o_proj's input, per query head)")),
        Arg(("--ig-steps",), dict(dest="ig_steps", type=int, default=0,
                                  help="integrated-gradient steps per site (default 0: plain attribution patching)")),
        Arg(("--no-exact",), dict(dest="no_exact", action="store_true",
                                  help="skip exact patching (no faithfulness record)")),
        Arg(("--greedy",), dict(action="store_true", help="argmax responses instead of sampled ones")),
    ),
    outputs=("attribution.csv", "attribution.json", "attribution_items.jsonl"),
    demo=None,  # on demand (`mechopd probe attribution --run RUN`): the demo's 5-minute budget has no room for it
    role_options=("models",), summary="mechopd.probes.attribution_run:AttributionSummary",
    figures=(FigureSpec(
        "attribution", "Attribution patching by layer, component and head",
        "Estimated recovered share of the output KL between the views (c→x) when one site's activation at every "
        "scored position takes the context view's value: −(a_c − a_x)·∂KL/∂a / KL, per decoder layer and component "
        "(resid, attn, mlp) and per query head (o_proj's input); the panel title gives its Pearson correlation with "
        "exact patching on the same sites.", "mechopd.plots.interventions:plot_attribution"),),
))


def pmi(setup: Any, out: Path, *, student: str | None, teacher: str | None, sampled: bool) -> list[str]:
    from mechopd.probes.pmi import PmiSummary, run_pmi

    path = run_pmi(setup, out, student=student, teacher=teacher, sampled=sampled)
    return [f"pmi table: {path}"] + PmiSummary.load(out).lines()


register_probe(ProbeSpec(
    "pmi", "the teacher's pointwise mutual information with the context per response token, against the OPD loss, "
    "D^L / C and the tokens that flip under Harm", pmi,
    arguments=(
        Arg(("--student",), dict(default=None, help="the trained student: a label or dir (default: first trained)")),
        Arg(("--teacher",), dict(default=None, help="the teacher: a label or dir (default: the run's teacher, else "
                                                    "base)")),
        Arg(("--sampled",), dict(action="store_true", help="sampled replies (the training temperature) instead of "
                                                           "greedy ones")),
    ),
    outputs=("pmi_tokens.csv", "pmi.json", "pmi_items.jsonl"),
    demo=None,  # on demand (`mechopd probe pmi --run RUN`): the demo's 5-minute budget has no room for it
    role_options=("student",), summary="mechopd.probes.pmi:PmiSummary",
    figures=(FigureSpec(
        "pmi", "The teacher's pointwise mutual information with the context",
        "Per response token of the trained student's reply: the teacher's log f(y|c,x) − log f(y|x) against the OPD "
        "loss KL(q_x ‖ f_c) at that token; red: the token where the context view of a student right without c first "
        "leaves its reply (Harm's token).", "mechopd.plots.interventions:plot_pmi"),),
))
