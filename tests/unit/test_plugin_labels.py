"""A run's label comes from its plug-ins (`mechopd.objectives.labels`): each loss term and selector describes itself
from its typed options; the runner (`pipeline.stages.method_label`) asks them. A term registered here labels its
runs with no edit elsewhere, and the built-in labels read as they always did (reports and figures compare them)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mechopd.core.options import GE0, option, unregister_options
from mechopd.objectives import follow, losses  # noqa: F401  (follow: registered before the test's terms)
from mechopd.objectives.losses import METHODS, TERMS, register_term
from mechopd.objectives.select import register_selector, unregister_selector
from mechopd.pipeline.stages import labels_for, method_label


@dataclass
class EchoOptions:
    echo_weight: float = option(0.0, range=GE0, help="0 = off; > 0 adds the echo term")
    echo_lag: int = option(1, range=GE0, help="positions the echo looks back")


@dataclass
class ProbeOptions:
    probe_gamma: float = option(2.0, range=GE0, help="γ of the probe term")


@pytest.fixture
def plugins():
    """An added term (echo), a method whose own term labels the run (probe), a selector: registered, then removed."""

    def build(o, own=None):
        return (lambda x: None), frozenset({"student_nctx"})

    register_term(
        "echo",
        options=EchoOptions,
        weight="echo_weight",
        added=True,
        label=lambda run: (
            f" + echo (w={run.section(EchoOptions).echo_weight:g}, lag {run.section(EchoOptions).echo_lag})"
        ),
    )(build)
    register_term(
        "probe_t", options=ProbeOptions, label=lambda run: f"PROBE (γ={run.section(ProbeOptions).probe_gamma:g})"
    )(build)
    METHODS["probe_m"] = ("opd", "probe_t")
    register_selector("coin", needs_stats=False, label=lambda run: f"coin (kept {run.kept})")(
        lambda normed, mask, generator: None
    )
    yield
    for name in ("echo", "probe_t"):
        TERMS.pop(name)
    METHODS.pop("probe_m")
    unregister_options(EchoOptions)
    unregister_options(ProbeOptions)
    unregister_selector("coin")


def test_a_registered_term_and_selector_label_their_runs(plugins):
    assert method_label("opd", {"method": "opd", "echo_weight": 0.5, "echo_lag": 3}) == "OPD + echo (w=0.5, lag 3)"
    assert method_label("opd", {"method": "opd"}) == "OPD"  # the added term is off: it says nothing
    assert method_label("p", {"method": "probe_m", "probe_gamma": 0.25}) == "PROBE (γ=0.25)"
    assert method_label("p", {"method": "probe_m"}) == "PROBE (γ=2)"  # its declared default, typed
    both = {"method": "nca", "nca_start": 3, "echo_weight": 1, "follow_weight": 2, "lora_rank": 4}
    assert method_label("n", both) == "NCA (β=0.5, from step 3) + follow (w=2) + echo (w=1, lag 1), LoRA r=4"
    assert method_label("c", {"method": "opd", "selector": "coin"}, 0.5) == "coin (kept 0.5)"


def test_without_the_plugin_the_run_has_no_such_words():
    assert "echo" not in method_label("opd", {"method": "opd"}) and "echo" not in losses.TERMS


@pytest.mark.parametrize(
    "name, over, kept, label",
    [  # the labels of the built-in studies and the demo (figures/ and the reports compare them byte for byte)
        ("opd", {"method": "opd", "selector": "full"}, None, "OPD"),
        ("nca", {"method": "nca", "beta": 0.5, "nca_start": 30}, None, "NCA (β=0.5, from step 30)"),
        (
            "nca",
            {"method": "nca", "beta": 0.5, "nca_gate": 0.1, "nca_gate_window": 5},
            None,
            "NCA (β=0.5, KL gate 0.1)",
        ),
        ("nca_const", {"method": "nca", "beta": 0.5}, None, "NCA (β=0.5, constant)"),
        ("nca", {"method": "nca", "nca_gate_acc": 0.6}, None, "NCA (β=0.5, accuracy gate 0.6)"),
        ("anchor", {"method": "anchor_only", "beta": 0.5, "nca_start": 2}, None, "anchor only (β=0.5, from step 2)"),
        (
            "f",
            {"method": "nca", "follow_weight": 1.0, "nca_start": 30},
            None,
            "NCA (β=0.5, from step 30) + follow (w=1)",
        ),
        (
            "ta_opd",
            {"method": "opd", "selector": "ta_opd", "budget": 0.1, "k": 2},
            0.1234,
            "TA-OPD (ρ=0.10, K=2, kept 0.12)",
        ),
        ("ta_opd", {"method": "opd", "selector": "ta_opd", "budget": 0.1}, None, "TA-OPD (ρ=0.10, kept n/a)"),
        ("nca_lora", {"method": "nca", "nca_start": 5, "lora_rank": 8}, None, "NCA (β=0.5, from step 5), LoRA r=8"),
        ("opd", {"method": "opd", "lora_rank": 8}, None, "OPD, LoRA r=8"),
        ("mine", {"method": "dual_opd"}, None, "mine"),
    ],
)
def test_the_built_in_labels_read_as_before(name, over, kept, label):
    assert method_label(name, over, kept) == label


def test_labels_for_marks_twins_with_their_role(tmp_path):
    labels = labels_for(tmp_path, {"a": {"method": "nca"}, "b": {"method": "nca"}, "opd": {"method": "opd"}})
    assert labels == {"base": "base", "a": "NCA (β=0.5, constant) [a]", "b": "NCA (β=0.5, constant) [b]", "opd": "OPD"}


def test_a_forward_kl_run_does_not_read_as_the_papers_opd():
    """`estimator: forward_full` (GKD's forward KL, an ablation) says so in the label; the reverse-KL estimators add
    nothing (their labels unchanged)."""
    from mechopd.pipeline.stages import method_label

    assert method_label("opd", {"method": "opd", "estimator": "forward_full"}) == "OPD (forward KL)"
    for est in ("full", "topk", "sampled"):
        assert method_label("opd", {"method": "opd", "estimator": est}) == "OPD"
    assert method_label("nca", {"method": "nca", "estimator": "forward_full"}).startswith("NCA (")
    assert "(forward KL)" in method_label("nca", {"method": "nca", "estimator": "forward_full"})


def test_a_bf16_rollout_run_does_not_read_as_on_policy_opd():
    """`rollout_dtype: bfloat16` (rollouts from a bfloat16 copy, off-policy by the cast) says so in the label, after
    the method's own words and a LoRA rank; the default adds nothing."""
    assert method_label("opd", {"method": "opd", "rollout_dtype": "bfloat16"}) == "OPD (bf16 rollouts)"
    assert method_label("opd", {"method": "opd", "rollout_dtype": "same"}) == "OPD"
    nca = method_label("nca", {"method": "nca", "rollout_dtype": "bfloat16", "lora_rank": 8})
    assert nca.startswith("NCA (β=0.5") and nca.endswith(" (bf16 rollouts)")
