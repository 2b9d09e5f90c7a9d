"""`mechopd explore RUN_DIR` in a real headless browser (Debian's chromium; `.ci/run` installs it when absent): the page
loads without script or console errors, shows every item for every model, and its numbers equal the probes' files."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.artifacts import read_csv

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        f"no headless browser on PATH (looked for {', '.join(BROWSERS)}); `apt-get install chromium` "
        "(.ci/run does it when absent)"
    )


def dump_dom(page: Path, fragment: str = "") -> tuple[str, str]:
    """(the DOM after the page's scripts ran, chromium's stderr with the console messages)."""
    cmd = [
        browser(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.resolve().as_uri() + fragment,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


class Dom(HTMLParser):
    """The attributes of every element, and the text of #errors."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.errors, self._in_errors = "", False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        self._in_errors = a.get("id") == "errors"

    def handle_endtag(self, tag):
        self._in_errors = False

    def handle_data(self, data):
        if self._in_errors:
            self.errors += data


def parse(text: str) -> Dom:
    d = Dom()
    d.feed(text)
    return d


@pytest.fixture(scope="module")
def run_dir(organism_tokenizer, tmp_path_factory) -> Path:
    """Random tiny models (their views differ a lot): lens, patching and attention through the CLI."""
    from tests.conftest import tiny_model

    root = tmp_path_factory.mktemp("explore")
    flags = []
    for label, seed in (("base", 0), ("opd", 1), ("nca", 2)):
        model = tiny_model(organism_tokenizer, layers=2, seed=seed)
        model.save_pretrained(root / label)
        organism_tokenizer.save_pretrained(root / label)
        flags.append(f"{label}={root / label}")
    common = [
        "--models",
        *flags,
        "--n",
        "5",
        "--batch-size",
        "3",
        "--max-new-tokens",
        "5",
        "--out",
        str(root / "run" / "probes"),
    ]
    for probe in ("lens", "patching", "attention"):
        assert main(["probe", probe, *common]) == 0
    return root / "run"


def test_explorer_page_in_a_headless_browser(run_dir):
    assert main(["explore", str(run_dir)]) == 0
    page = run_dir / "explore.html"
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    assert page.stat().st_size < 600_000
    dom_text, log = dump_dom(page)
    dom = parse(dom_text)
    assert dom.errors.strip() == ""
    assert not [line for line in log.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "rror" in line)]
    body = next(a for t, a in dom.elements if t == "body")
    assert body.get("data-ready") == "1"
    tokens = [json.loads(line) for line in (run_dir / "probes" / "lens_tokens.jsonl").read_text().splitlines()]
    items = [a for t, a in dom.elements if a.get("class") == "item"]
    assert len(items) == 5 and [a["data-item"] for a in items] == [str(i) for i in range(5)]
    # every token of every (item, model) with the output KL of lens_tokens.jsonl, in order
    shown = [float(a["data-kl"]) for t, a in dom.elements if a.get("class") == "tok"]
    order = {m: i for i, m in enumerate(["base", "opd", "nca"])}
    want = [v for rec in sorted(tokens, key=lambda r: (r["item"], order[r["model"]])) for v in rec["kl"]["final_norm"]]
    assert shown == want and len(tokens) == 15
    # the tables' numbers are the CSVs' (lens: kl_c_x and top1_agree; patching c_to_x: recovered; attention: share)
    for name, col in (
        ("lens", "kl_c_x"),
        ("lens", "top1_agree"),
        ("patching", "recovered"),
        ("attention", "context_share"),
    ):
        rows = read_csv(run_dir / "probes" / f"{name}.csv")
        if name == "patching":
            rows = [r for r in rows if r["direction"] == "c_to_x" and r["window"] == "all"]
        cells = [a["data-value"] for t, a in dom.elements if t == "td" and a.get("data-col") == col]
        assert cells == [r[col] for r in rows] and cells
    lens = read_csv(run_dir / "probes" / "lens.csv")
    out = {r["model"]: float(r["kl_c_x"]) for r in lens if r["site"] == "final_norm"}
    for m in out:  # the per-token values average to the table's output KL (every item is a detail item here)
        vals = [v for rec in tokens if rec["model"] == m for v in rec["kl"]["final_norm"]]
        assert sum(vals) / len(vals) == pytest.approx(out[m], rel=1e-4)


def test_colouring_by_a_patched_site(run_dir):
    from mechopd.report.explore import collect

    assert main(["explore", str(run_dir)]) == 0
    data = collect(run_dir / "probes")
    k = 1 + (len(data["sites"]) - 1)  # after the output and the lens sites but final_norm: the first patched site
    dom_text, _ = dump_dom(run_dir / "explore.html", f"#colour={k}")
    assert parse(dom_text).errors.strip() == ""
    assert "tokens coloured by KL after patching c→x at embed" in dom_text and 'data-ready="1"' in dom_text


def test_the_error_hook_catches_a_script_error(run_dir, tmp_path):
    from mechopd.report.explore import write_explorer

    page = write_explorer(run_dir, tmp_path / "broken.html")
    page.write_text(page.read_text().replace("</body>", "<script>null.boom();</script></body>"))
    dom = parse(dump_dom(page)[0])
    assert "error:" in dom.errors


def test_explore_refuses_a_run_without_the_lens(tmp_path, capsys):
    assert main(["explore", str(tmp_path)]) == 2
    assert "mechopd probe lens" in capsys.readouterr().err


def test_screenshot_for_the_gallery(run_dir, tmp_path):
    page = run_dir / "explore.html"
    if not page.is_file():
        main(["explore", str(run_dir)])
    shot = tmp_path / "explorer.png"
    subprocess.run(
        [
            browser(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,900",
            f"--screenshot={shot}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        timeout=180,
        check=True,
    )
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_item_fragment_shows_opens_and_marks_the_item(run_dir):
    """``explore.html#item-3`` (the reports' links): item 3 is the target, every panel of it open, no other marked."""
    assert main(["explore", str(run_dir)]) == 0
    plain = parse(dump_dom(run_dir / "explore.html")[0]).elements
    dom = parse(dump_dom(run_dir / "explore.html", "#item-3")[0])
    assert dom.errors.strip() == ""
    assert next(a for t, a in dom.elements if t == "body").get("data-target") == "3"
    assert [a["id"] for t, a in dom.elements if "target" in a.get("class", "").split()] == ["item-3"]
    start = next(k for k, (t, a) in enumerate(dom.elements) if a.get("id") == "item-3")
    end = next(k for k, (t, a) in enumerate(dom.elements) if a.get("id") == "item-4")
    inside = [a for t, a in dom.elements[start:end] if t == "details"]
    assert inside and all("open" in a for a in inside)
    closed = [k for k, (t, a) in enumerate(plain) if t == "details" and "open" not in a]
    assert any(start <= k < end for k in closed)  # the fragment opened a panel that a plain load keeps closed


OUTCOMES = {"base": ("011011", "111111"), "opd": ("011011", "000001"), "nca": ("011011", "111001")}  # (x, xc)/item
HARM_ITEMS = {"base": [], "opd": [1, 2, 4], "nca": [4]}  # right without the context, wrong with it
HELP_ITEMS = {"base": [0, 3], "opd": [], "nca": [0]}  # the reverse


def _eval_run(root: Path) -> Path:
    """A run with eval/<model>.json + .csv of known outcomes (summaries by `removability.summarize`, as eval does)."""
    from mechopd.evaluation.removability import summarize
    from mechopd.runset import EvalReport

    for m, (xs, xcs) in OUTCOMES.items():
        recs = [
            {
                "uid": f"u{i}",
                "sample": 0,
                "correct_x": x == "1",
                "correct_xc": xc == "1",
                "len_x": 3,
                "len_xc": 3,
                "response_x": f"a{i}",
                "response_xc": f"b{i}",
                "prompt": f"p{i}",
                "context": "c",
                "target": f"t{i}",
            }
            for i, (x, xc) in enumerate(zip(xs, xcs))
        ]
        EvalReport.from_dict({"summary": summarize(recs, n_boot=20), "records": recs, "settings": {"model": m}}).save(
            root / "eval" / f"{m}.json"
        )
    return root


def test_report_items_link_to_the_explorer_items(tmp_path):
    """report.md writes explore.html beside it; its Items section lists each model's Harm and Help items as
    ``explore.html#item-i``; each link's item on the page has that uid and that outcome, and the counts reproduce
    the eval report's Harm and Help."""
    import re

    from mechopd.report import write_report_md

    run = _eval_run(tmp_path / "run")
    text = write_report_md(run).read_text()
    assert (run / "explore.html").is_file()
    section = text.split("## Items", 1)[1].split("\n## ", 1)[0]
    dom = parse(dump_dom(run / "explore.html")[0])
    assert dom.errors.strip() == ""
    uid_of = {a["id"]: a["data-uid"] for t, a in dom.elements if a.get("class") == "item"}
    flag, seen = {}, {}  # (model, item) -> the page's outcome flag (rows: item by item, every model's)
    for a in (a for t, a in dom.elements if a.get("class") == "orow"):
        k = seen[a["data-model"]] = seen.get(a["data-model"], -1) + 1
        flag[(a["data-model"], k)] = a["data-flag"]
    for m, harm_items in HARM_ITEMS.items():
        line = next(ln for ln in section.splitlines() if f"(`{m}`)" in ln)
        harm, help_ = line.split("; ")
        for part, want, name in ((harm, harm_items, "Harm"), (help_, HELP_ITEMS[m], "Help")):
            idx = [int(i) for i in re.findall(r"\(explore\.html#item-(\d+)\)", part)]
            assert idx == want, (m, part)
            for i in idx:
                assert uid_of[f"item-{i}"] == f"u{i}"
                assert flag[(m, i)] == name
        rows = read_csv(run / "eval" / f"{m}.csv")
        right_x = sum(r["correct_x"] == "True" for r in rows)
        summary = json.loads((run / "eval" / f"{m}.json").read_text())["summary"]
        assert f"Harm {len(harm_items)} of the {right_x} items" in harm
        if summary["harm"]["value"] is not None:
            assert len(harm_items) / right_x == pytest.approx(summary["harm"]["value"])
    claims = text.split("## The papers' claims", 1)[1]
    assert "(explore.html#filter=harm&model=opd)" in claims.split("\n| NCA removes")[0]
    target = parse(dump_dom(run / "explore.html", "#item-4")[0])
    assert next(a for t, a in target.elements if t == "body").get("data-target") == "4"
