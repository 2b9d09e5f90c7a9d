"""A loss term and a selector are each one file: registered here, with their options dataclass, they become config
keys (YAML, ``--set``), CLI flags and checked values, and the trainer builds them, without touching another file.
The old spellings of the built-in options (``--beta``, ``--set beta=``, YAML ``beta:``, ``cfg.beta``) keep working."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from mechopd.cli import main, make_parser
from mechopd.config import TrainConfig, train_facts
from mechopd.core.config_parse import CliValue
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE0, GE1, option, unregister_options
from mechopd.objectives.losses import TERMS, LossInputs, TermOutput, config_terms, register_term
from mechopd.objectives.select import config_selector, register_selector, unregister_selector
from mechopd.organisms.recipes import load_train_config


# -- the toy loss term: the no-context view's entropy, added to any method when toy_weight > 0 ---------------------------
@dataclass
class ToyTermOptions:
    toy_weight: float = option(0.0, range=GE0, help="weight of the toy entropy term (0 = off)")
    toy_power: int = option(1, range=GE1, help="power of the entropy")


def _toy_term(o, own: ToyTermOptions):
    """L_toy = H(q_x)^p per position."""

    def fn(x: LossInputs) -> TermOutput:
        logp = x.get("student_nctx")
        return TermOutput((-(logp.exp() * logp).sum(-1)) ** own.toy_power)

    return fn, frozenset({"student_nctx"})


# -- the toy selector: keeps the positions nearest toy_offset ------------------------------------------------------------
@dataclass
class ToySelectorOptions:
    toy_offset: int = option(0, range=GE0, help="the response position the toy selector prefers")


def _toy_near(normed, mask, generator, options: ToySelectorOptions):
    return -(torch.arange(mask.shape[1], dtype=torch.float32) - options.toy_offset).abs().expand(mask.shape).clone()


@pytest.fixture
def toys():
    register_term("toy", options=ToyTermOptions, weight="toy_weight", added=True)(_toy_term)
    register_selector("toy_near", needs_stats=False, options=ToySelectorOptions)(_toy_near)
    yield
    TERMS.pop("toy")
    unregister_options(ToyTermOptions)
    unregister_selector("toy_near")
    unregister_options(ToySelectorOptions)


def test_a_toy_terms_options_are_config_keys_and_build_the_term(toys, tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text("method: nca\ntoy_weight: 0.25\ntoy_power: 2\n")
    cfg = load_train_config(path)
    assert (cfg.toy_weight, cfg.toy_power) == (0.25, 2) and cfg.to_dict()["toy_weight"] == 0.25
    terms = {t.name: t for t in config_terms(cfg)}
    assert list(terms) == ["opd", "nca", "toy"] and terms["toy"].weight == 0.25
    logp = torch.log_softmax(torch.randn(2, 3, 5), -1)
    expected = (-(logp.exp() * logp).sum(-1)) ** 2
    assert torch.allclose(terms["toy"].fn(LossInputs(student_nctx=logp)).per_pos, expected)
    assert "toy" not in {t.name for t in config_terms(load_train_config(None, {"method": "nca"}))}  # weight 0: off
    with pytest.raises(ConfigError, match=r"toy_weight=-1.0 is invalid: it must be a finite number >= 0"):
        load_train_config(None, {"toy_weight": CliValue("-1")})
    with pytest.raises(ConfigError, match=r"toy_power.*not a valid int"):
        load_train_config(None, {"toy_power": CliValue("1.5")})


def test_a_toy_selectors_options_reach_its_score(toys):
    cfg = load_train_config(None, {"selector": "toy_near", "budget": CliValue("0.25"), "toy_offset": CliValue("2")})
    mask = torch.ones(2, 4, dtype=torch.bool)
    assert config_selector(cfg)(None, None, mask, cfg.budget).keep.tolist() == [[False, False, True, False]] * 2


def test_the_toys_flags_are_generated_and_read_once(toys):
    flags = {f.flag for f in train_facts()}
    assert {"--toy-weight", "--toy-power", "--toy-offset", "--beta"} <= flags
    a = make_parser().parse_args(["train", "--toy-weight", "0.5", "--toy-offset", "3"])
    assert (a.opt_toy_weight, a.opt_toy_offset) == ("0.5", "3") and isinstance(a.opt_toy_weight, CliValue)


def test_without_its_registration_a_toy_key_is_unknown():
    with pytest.raises(ConfigError, match="unknown key.*toy_weight"):
        load_train_config(None, {"toy_weight": 0.5})


def test_the_old_spellings_of_beta_keep_working(tmp_path):
    path = tmp_path / "nca.yaml"
    path.write_text("method: nca\nbeta: 0.3\n")
    assert load_train_config(path).beta == 0.3 and TrainConfig(beta=0.2).beta == 0.2
    assert load_train_config(None, {"beta": CliValue("0.7")}).beta == 0.7
    assert TrainConfig().beta == 0.5 and TrainConfig().to_dict()["beta"] == 0.5  # the default, declared once


@pytest.mark.parametrize(
    "argv,beta",
    [(["--beta", "0.7"], 0.7), (["--set", "beta=0.3"], 0.3), (["--beta", "0.7", "--set", "beta=0.3"], 0.3), ([], 0.5)],
)
def test_beta_flag_and_set_reach_the_config(argv, beta, monkeypatch, tmp_path):
    from mechopd.train import trainer

    seen = {}
    monkeypatch.setattr(trainer, "train", lambda cfg, out, **kw: seen.setdefault("cfg", cfg) and out)
    assert main(["train", "--method", "nca", "--out", str(tmp_path / "run"), *argv]) == 0
    assert seen["cfg"].beta == beta and seen["cfg"].method == "nca"


def test_a_toy_term_trains_from_its_flag(toys, tmp_path, tiny_rules_organism, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--student",
                str(tiny_rules_organism),
                "--toy-weight",
                "0.5",
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--max-new-tokens",
                "4",
                "--pool-size",
                "8",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    ), capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/toy" in r for r in rows)
    assert "toy_weight: 0.5" in (out / "config.yaml").read_text()
