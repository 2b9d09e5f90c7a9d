"""What `mechopd run` checks of a study's models before its first file or job (`check_study_models`).

`StudySpec` checks the study's keys, training fields and probe options when the file is read; this checks every model
the study names, in the same pass: the student, the teacher and every checkpoint run's directory (a probe's model
options name roles of the study, checked by `StudySpec`). A ``model:NAME`` is fetched now if it is not there yet (`models.fetch.resolve_fetched`), then
checked as its directory. A local directory must hold safetensors weights that are exactly the
tensors its config.json describes (pickles refused, never unpickled; `core.checks.check_checkpoint`), all finite (read
tensor by tensor from the files, no model built: `core.checks.check_saved_finite`), with a usable tokenizer that maps
text to the same ids as the student's (`models.check_same_tokenizer`). A hub id is checked as far as it can be
without a download (its name); an ``organism:<task>`` is built by the study itself (a checkpoint run is compared with
its cached config.json, or its recipe's shape).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError, MechopdError
from mechopd.core.provenance import input_record
from mechopd.pipeline.spec import StudySpec


def check_study_models(spec: StudySpec) -> None:
    """Every model of ``spec`` loadable as the study will load it (module docstring); the first failure raises its
    `MechopdError`, prefixed with the study file and the key that names the model."""
    from mechopd.models.spec import organism_task

    named = {"student": spec.student, **({"teacher": spec.teacher} if spec.teacher else {})}
    named.update({f"runs.{role}.checkpoint": path for role, path in spec.checkpoints().items()})
    tokenizers: dict[str, Any] = {}
    for key, model in named.items():
        if organism_task(model) is not None:
            continue  # built by the study itself (`run.resolve_model`), then checked as it loads
        try:
            tok = _check_one(model)
        except MechopdError as e:
            raise type(e)(f"{spec.source}: {key} {model}: {e}") from None
        if tok is not None:
            tokenizers[key] = tok
    for key, tok in tokenizers.items():  # the teacher's and every checkpoint run's: the student's tokenizer
        if key != "student" and "student" in tokenizers:
            try:
                _same_tokenizer(tokenizers["student"], tok, key)
            except MechopdError as e:
                raise type(e)(f"{spec.source}: {e}") from None
    student = _local(spec.student)
    mine = _shape(student) if isinstance(student, str) and Path(student, "config.json").is_file() else None
    if mine is None and organism_task(spec.student) is not None:  # built by the study itself: its cache or recipe
        mine = _organism_shape(spec, str(organism_task(spec.student)))
    if mine is not None:
        check_checkpoint_shapes(spec, mine)
        check_probe_layers(spec, mine["num_hidden_layers"])


SHAPE_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size")  # fmt: skip


def _shape(path: str) -> dict[str, Any]:
    from mechopd.core.model_checks import read_config

    config = read_config(path)
    cfg = getattr(config, "text_config", None) or config
    return {k: getattr(cfg, k, getattr(config, k, None)) for k in SHAPE_KEYS}


def _organism_shape(spec: StudySpec, task: str) -> dict[str, Any]:
    """An ``organism:<task>`` student's shape: its cached directory's config.json when it is there, else its recipe's
    (`organisms.pretrain.model_config`; no vocabulary size, which its tokenizer sets)."""
    from mechopd.organisms.pretrain import default_config

    cached = Path(spec.first_config(0).organism_dir) / task
    if (cached / "config.json").is_file():
        return _shape(str(cached))
    recipe = default_config(task, seed=0)
    return {
        "model_type": recipe.arch,
        "num_hidden_layers": recipe.num_layers,
        "hidden_size": recipe.hidden_size,
        "intermediate_size": recipe.intermediate_size,
        "num_attention_heads": recipe.num_heads,
        "num_key_value_heads": recipe.num_kv_heads,
        "head_dim": recipe.hidden_size // recipe.num_heads,
    }


def check_checkpoint_shapes(spec: StudySpec, mine: dict[str, Any]) -> None:
    """Every checkpoint run is the student's architecture, widths and depth (``mine``: `_shape` of the student, or
    `_organism_shape`), a model trained from it, before any job: one line naming the first fields that differ."""
    for role, path in spec.checkpoints().items():
        theirs = _shape(path)
        diff = [
            f"{k} {theirs[k]!r} vs the student's {mine[k]!r}" for k in SHAPE_KEYS if k in mine and theirs[k] != mine[k]
        ]
        if diff:
            raise ConfigError(
                f"{spec.source}: runs.{role}.checkpoint {path} is not the student's architecture ({'; '.join(diff[:3])})"
                ": a checkpoint run is a model trained from the study's student; pass one, or make it the student"
            )


def check_probe_layers(spec: StudySpec, depth: Any) -> None:
    """Every layer index a study's probe option names (``layers``, ``layer``) lies within the student's ``depth``
    (``-n..n-1``), before any job."""
    if not isinstance(depth, int):
        return
    for name in spec.probes:
        _, own = spec.probe_plan_of(name)
        for key in ("layers", "layer"):
            for i in _indices(own.get(key)):
                if not -depth <= i < depth:
                    raise ConfigError(
                        f"{spec.source}: probes.{name}.{key}: layer {i} is past the student's {depth} decoder "
                        f"layers (0..{depth - 1}, or -{depth}..-1 from the end); pass indices in that range"
                    )


def _indices(value: Any) -> list[int]:
    """The integer layer indices an option value names (an int, a list, or text like ``0,1,all``)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",") if value is not None else []
    out = []
    for item in items:
        if isinstance(item, bool):
            continue
        try:
            out.append(int(str(item).strip()))
        except ValueError:
            continue  # a name ('all', a site): the probe's own check reads it
    return out


def _local(model: Any) -> Any:
    """``model:NAME`` -> its fetched directory (fetched on first use); anything else unchanged."""
    from mechopd.models.fetch import fetched_name, resolve_fetched

    return resolve_fetched(model) if isinstance(model, str) and fetched_name(model) is not None else model


def _check_one(model: str) -> Any:
    """One model: headers, values and tokenizer of a local directory (returns its tokenizer); a hub id: its name."""
    from mechopd.core.model_checks import check_checkpoint, check_saved_finite
    from mechopd.models import check_model, load_tokenizer

    src = check_model(_local(model))
    if not Path(src).is_dir():
        return None  # a hub id: downloaded and checked when it loads
    check_saved_finite(check_checkpoint(src))
    return load_tokenizer(src)


def _same_tokenizer(student: Any, other: Any, name: str = "teacher") -> None:
    from mechopd.models import check_same_tokenizer

    check_same_tokenizer(student, other, name_b=name)


def study_inputs(spec: StudySpec) -> dict[str, dict[str, str]]:
    """What the study's runs are made from, by content (`core.provenance.input_record`): the student and teacher
    directories and every file a task option or training field names (data, context files), by the key that names it.
    `run.check_out` compares it with the record of a run already in ``--out``."""
    named: dict[str, Any] = {"student": _local(spec.student), "teacher": _local(spec.teacher)}
    named.update({f"task_options.{k}": v for k, v in spec.task_options.items()})
    named.update({f"train.{k}": v for k, v in spec.train.items()})
    named.update({f"runs.{role}.{k}": v for role, over in spec.runs.items() for k, v in over.items()})
    records = {key: input_record(value) for key, value in named.items()}
    return {key: rec for key, rec in records.items() if rec is not None}
