"""`mechopd probe attribution`: the pairs, the tables, the faithfulness record and the typed summary
(the quantities: `mechopd.probes.attribution`).

Files: ``attribution.csv`` (`COLUMNS`; one row per model, pair, site, head and response position, and a row with
``position = all`` per site and head that carries the exact patch's ``recovered_exact`` when ``exact`` ran),
``attribution_items.jsonl`` (the runner's items: uid, prompt ids of both views, response ids) and ``attribution.json``
(settings; summary: per pair ``m_clean``, the top sites, and ``faithfulness``: Pearson / Spearman of recovered_attr
against recovered_exact over the shared sites, all and per component, with the seconds of each method and
``cost_ratio`` = attribution seconds / exact seconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import read_float, write_csv
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE0, option
from mechopd.probes import causal_items as ci
from mechopd.probes.attribution import COMPONENTS, Pair, accumulate, correlations, sites_of
from mechopd.probes.options import Role, greedy_option, models_option, normalise, site_list
from mechopd.probes.options import cross as two_models
from mechopd.probes.registry import ProbeSpec, register_probe

COLUMNS = (
    "model",
    "pair",
    "site",
    "layer",
    "component",
    "head",
    "position",
    "attribution",
    "recovered_attr",
    "recovered_exact",
    "m_clean",
    "n_items",
    "n_tokens",
)


def table(label: str, pair: str, acc: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of one pair from `accumulate`'s sums: per position, then ``all`` per (site, head)."""
    m0 = acc["m_clean"]
    rec = lambda v: -v / m0 if m0 > 0 else None  # noqa: E731  (recovered = −ΔM / M_clean)
    common = {"model": label, "pair": pair, "m_clean": m0, "n_items": acc["n_items"], "n_tokens": acc["n_tokens"]}
    rows: list[dict[str, Any]] = []
    totals: dict[Any, float] = {}
    for (site, head, t), v in acc["attr"].items():
        key = (site, head)
        totals[key] = totals.get(key, 0.0) + v
        rows.append(
            {
                **common,
                "site": site.name,
                "layer": site.layer,
                "component": site.component,
                "head": "" if head is None else head,
                "position": t,
                "attribution": v,
                "recovered_attr": rec(v),
                "recovered_exact": None,
            }
        )
    for (site, head), v in totals.items():
        exact = acc["patched"].get((site, head))
        rows.append(
            {
                **common,
                "site": site.name,
                "layer": site.layer,
                "component": site.component,
                "head": "" if head is None else head,
                "position": "all",
                "attribution": v,
                "recovered_attr": rec(v),
                "recovered_exact": None if exact is None or m0 <= 0 else 1 - exact / m0,
            }
        )
    return rows


def faithfulness(rows: Sequence[Mapping[str, Any]], acc: dict[str, Any]) -> dict[str, Any]:
    """Correlations over the ``all`` rows holding both numbers, over all sites and per component; the cost."""
    both = [
        r
        for r in rows
        if r["position"] == "all" and r["recovered_exact"] is not None and r["recovered_attr"] is not None
    ]
    out: dict[str, Any] = {
        "all": correlations([r["recovered_attr"] for r in both], [r["recovered_exact"] for r in both])
    }
    for comp in COMPONENTS:
        mine = [r for r in both if r["component"] == comp]
        if mine:
            out[comp] = correlations([r["recovered_attr"] for r in mine], [r["recovered_exact"] for r in mine])
    ta, te = acc["seconds_attribution"], acc["seconds_exact"]
    out.update(seconds_attribution=ta, seconds_exact=te, cost_ratio=ta / te if te > 0 else None, sites=len(both))
    return out


def _top(rows: Sequence[Mapping[str, Any]], k: int = 3) -> list[dict[str, Any]]:
    alls = sorted(
        (r for r in rows if r["position"] == "all" and r["recovered_attr"] is not None),
        key=lambda r: -abs(r["recovered_attr"]),
    )
    return [
        {
            "site": r["site"],
            "component": r["component"],
            "head": r["head"],
            "recovered_attr": r["recovered_attr"],
            "recovered_exact": r["recovered_exact"],
        }
        for r in alls[:k]
    ]


def _pairs(run, label: str, cross: tuple[str, str] | None) -> list[tuple[str, str, Pair]]:
    """(recipient label, pair name, Pair): the view pair c → x of ``label``; with cross (A, B) also A's context
    view into B's."""
    model = run.load(label)
    out = [(label, "c_to_x", Pair(model, "x", model, "c"))]
    if cross is not None and label == cross[1]:
        out.append((label, f"{cross[0]}->{cross[1]}", Pair(model, "c", run.load(cross[0]), "c")))
    return out


@dataclass(frozen=True)
class AttributionOptions:
    """`mechopd probe attribution`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option(
        "models whose c→x pair is attributed (default: every model of the run but the teacher)"
    )
    cross: Sequence[str] | None = option(
        None, "also DONOR's context view into RECIPIENT's, e.g. nca,opd", metavar="DONOR,RECIPIENT"
    )
    layers: Sequence[int] | None = option(None, "comma-separated decoder layers (default: all)")
    components: Sequence[str] = option(
        COMPONENTS, "comma-separated of resid,attn,mlp,head (head: o_proj's input, per query head)"
    )
    ig_steps: int = option(0, "integrated-gradient steps per site (0: plain attribution patching)", range=GE0)
    no_exact: bool = option(False, "skip exact patching (no faithfulness record)")
    greedy: bool = greedy_option()

    def __post_init__(self) -> None:  # the lists' syntax before any model loads; "nca,opd" -> ("nca", "opd")
        normalise(self, cross=two_models, layers=site_list, components=site_list)


def run_attribution(
    setup: Any, out_dir: str | Path, opts: AttributionOptions | None = None, *, device: str | None = None
) -> list[str]:
    """Every model's c → x pair (and ``opts.cross``); writes attribution.csv / .json / _items.jsonl; returns the
    lines `mechopd probe attribution` prints (``opts.no_exact``: no exact patching, so no faithfulness record)."""
    opts = opts or AttributionOptions()
    cross = None if opts.cross is None else (opts.cross[0], opts.cross[1])
    ig_steps, exact, components, greedy = opts.ig_steps, not opts.no_exact, opts.components, opts.greedy
    if ig_steps < 0:
        raise ConfigError(f"--ig-steps {ig_steps} must be >= 0 (0: plain attribution patching)")
    picked = setup.pick(opts.models, [k for k in setup.models if k != "teacher"])
    if cross is not None:
        missing = [c for c in cross if c not in picked and c not in setup.models]
        if missing:
            raise ConfigError(
                f"--cross {','.join(cross)}: {missing[0]!r} is not a model of the run ({', '.join(setup.models)})"
            )
        picked = {**picked, **{c: setup.models.get(c, picked.get(c)) for c in cross}}
    run = ci.resolve(setup, picked, probe="attribution", out=out_dir, greedy=greedy, device=device)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"pairs": {}}
    for label in picked:
        for recipient, name, pair in _pairs(run, label, cross):
            sites = sites_of(pair.recipient, opts.layers, components)
            acc = accumulate(pair, run.items, sites, run.temperature, ig_steps, exact)
            mine = table(recipient, name, acc)
            rows += mine
            summary["pairs"][f"{recipient}:{name}"] = {
                "model": recipient,
                "pair": name,
                "m_clean": acc["m_clean"],
                "top": _top(mine),
                "faithfulness": faithfulness(mine, acc),
            }
    first = next(iter(summary["pairs"].values()))
    summary["faithfulness"] = first["faithfulness"]  # the first model's c → x: the headline record
    out = Path(out_dir)
    write_csv(out / "attribution.csv", rows, COLUMNS)
    ci.save(
        out,
        "attribution",
        run,
        run.settings(
            cross=list(cross) if cross else None,
            ig_steps=ig_steps,
            exact=exact,
            components=list(components),
            greedy=greedy,
        ),
        summary,
    )
    return [f"attribution table: {out / 'attribution.csv'}"] + AttributionSummary.load(out).lines()


def _f(v: Any, spec: str = ".2f") -> str:
    x = read_float(v) if isinstance(v, str) else v
    return "n/a" if x is None or x != x else format(x, spec)


class AttributionSummary(ci.CausalSummary):
    """The attribution result: ``faithfulness(pair_key)`` and the report's ``lines()``."""

    PROBE = "attribution"

    def faithfulness(self, key: str | None = None) -> dict[str, Any]:
        return self.summary["faithfulness"] if key is None else self.summary["pairs"][key]["faithfulness"]

    def lines(self) -> list[str]:
        out = []
        for p in self.summary["pairs"].values():
            f = p["faithfulness"]
            a = f.get("all", {})
            low = a.get("pearson") is not None and a["pearson"] < 0.5
            top = ", ".join(_site(t) for t in p["top"])
            out.append(
                f"- **Attribution patching** {p['model']} {p['pair']} (`probes/attribution.csv`): top sites "
                f"{top or 'none'}; faithfulness against exact patching on {f.get('sites', 0)} sites: Pearson "
                f"{_f(a.get('pearson'))}, Spearman {_f(a.get('spearman'))}"
                + (" — LOW: read the attribution as a ranking hint, not an effect size" if low else "")
                + f"; cost {_f(f.get('cost_ratio'))} × exact patching's"
            )
        return out


def _site(t: Mapping[str, Any]) -> str:
    return t["site"] + ("" if t["head"] in ("", None) else f" head {t['head']}")


register_probe(
    ProbeSpec(
        "attribution",
        "attribution patching (gradient x activation difference) per layer x component x head x position, "
        "with its faithfulness against exact patching",
        run_attribution,
        options=AttributionOptions,
        order=110,
        outputs=("attribution.csv", "attribution.json", "attribution_items.jsonl"),
        demo=None,  # on demand (`mechopd probe attribution --run RUN`): the demo's 5-minute budget has no room for it
        role_options=("models",),
        summary=AttributionSummary,
    )
)
