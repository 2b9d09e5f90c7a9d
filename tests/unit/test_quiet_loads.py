"""mechopd's own model loads and saves print no transformers progress bar, and leave the bar setting as they found it."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from mechopd.models import atomic_save, load_model, quiet_progress

from ..conftest import tiny_model


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory, organism_tokenizer):
    out = tmp_path_factory.mktemp("quiet") / "model"
    atomic_save(tiny_model(organism_tokenizer), organism_tokenizer, out)
    return out


def test_plain_transformers_load_prints_a_bar(saved_dir, capsys):
    """The reference: without mechopd, the same load does print the bar (so the test below can fail)."""
    assert hf_logging.is_progress_bar_enabled()
    AutoModelForCausalLM.from_pretrained(saved_dir)
    assert "Loading weights" in capsys.readouterr().err


def test_load_model_prints_no_progress_bar(saved_dir, capsys):
    model = load_model(saved_dir)
    out, err = capsys.readouterr()
    assert "Loading weights" not in err and "\r" not in err and "%|" not in err, err
    assert "Loading weights" not in out
    assert model.config.num_hidden_layers == 2
    assert hf_logging.is_progress_bar_enabled()  # restored for the user's own loads


def test_atomic_save_prints_no_progress_bar(saved_dir, organism_tokenizer, tmp_path, capsys):
    atomic_save(load_model(saved_dir), organism_tokenizer, tmp_path / "copy")
    err = capsys.readouterr().err
    assert "Writing model shards" not in err and "%|" not in err, err
    assert (tmp_path / "copy" / "model.safetensors").is_file()


def test_quiet_progress_restores_a_disabled_setting():
    hf_logging.disable_progress_bar()
    try:
        with quiet_progress():
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()  # a user who turned bars off keeps them off
    finally:
        hf_logging.enable_progress_bar()
    with quiet_progress():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
