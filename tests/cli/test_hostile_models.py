"""Hostile inputs, model directories and task data (#22): refused with one line, before any model loads.

Each case damages its own copy of the session's tiny rules organism (config.json, tokenizer files, chat template,
weight index) or hands the task a malformed option or file; the last tests pin the legitimate neighbours.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from tests.cli.hostile import Hostile, check_in_workspace, copy_org, edit_json, evaluate, set_template, train, write

RAISES = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
DROPS_SYSTEM = "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] + '\\n' }}{% endif %}{% endfor %}"
NOT_UTF8 = b"rule \xff\xfe"
DATE_NO_PIN = "{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}"


def _no_tokenizer(o: Path, w: Path) -> Path:
    d = copy_org(o, w)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (d / f).unlink(missing_ok=True)
    return d


def _foreign_tokenizer(o: Path, w: Path) -> Path:
    """Another model's tokenizer next to the weights: the zoo's Qwen3 BPE (640 entries) over the organism's head."""
    from mechopd.testing.zoo import build_zoo

    d = _no_tokenizer(o, w)
    src = build_zoo().student("qwen3")
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, d / f.name)
    return d


def _index_outside(o: Path, w: Path) -> Path:
    """A sharded layout whose index names a shard outside the model directory."""
    d = copy_org(o, w)
    f = d / "model.safetensors"
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    names = [k for k in json.loads(f.read_bytes()[8 : 8 + n]) if k != "__metadata__"]
    f.rename(w / "elsewhere.safetensors")
    index = {"metadata": {}, "weight_map": {k: "../elsewhere.safetensors" for k in names}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def _jsonl(w: Path, name: str = "qa.jsonl") -> Path:
    return write(w, name, json.dumps({"prompt": "apply the rule to : 1 2", "answer": "2 3"}) + "\n")


def _bank(o: Path, w: Path, token: int) -> Path:
    from mechopd.tasks.base import get_task

    items = get_task("rules").examples("test", 2, 0)
    return write(
        w, "resp.jsonl", "".join(json.dumps({"uid": ex.uid, "response_ids": [3, token]}) + "\n" for ex in items)
    )


def _sim(o, w: Path, *more: str) -> list[str]:
    return ["probe", "similarity", "--task", "rules", "--models", f"a={o}", "--n", "2", "--out", str(w / "sim"), *more]


CASES = [
    # model directories
    Hostile(
        "models",
        "vocab-size-zero",
        lambda o, w: evaluate(edit_json(copy_org(o, w), "config.json", vocab_size=0)),
        "vocab_size",
    ),
    Hostile("models", "tokenizer-deleted", lambda o, w: evaluate(_no_tokenizer(o, w)), "has no tokenizer files"),
    Hostile("models", "tokenizer-deleted-train", lambda o, w: train(_no_tokenizer(o, w), w), "has no tokenizer files"),
    Hostile("models", "foreign-tokenizer", lambda o, w: evaluate(_foreign_tokenizer(o, w)), "belongs to another model"),
    Hostile(
        "models",
        "template-renders-nothing",
        lambda o, w: evaluate(set_template(copy_org(o, w), "{{ '' }}")),
        "renders an empty prompt",
    ),
    Hostile(
        "models",
        "template-drops-system",
        lambda o, w: evaluate(set_template(copy_org(o, w), DROPS_SYSTEM)),
        "renders both views identically",
    ),
    Hostile(
        "models",
        "template-drops-system-train",
        lambda o, w: train(set_template(copy_org(o, w), DROPS_SYSTEM), w),
        "renders both views identically",
    ),
    Hostile(
        "models",
        "template-date-unpinnable",
        lambda o, w: evaluate(set_template(copy_org(o, w), DATE_NO_PIN)),
        "renders differently on different days",
    ),
    Hostile("models", "shard-outside-dir", lambda o, w: evaluate(_index_outside(o, w)), "lies outside"),
    Hostile(
        "models",
        "tokenizer-file-outside",
        lambda o, w: evaluate(edit_json(copy_org(o, w), "tokenizer_config.json", tokenizer_file="/etc/hostname")),
        "lies outside",
    ),
    Hostile(
        "models", "train-out-is-a-model", lambda o, w: train(o, w, "--out", str(copy_org(o, w))), "is a model directory"
    ),
    # task data and probes
    Hostile(
        "tasks",
        "context-file-not-utf8",
        lambda o, w: evaluate(
            o,
            "--task",
            "jsonl",
            "--option",
            f"path={_jsonl(w)}",
            "--option",
            f"context_file={write(w, 'ctx.txt', NOT_UTF8)}",
        ),
        "context file is not UTF-8",
    ),
    Hostile(
        "tasks",
        "max-new-tokens-text",
        lambda o, w: evaluate(o, "--task", "jsonl", "--option", f"path={_jsonl(w)}", "--option", "max_new_tokens=abc"),
        "max_new_tokens='abc' is not a valid int",
    ),
    Hostile(
        "tasks", "rule-superscript", lambda o, w: evaluate(o, "--option", "rule=shift:²"), "rule 'shift:²' is not valid"
    ),
    Hostile("tasks", "rule-number", lambda o, w: evaluate(o, "--option", "rule=2"), "rule=2 is not text"),
    Hostile(
        "tasks",
        "jsonl-temperature-nan",
        lambda o, w: evaluate(o, "--task", "jsonl", "--option", f"path={_jsonl(w)}", "--option", "temperature=.nan"),
        "temperature=nan",
    ),
    Hostile(
        "tasks",
        "similarity-context-too-long",
        lambda o, w: _sim(
            edit_json(copy_org(o, w), "config.json", max_position_embeddings=12), w, "--responses-from", "answers"
        ),
        "exceeds the model's maximum length",
    ),
    Hostile(
        "tasks",
        "similarity-unk",
        lambda o, w: [
            "probe",
            "similarity",
            "--task",
            "jsonl",
            "--option",
            f"path={write(w, 'q.jsonl', _zz())}",
            "--models",
            f"a={o}",
            "--responses-from",
            "answers",
            "--out",
            str(w / "sim"),
        ],
        "lacks tokens",
    ),
    Hostile(
        "tasks",
        "response-id-huge",
        lambda o, w: _sim(o, w, "--responses-from", str(_bank(o, w, 10**9))),
        "token id 1000000000, outside",
    ),
    Hostile(
        "tasks",
        "response-id-negative",
        lambda o, w: _sim(o, w, "--responses-from", str(_bank(o, w, -1))),
        "token id -1, outside",
    ),
    Hostile(
        "tasks",
        "terms-duplicate",
        lambda o, w: [
            "probe",
            "gradients",
            "--task",
            "rules",
            "--model",
            str(o),
            "--teacher",
            str(o),
            "--terms",
            "opd,opd",
            "--out",
            str(w / "g"),
        ],
        "names 'opd' twice",
    ),
]


def _zz() -> str:
    return json.dumps({"prompt": "zyzzyva quux?", "answer": "blorp", "context": "frobnicate"}) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}-{c.name}" for c in CASES])
def test_refused_with_one_line_nothing_changed(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)


def test_a_json_line_holding_u2028_is_one_item(tmp_path):
    """U+2028 inside a JSON string is valid JSON on one line: read as one item (str.splitlines would cut it)."""
    from mechopd.tasks.jsonl import read_items

    p = write(
        tmp_path,
        "qa.jsonl",
        json.dumps({"prompt": "a\u2028b", "answer": "c", "context": "d"}, ensure_ascii=False) + "\n",
    )
    assert "\u2028" in p.read_text(encoding="utf-8")
    (item,) = read_items(p)
    assert item.stem == "a\u2028b"


def test_a_one_item_file_names_the_empty_split_not_n_zero(tmp_path):
    from mechopd.core.errors import TaskError
    from mechopd.tasks.base import get_task
    from mechopd.tasks.jsonl import is_test_uid

    for k in range(50):  # an item that the content hash puts in train: the test split is empty
        p = write(tmp_path, "one.jsonl", json.dumps({"prompt": f"q{k}", "answer": "a", "context": "c"}) + "\n")
        task = get_task("jsonl", path=p)
        if not is_test_uid(task.examples("train", 1, 0)[0].uid, 0.2):
            break
    with pytest.raises(TaskError) as err:
        task.examples("test", 1, 0)
    assert "none of its 1 item(s) falls in the test split" in str(err.value) and "or less" not in str(err.value)
