"""A TRL / transformers Trainer ``output_dir`` holds its model in ``checkpoint-N`` folders only (until
``trainer.save_model()``): given as a model, it is refused with one line naming the checkpoint to pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.core.errors import ModelError
from mechopd.models import check_model


def test_a_trainer_output_dir_names_its_latest_checkpoint(tmp_path: Path):
    out = tmp_path / "trl"
    for step in (2, 10, 4):  # by step, not by name: checkpoint-10 is the latest
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "config.json").write_text("{}")
    with pytest.raises(ModelError) as e:
        check_model(out)
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint-2, checkpoint-4, checkpoint-10" in msg, msg
    assert f"pass one, e.g. the latest {out / 'checkpoint-10'}" in msg and "save_model" in msg, msg


def test_a_dir_without_config_or_checkpoints_keeps_the_plain_message(tmp_path: Path):
    (tmp_path / "checkpoint-x").mkdir()  # not a step: not a Trainer checkpoint
    with pytest.raises(ModelError, match="has no config.json; pass a directory written by save_pretrained"):
        check_model(tmp_path)
