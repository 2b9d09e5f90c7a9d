"""`mechopd explore` as an analysis page, in headless chromium: per item the prompt, context, target and every model's
generation in both views marked right / wrong with its Harm / Help outcome (equal to the eval CSVs), filters and sorts,
per-head attention (equal to attention.csv); a JSONL task whose prompts and contexts carry HTML / JS payloads, and
hand-written artifacts whose uids, model labels, other-context labels and token strings carry them, run no script."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.artifacts import read_csv
from tests.cli.test_explore import dump_dom

MARK = "data-pwned"
PAYLOADS = [
    f'<script>document.body.setAttribute("{MARK}","1")</script>',
    f'</script><script>document.body.setAttribute("{MARK}","2")</script>',
    "<!-- an open comment",
    f"<img src=x onerror=\"document.body.setAttribute('{MARK}','3')\">",
    "&lt;b&gt; entity & </textarea></pre>",
    f"\u2028 separator <svg onload=\"document.body.setAttribute('{MARK}','4')\">",
]


class Page(HTMLParser):
    """Every element's (tag, attributes), and the text inside each element that has a ``data-field`` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.fields: list[tuple[str, str]] = []
        self.errors = ""
        self._open: list[list] = []
        self._err = False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        self._err = a.get("id") == "errors"
        if "data-field" in a:
            self._open.append([a["data-field"], ""])

    def handle_endtag(self, tag):
        self._err = False
        if tag == "dd" and self._open:
            self.fields.append(tuple(self._open.pop()))

    def handle_data(self, data):
        if self._err:
            self.errors += data
        if self._open:
            self._open[-1][1] += data

    def all(self, **attrs) -> list[dict[str, str]]:
        return [a for _, a in self.elements if all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def load(page: Path, fragment: str = "") -> Page:
    text, log = dump_dom(page, fragment)
    p = Page()
    p.feed(text)
    assert p.errors.strip() == "", p.errors
    assert not [line for line in log.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "rror" in line)]
    body = next(a for t, a in p.elements if t == "body")
    assert body.get("data-ready") == "1" and MARK not in body
    assert not [a for t, a in p.elements if MARK in a or t in ("img", "svg") and "onload" in a]
    assert [t for t, _ in p.elements].count("script") == 2  # the page's data and its code; nothing from the data
    return p


@pytest.fixture(scope="module")
def payload_run(tmp_path_factory) -> Path:
    """Two zoo models (byte-level BPE, so token strings carry the payloads' pieces) on a JSONL task with payloads:
    `mechopd eval --compare` into RUN/eval, then the lens, patching and attention probes into RUN/probes."""
    from mechopd.testing.zoo import build_zoo

    zoo = build_zoo()
    root = tmp_path_factory.mktemp("explore_payloads")
    data = root / "qa.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"prompt": f"Q{i} {p} what?", "answer": f"A{i} <b>{i}</b>", "context": f"Rule {i}: {p} answer A{i}."}
            )
            + "\n"
            for i, p in enumerate(PAYLOADS)
        )
    )
    task = ["--task", "jsonl", "--option", f"path={data}", "--option", "test_fraction=0.99"]
    models = [f"base={zoo.student('qwen3')}", f"opd={zoo.teacher('qwen3')}"]
    run = root / "run"
    assert (
        main(["eval", "--compare", *models, *task, "--n", "6", "--max-new-tokens", "6", "--out", str(run / "eval")])
        == 0
    )
    for probe in ("lens", "patching", "attention"):
        assert (
            main(
                [
                    "probe",
                    probe,
                    "--models",
                    *models,
                    *task,
                    "--n",
                    "4",
                    "--max-new-tokens",
                    "5",
                    "--out",
                    str(run / "probes"),
                ]
            )
            == 0
        )
    assert main(["explore", str(run)]) == 0
    return run


def _flag(x: bool, xc: bool) -> str:
    return "Harm" if x and not xc else "Help" if xc and not x else "both wrong" if not x else "both right"


def test_items_texts_and_outcomes_equal_the_reports(payload_run):
    page = load(payload_run / "explore.html")
    recs = {m: read_csv(payload_run / "eval" / f"{m}.csv") for m in ("base", "opd")}
    uids = [r["uid"] for r in recs["base"]]
    items = page.all(**{"class": "item"})
    assert [a["data-uid"] for a in items] == uids and len(uids) >= 4
    rows = page.all(**{"class": "orow"})
    assert len(rows) == 2 * len(uids)
    for k, _uid in enumerate(uids):  # rows in item order, models in order: base, opd
        for j, m in enumerate(("base", "opd")):
            r, row = recs[m][k], rows[2 * k + j]
            x, xc = r["correct_x"] == "True", r["correct_xc"] == "True"
            assert row["data-model"] == m and row["data-correct-x"] == str(int(x))
            assert row["data-correct-xc"] == str(int(xc)) and row["data-flag"] == _flag(x, xc)
    # the item texts, shown as text: every payload appears verbatim in a prompt and a context
    fields = page.fields
    assert [v for f, v in fields if f == "prompt"] == [r["prompt"] for r in recs["base"]]
    assert [v for f, v in fields if f == "context"] == [r["context"] for r in recs["base"]]
    assert [v for f, v in fields if f == "target"] == [r["target"] for r in recs["base"]]
    assert {p for p in PAYLOADS if any(p in v for f, v in fields if f == "prompt")} >= set(PAYLOADS[:4])
    # the summary cells are the reports' values
    for m in ("base", "opd"):
        summary = json.loads((payload_run / "eval" / f"{m}.json").read_text())["summary"]
        row = next(
            i for i, (t, a) in enumerate(page.elements) if t == "tr" and a.get("data-model") == m and "class" not in a
        )
        end = next(
            i
            for i in range(row + 1, len(page.elements))
            if page.elements[i][0] in ("tr", "table", "div") and page.elements[i][1].get("class") != "ci"
        )
        cells = {a["data-key"]: a["data-value"] for t, a in page.elements[row + 1 : end] if "data-key" in a}
        for key in ("acc_x", "acc_xc", "help", "both_correct", "delta_len"):
            assert float(cells[key]) == summary[key]["value"]
        assert cells["harm"] == ("" if summary["harm"]["value"] is None else str(summary["harm"]["value"]))


def test_per_head_attention_equals_the_csv(payload_run):
    page = load(payload_run / "explore.html")
    rows = read_csv(payload_run / "probes" / "attention.csv")
    boxes = [i for i, (t, a) in enumerate(page.elements) if a.get("class") == "heatbox" and "data-model" in a]
    assert len(boxes) == 2
    values = []
    for b, end in zip(boxes, boxes[1:] + [len(page.elements)]):
        cells = [a["data-value"] for t, a in page.elements[b:end] if t == "td" and "data-value" in a]
        values += cells[: sum(1 for r in rows if r["model"] == page.elements[b][1]["data-model"])]
    assert [float(v) for v in values] == [float(r["context_share"]) for r in rows]
    # per item: a head x response-token table per layer and model (the probe saves ctx_heads)
    tokens = [json.loads(line) for line in (payload_run / "probes" / "attention_tokens.jsonl").read_text().splitlines()]
    assert all(set(t["ctx_heads"]) == set(t["ctx_share"]) for t in tokens)
    for t in tokens:  # the heads' mean is the per-layer share the probe always wrote
        for layer, per_token in t["ctx_heads"].items():
            assert [sum(h) / len(h) for h in per_token] == pytest.approx(t["ctx_share"][layer], abs=2e-5)
        assert t["ctx_tokens"] and all(len(h) == len(t["ctx_tokens"]) for k in t["ctx_keys"].values() for h in k)


def _counts(run: Path, flag: str, model: str) -> int:
    recs = {m: {r["uid"]: r for r in read_csv(run / "eval" / f"{m}.csv")} for m in ("base", "opd")}
    uids = list(recs["base"])
    ms = ("base", "opd") if model == "any" else (model,)
    return sum(
        any(_flag(recs[m][u]["correct_x"] == "True", recs[m][u]["correct_xc"] == "True") == flag for m in ms)
        for u in uids
    )


@pytest.mark.parametrize(
    "flag,name,model",
    [("both_wrong", "both wrong", "any"), ("harm", "Harm", "opd"), ("both_right", "both right", "base")],
)
def test_filter_by_outcome_and_model(payload_run, flag, name, model):
    page = load(payload_run / "explore.html", f"#filter={flag}&model={model}")
    box = next(a for _, a in page.elements if a.get("id") == "items")
    want = _counts(payload_run, name, model)
    assert box["data-shown"] == str(want)
    assert len(page.all(**{"class": "item"})) == want


def test_sort_by_output_kl(payload_run):
    page = load(payload_run / "explore.html", "#sort=kl&model=opd")
    recs = [json.loads(line) for line in (payload_run / "probes" / "lens_tokens.jsonl").read_text().splitlines()]
    kl = {r["uid"]: sum(r["kl"]["final_norm"]) / len(r["kl"]["final_norm"]) for r in recs if r["model"] == "opd"}
    shown = [a["data-uid"] for a in page.all(**{"class": "item"})]
    probed = [u for u in shown if u in kl]
    assert probed == sorted(kl, key=lambda u: -kl[u]) and shown[: len(probed)] == probed


def _hostile_artifacts(run: Path) -> None:
    """Artifacts written by hand: payloads in uids, a model label, other-context labels, tokens, context tokens."""
    (run / "eval").mkdir(parents=True)
    (run / "probes").mkdir()
    model = "<img src=x onerror=alert(1)>"
    recs = [
        {
            "uid": p,
            "sample": 0,
            "correct_x": i % 2 == 0,
            "correct_xc": i % 3 == 0,
            "response_x": p,
            "response_xc": "ok " + p,
            "prompt": p,
            "context": p,
            "target": p,
        }
        for i, p in enumerate(PAYLOADS)
    ]
    other = [{"uid": p, "sample": 0, "label": p, "response": p, "follow": True, "stick": False} for p in PAYLOADS]
    for m in ("base", model):
        (run / "eval" / f"{m}.json").write_text(
            json.dumps({"summary": {"acc_x": {"value": 0.5}}, "records": recs, "other_records": other})
        )
    toks = [PAYLOADS[0], "</script>", "<!--"]
    lens = [
        {
            "model": m,
            "item": i,
            "uid": p,
            "tokens": toks,
            "kl": {
                "embed": [0, 0, 0],
                "final_norm": [0.1, 0.2, 0.3] if i == 0 else [0.1 * ((i * 7 + k) % 5) for k in range(3)],
            },
            "top_x": [[[t, 0.5]] for t in toks],
            "top_c": [[[t, 0.5]] for t in toks],
        }
        for m in ("base", model)
        for i, p in enumerate(PAYLOADS)
    ]
    (run / "probes" / "lens_tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lens))
    attn = [
        {
            "model": r["model"],
            "item": r["item"],
            "uid": r["uid"],
            "ctx_share": {"0": [0.1, 0.2, 0.3]},
            "ctx_heads": {"0": [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]},
            "ctx_keys": {"0": [[0.05, 0.05], [0.1, 0.1]]},
            "ctx_tokens": ["<script>", "</script>"],
        }
        for r in lens
    ]
    (run / "probes" / "attention_tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in attn))


def test_payloads_in_uids_labels_and_tokens_run_no_script(tmp_path):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    assert main(["explore", str(run)]) == 0
    page = load(run / "explore.html")
    assert [a["data-uid"] for a in page.all(**{"class": "item"})] == PAYLOADS
    assert {a["data-model"] for a in page.all(**{"class": "orow"})} == {"base", "<img src=x onerror=alert(1)>"}
    assert len(page.all(**{"class": "tok"})) == 2 * len(PAYLOADS) * 3
    assert len([a for a in page.all(**{"class": "other"})]) == 2 * len(PAYLOADS)
    text = (run / "explore.html").read_text()
    blob = text.split('id="data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in blob and ">" not in blob  # nothing inside the data element can close it or open a comment


HAND = {"Harm": [2, 4], "Help": [3], "both wrong": [1, 5], "both right": [0]}  # i % 2 == 0 right without c, i % 3 with


@pytest.mark.parametrize(
    "flag,name", [("harm", "Harm"), ("help", "Help"), ("both_wrong", "both wrong"), ("differ", None)]
)
def test_filters_on_known_outcomes(tmp_path, flag, name):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    assert main(["explore", str(run)]) == 0
    page = load(run / "explore.html", f"#filter={flag}&model=base")
    want = HAND[name] if name else sorted(HAND["Harm"] + HAND["Help"])
    assert [a["data-uid"] for a in page.all(**{"class": "item"})] == [PAYLOADS[i] for i in want]
    rows = page.all(**{"class": "orow"})
    assert [r["data-flag"] for r in rows if r["data-model"] == "base"] == [
        next(k for k, v in HAND.items() if i in v) for i in want
    ]


def test_sort_by_kl_on_known_values(tmp_path):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    assert main(["explore", str(run)]) == 0
    page = load(run / "explore.html", "#sort=kl")
    kl = [0.2] + [sum(0.1 * ((i * 7 + k) % 5) for k in range(3)) / 3 for i in range(1, len(PAYLOADS))]
    want = sorted(range(len(PAYLOADS)), key=lambda i: (-round(kl[i], 9), i))
    assert [a["data-uid"] for a in page.all(**{"class": "item"})] == [PAYLOADS[i] for i in want]


def test_the_payload_check_sees_a_script_that_runs(tmp_path):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    page = run / "explore.html"
    assert main(["explore", str(run)]) == 0
    page.write_text(page.read_text().replace("</body>", PAYLOADS[3] + "</body>"))
    with pytest.raises(AssertionError):
        load(page)


def test_the_scripts_never_parse_data_as_html():
    from mechopd.report.explore import ASSETS

    for js in ASSETS.glob("*.js"):
        code = js.read_text()
        assert "innerHTML" not in code and "outerHTML" not in code and "insertAdjacentHTML" not in code
        assert "document.write" not in code and "eval(" not in code


def _one_line_error(capsys, argv: list[str], *words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize(
    "name,edit,words",
    [
        ("lens_tokens.jsonl", lambda t: t.replace("0.1,", "NaN,", 1), ("NaN",)),
        ("lens_tokens.jsonl", lambda t: t.replace("0.1,", "Infinity,", 1), ("Infinity",)),
        (
            "lens_tokens.jsonl",
            lambda t: t.replace('"kl": {', '"kl": [{', 1).replace('}, "top_x"', '}], "top_x"', 1),
            ("kl",),
        ),
        ("lens_tokens.jsonl", lambda t: t.replace('"tokens": [', '"tokens": [7, ', 1), ("tokens",)),
        (
            "lens_tokens.jsonl",
            lambda t: t.replace('"final_norm": [0.1, 0.2, 0.3]', '"final_norm": [0.1]', 1),
            ("final_norm",),
        ),
        ("attention_tokens.jsonl", lambda t: t.replace('"ctx_tokens": [', '"ctx_tokens": [1, ', 1), ("ctx_tokens",)),
        ("base.json", lambda t: t.replace('"correct_x": true', '"correct_x": "yes"', 1), ("correct_x",)),
        ("base.json", lambda t: t.replace('"records": [', '"records": [3, ', 1), ("record 1",)),
        ("base.json", lambda t: t.replace("0.5", "NaN", 1), ("NaN",)),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, capsys, name, edit, words):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    path = run / ("eval" if name.endswith(".json") else "probes") / name
    path.write_text(edit(path.read_text()))
    _one_line_error(capsys, ["explore", str(run)], str(path.name), *words)
    assert not (run / "explore.html").exists()


def test_non_utf8_missing_columns_and_bad_out(tmp_path, capsys):
    run = tmp_path / "run"
    _hostile_artifacts(run)
    lens = run / "probes" / "lens_tokens.jsonl"
    good = lens.read_bytes()
    lens.write_bytes(good.replace(b"</script>", b"\xff\xfe", 1))
    _one_line_error(capsys, ["explore", str(run)], "lens_tokens.jsonl", "UTF-8")
    lens.write_bytes(good)
    (run / "probes" / "lens.csv").write_text("model,site,kl_c_x\nbase,embed,0.0\n")
    _one_line_error(capsys, ["explore", str(run)], "lens.csv", "top1_agree")
    (run / "probes" / "lens.csv").unlink()
    (tmp_path / "somedir").mkdir()
    _one_line_error(capsys, ["explore", str(run), "--out", str(tmp_path / "somedir")], "is a directory")
    _one_line_error(capsys, ["explore", str(run), "--out", str(tmp_path / "page.txt")], ".html")
    _one_line_error(capsys, ["explore", str(tmp_path / "missing")], "not a directory")
    assert main(["explore", str(run), "--out", str(tmp_path / "page.html")]) == 0


def test_page_json_round_trips_and_hides_markup():
    from mechopd.report.explore import page_json

    data = {"s": "</script><!-- & \u2028 \u2029 <b>", "n": [1, 2.5]}
    blob = page_json(data)
    assert json.loads(blob) == data and not set("<>&\u2028\u2029") & set(blob)
