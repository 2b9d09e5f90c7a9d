"""Organism depth option: a deeper organism is its own config, key and directory; the defaults stay as cached."""

from __future__ import annotations

import json

import pytest

from mechopd.cli import main
from mechopd.core.errors import ConfigError
from mechopd.organisms.pretrain import ORGANISM_TASKS, OrganismConfig, default_config, organism_dir_name, pretrain
from tests.conftest import TINY_ORGANISM


@pytest.mark.parametrize("task", ORGANISM_TASKS)
def test_default_organisms_keep_their_config_and_key(task):
    default = default_config(task)
    assert default.num_layers == OrganismConfig.num_layers == 3
    assert default_config(task, layers=None) == default == default_config(task, layers=3)
    assert default_config(task, layers=3).key() == default.key()
    deep = default_config(task, layers=8)
    assert deep.num_layers == 8 and deep.key() != default.key()
    assert {k: v for k, v in vars(deep).items() if k != "num_layers"} == {
        k: v for k, v in vars(default).items() if k != "num_layers"
    }  # only the depth changes


def test_organism_dir_names():
    assert [organism_dir_name("sokoban", n) for n in (None, 3, 8)] == ["sokoban", "sokoban", "sokoban-L8"]


@pytest.mark.parametrize("layers", [0, -1, 49, True, 2.5])
def test_bad_depth_names_the_field(layers):
    with pytest.raises(ConfigError, match="layers="):
        default_config("rules", layers=layers)


def test_cli_refuses_a_bad_depth_in_one_line(capsys, tmp_path):
    assert main(["pretrain", "--task", "rules", "--layers", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "layers=0" in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_deeper_organism_checkpoint_has_its_layers(tmp_path):
    cfg = OrganismConfig(task="rules", **{**TINY_ORGANISM, "num_layers": 4, "steps": 2})
    out = pretrain(cfg, tmp_path / "rules-L4", progress=False)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    assert json.loads((out / "organism.json").read_text())["config"]["num_layers"] == 4


@pytest.mark.parametrize("task_name", ["rules", "frozenlake"])
def test_batched_corpus_encoding_gives_the_per_text_ids(task_name):
    """_encode_corpus tokenizes the prompts and the responses in batched calls: the ids of one call per text."""
    from mechopd.core.views import RenderSpec, render_prompt_ids
    from mechopd.organisms.pretrain import EOS, _encode_corpus, build_tokenizer, organism_vocab
    from mechopd.tasks.base import get_task

    task, tok = get_task(task_name), build_tokenizer(organism_vocab())
    spec, eos = RenderSpec(placement=task.placement), tok.convert_tokens_to_ids(EOS)
    ref = []
    for ctx, prompt, resp in task.pretrain_corpus(300, 0):
        p = render_prompt_ids(tok, prompt, ctx, spec)
        ref.append((p + tok(resp, add_special_tokens=False)["input_ids"] + [eos], len(p)))
    assert _encode_corpus(task, tok, 300, 0) == ref and any(ctx for ctx, _, _ in task.pretrain_corpus(300, 0))
