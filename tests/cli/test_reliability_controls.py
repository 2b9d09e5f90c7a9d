"""Controls for the bad-input tests of test_reliability.py: the checks can fail. The uncorrupted organism passes
every load check and the snapshot sees what a good command writes; the pickle trap really fires when unpickled; real
(sharded, untied) checkpoints pass the load checks; every flag of the commands has a help line and a metavar."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from mechopd.cli import main
from tests.cli.reliability_harness import _eval, pickle_only, snapshot


def test_controls_a_good_command_passes_and_is_seen_writing(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """The same organism, uncorrupted, passes every load check, and the snapshot sees the report it writes."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(_eval(str(tiny_rules_organism), "--out", str(tmp_path / "r.json"))) == 0
    assert "error:" not in capsys.readouterr().err
    assert set(snapshot(tmp_path)) - set(before) == {
        str(tmp_path / "r.json"),
        str(tmp_path / "r.csv"),
        str(tmp_path / ".r.fileset"),
    }  # the set's manifest (FileSet)


def test_controls_the_pickle_trap_fires_when_unpickled(tiny_rules_organism, tmp_path):
    """The .bin of the pickle cases really would write a file if anything unpickled it."""
    d = pickle_only(Path(tiny_rules_organism), tmp_path)
    with open(d / "pytorch_model.bin", "rb") as fh:
        pickle.load(fh)  # noqa: S301 - the point of the test
    assert (tmp_path / "UNPICKLED").exists()


@pytest.mark.parametrize("command", ["pretrain", "train", "eval", "figures", "demo"])
def test_every_flag_has_a_help_line_and_a_metavar(command):
    """`mechopd COMMAND --help` explains every flag: a help text, and a named placeholder for each value."""
    import argparse

    from mechopd.cli import make_parser

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    assert flags
    for action in flags:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and len(action.help) > 10, name
        if action.nargs != 0:  # takes a value: a placeholder that says what kind (not the SHORT_TASK dest)
            assert action.metavar and not str(action.metavar).startswith("SHORT_"), name


@pytest.mark.parametrize("arch,tied", [("qwen3", True), ("llama", False), ("qwen2", False)])
def test_controls_sharded_and_untied_checkpoints_pass(organism_tokenizer, tmp_path, arch, tied):
    """Real checkpoints are sharded and often untied: the load checks accept them and load the same weights."""
    from mechopd.models import check_model, load_model
    from tests.conftest import tiny_model

    model = tiny_model(organism_tokenizer, arch=arch)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + 1.0)
    model.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    check_model(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
