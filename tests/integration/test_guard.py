"""Reliability of the loop: the step guard, checkpoints that are really good, run-directory states, disk full."""

from __future__ import annotations

import errno
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError, MechopdError, TaskError, TrainingError
from mechopd.train import checkpoint
from mechopd.train.trainer import Trainer, train

BASE = dict(task="rules", batch_size=4, steps=3, lr=1e-3, max_new_tokens=6, seed=3, pool_size=32)


def _cfg(student, **kw):
    return TrainConfig(student=str(student), **{**BASE, **kw})


def _finite(ckpt) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values())


def _steps(run) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_nan_gradient_is_never_applied_nor_saved_and_the_run_resumes(tiny_rules_organism, tmp_path):
    """NaN injected into ONE parameter's gradient at step 3 (the loss stays finite): the run stops naming step 3 and
    the term, no checkpoint holds a NaN, and resuming from what is left finishes the run."""
    run = tmp_path / "r"
    cfg = _cfg(tiny_rules_organism, method="nca", save_every=1, steps=4)
    trainer = Trainer(cfg, run, progress=False)
    p = dict(trainer.student.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    p.register_hook(lambda g: g * float("nan") if trainer.step == 2 else g)
    with pytest.raises(TrainingError, match=r"gradient norm became nan at step 3, from term 'opd' and 'nca'") as e:
        trainer.run()
    assert "not applied" in str(e.value) and "\n" not in str(e.value)
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step-1", "step-2"] and not (run / "final").exists()
    assert all(_finite(run / "checkpoints" / c) for c in ckpts)
    assert checkpoint.latest_checkpoint(run).name == "step-2"
    final = train(cfg, run, resume=True, progress=False)
    assert _finite(final) and _steps(run) == [1, 2, 3, 4]


def test_non_finite_weights_are_refused_before_a_save(tiny_rules_organism, tmp_path):
    trainer = Trainer(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    with torch.no_grad():
        trainer.params[1].view(-1)[0] = float("inf")
    with pytest.raises(TrainingError, match="1 weight tensor.* non-finite before saving"):
        trainer.save(tmp_path / "r" / "checkpoints" / "step-0")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_disk_full_during_a_checkpoint_keeps_the_older_ones(tiny_rules_organism, tmp_path, monkeypatch):
    real, calls = checkpoint.save_file, []

    def full_disk(tensors, path, *a, **k):
        calls.append(path)
        if "step-2" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    run = tmp_path / "r"
    with pytest.raises(
        TrainingError, match=r"writing checkpoint .*step-2 failed: No space left on device; the older"
    ) as e:
        train(_cfg(tiny_rules_organism, save_every=1), run, progress=False)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]  # no temp dir left either
    monkeypatch.setattr(checkpoint, "save_file", real)
    assert _finite(train(_cfg(tiny_rules_organism, save_every=1), run, resume=True, progress=False))


def test_resume_refuses_a_changed_config_and_names_the_keys(tiny_rules_organism, tmp_path):
    run = tmp_path / "r"
    train(_cfg(tiny_rules_organism, steps=2, save_every=1), run, progress=False)
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"batch_size: 4 -> 8; seed: 3 -> 4; only steps, eval_every"):
        train(_cfg(tiny_rules_organism, steps=3, save_every=1, seed=4, batch_size=8), run, resume=True, progress=False)
    assert (run / "config.yaml").read_text() == before
    train(_cfg(tiny_rules_organism, steps=3, save_every=1, eval_n=5), run, resume=True, progress=False)  # allowed
    assert _steps(run) == [1, 2, 3]


def test_resume_with_a_decaying_lr_refuses_a_new_length(tiny_rules_organism, tmp_path):
    """A linear/cosine lr is laid out over `steps`: extending the run would change the rate of steps already taken."""
    run = tmp_path / "r"
    train(_cfg(tiny_rules_organism, steps=2, save_every=1, lr_schedule="linear"), run, progress=False)
    with pytest.raises(ConfigError, match=r"steps: 2 -> 3; only eval_every"):
        train(_cfg(tiny_rules_organism, steps=3, save_every=1, lr_schedule="linear"), run, resume=True, progress=False)
    lrs = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert lrs == pytest.approx([_cfg(tiny_rules_organism).lr * 0.5, 0.0])  # logged after each step: m(1), m(2)


def test_stale_temps_removed_and_truncated_metrics_line_handled_on_resume(tiny_rules_organism, tmp_path, capsys):
    run = tmp_path / "r"
    train(_cfg(tiny_rules_organism, steps=2, save_every=2), run, progress=False)
    stale = run / "checkpoints" / ".step-3.tmp-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.')  # a write killed mid-line
    train(_cfg(tiny_rules_organism, steps=3, save_every=2), run, resume=True, progress=False)
    assert not stale.exists() and _steps(run) == [1, 2, 3]
    assert "dropped a truncated last line" in capsys.readouterr().out


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_killed_before_its_first_checkpoint_can_be_restarted(tiny_rules_organism, tmp_path, resume, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("task: rules\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (run / "checkpoints" / ".step-1.tmp-x").mkdir(parents=True)  # killed during its first save
    with pytest.raises(MechopdError):  # a restart refused on the way loses nothing
        train(_cfg(tiny_rules_organism, teacher=str(tmp_path / "missing")), run, resume=resume, progress=False)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
    final = train(_cfg(tiny_rules_organism, steps=1), run, resume=resume, progress=False)
    assert final.exists() and _steps(run) == [1]
    assert "stopped before its first complete checkpoint; restarting it from step 0" in capsys.readouterr().out
    with pytest.raises(TrainingError, match="already holds a run"):  # a finished run is never restarted
        train(_cfg(tiny_rules_organism, steps=1), run, progress=False)


def test_a_refused_run_leaves_no_file_and_the_corrected_rerun_works(tiny_rules_organism, tmp_path):
    short = tmp_path / "short"
    shutil.copytree(tiny_rules_organism, short)
    conf = json.loads((short / "config.json").read_text())
    conf["max_position_embeddings"] = 12  # every context view is longer: refused at the first step
    (short / "config.json").write_text(json.dumps(conf))
    run = tmp_path / "r"
    with pytest.raises(TaskError):
        train(_cfg(short), run, progress=False)
    assert not run.exists()
    with pytest.raises(MechopdError):
        train(_cfg(tiny_rules_organism, teacher=str(tmp_path / "missing")), run, progress=False)
    assert not run.exists()
    assert train(_cfg(tiny_rules_organism, steps=1), run, progress=False).exists()


def test_resolved_config_is_printed_once_at_the_start(tiny_rules_organism, tmp_path, capsys):
    train(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    out = capsys.readouterr().out
    assert out.count("config (new run)") == 1  # one line (the full dump behind --verbose)
    line = next(x for x in out.splitlines() if x.startswith("config (new run)"))
    assert "steps=1" in line and "  batch_size: 4\n" not in out  # one line, not the dump
    train(_cfg(tiny_rules_organism, steps=1), tmp_path / "v", progress=False, verbose=True)
    assert "  batch_size: 4\n" in capsys.readouterr().out  # --verbose: the full resolved config


def _lora(student, steps: int) -> TrainConfig:
    return _cfg(student, steps=steps, save_every=2, lora_rank=2, lr_schedule="constant")


def _finished_lora_run(student, run) -> None:
    train(_lora(student, 3), run, progress=False)
    assert _steps(run) == [1, 2, 3] and checkpoint.latest_checkpoint(run).name == "step-2"


def test_a_resume_stopped_by_a_nan_adapter_keeps_every_metrics_line(tiny_rules_organism, tmp_path):
    from safetensors.torch import save_file

    run = tmp_path / "r"
    _finished_lora_run(tiny_rules_organism, run)
    f = run / "checkpoints" / "step-2" / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(f))
    key = next(k for k in sorted(tensors) if ".lora_B." in k)
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, str(f))
    with pytest.raises(MechopdError, match="NaN or inf"):
        train(_lora(tiny_rules_organism, 4), run, resume=True, progress=False)
    assert _steps(run) == [1, 2, 3]  # step 3 (the final model's) is not dropped by a resume that never stepped


def test_a_resume_that_stops_before_its_first_step_keeps_every_metrics_line(tiny_rules_organism, tmp_path, monkeypatch):
    run = tmp_path / "r"
    _finished_lora_run(tiny_rules_organism, run)

    def stop(self):
        raise TrainingError("stopped at the first step (injected)")

    monkeypatch.setattr(Trainer, "train_step", stop)
    with pytest.raises(TrainingError, match="injected"):
        train(_lora(tiny_rules_organism, 4), run, resume=True, progress=False)
    assert _steps(run) == [1, 2, 3]
    monkeypatch.undo()
    train(_lora(tiny_rules_organism, 4), run, resume=True, progress=False)
    assert _steps(run) == [1, 2, 3, 4]  # the resume replaced step 3's line with its own, then stepped on


def test_only_the_latest_checkpoint_keeps_the_optimizer_state_and_a_resume_reads_it(tiny_rules_organism, tmp_path):
    """save_every=1 over 3 steps: step-1 and step-2 are pruned to models (marked, loadable), step-3 alone is
    resumable, and resuming to 4 steps reads it (#54)."""
    run = tmp_path / "r"
    train(_cfg(tiny_rules_organism, save_every=1), run, progress=False)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step-1", "step-2", "step-3"]
    for old in ("step-1", "step-2"):
        assert (ck / old / checkpoint.WEIGHTS_ONLY).is_file() and _finite(ck / old)
        assert not any((ck / old / f).exists() for f in checkpoint.RESUME_FILES)
    assert (ck / "step-3" / checkpoint.OPTIM).is_file() and checkpoint.latest_checkpoint(run).name == "step-3"
    assert _finite(train(_cfg(tiny_rules_organism, save_every=1), run, resume=True, progress=False))


def test_checkpoints_kept_only_to_resume_go_once_the_final_model_is_written(tiny_rules_organism, tmp_path, monkeypatch):
    """keep_checkpoints false (what a study sets when it chose save_every itself): no checkpoint at the last step,
    none left after final/ (#54)."""
    from mechopd.train.saving import RunSaver

    run, seen, real = tmp_path / "r", [], RunSaver.save_final

    def spy(self, step):
        seen.append(sorted(p.name for p in (run / "checkpoints").iterdir()))
        return real(self, step)

    monkeypatch.setattr(RunSaver, "save_final", spy)
    train(_cfg(tiny_rules_organism, save_every=1, keep_checkpoints=False), run, progress=False)
    assert seen == [["step-1", "step-2"]]  # step-3 not written: final/ follows it at once
    assert not (run / "checkpoints").exists() and _finite(run / "final")
