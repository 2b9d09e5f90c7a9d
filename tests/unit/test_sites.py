"""One naming table (mechopd.core.sites): residual sites, parameter sites and module resolution agree everywhere."""

from __future__ import annotations

import pytest

from mechopd.core.errors import ConfigError
from mechopd.core.sites import (
    MODULE_ORDER,
    module_kind,
    module_path,
    param_layer,
    resid_site,
    residual_sites,
    site_depth,
    site_layer,
    site_of,
    sites_for,
)
from mechopd.models import module_at
from mechopd.plots.layers import site_depth as plot_depth
from mechopd.probes.capture import all_sites, site_module
from tests.conftest import tiny_model


def test_residual_sites_in_forward_order():
    assert residual_sites(2) == ["embed", "layers.0.resid_post", "layers.1.resid_post", "final_norm"]
    assert [site_depth(s, 2) for s in residual_sites(2)] == [0, 1, 2, 3]
    assert [site_layer(s) for s in residual_sites(2)] == [None, 0, 1, None]
    assert resid_site(7) == "layers.7.resid_post" and site_layer(resid_site(7)) == 7
    assert sites_for(4, [-1, "embed", 0, "layers.0.resid_post"]) == [
        "embed",
        "layers.0.resid_post",
        "layers.3.resid_post",
    ]
    for bad in ([4], ["layers.x.resid_post"], []):
        with pytest.raises(ConfigError):
            sites_for(4, bad)
    with pytest.raises(ConfigError, match="residual-stream"):
        site_depth("layers.0.self_attn.q_proj", 4)


@pytest.mark.parametrize(
    "site, path",
    [
        ("embed", "model.embed_tokens"),
        ("final_norm", "model.norm"),
        ("lm_head", "lm_head"),
        ("layers.3.resid_post", "model.layers.3"),
        ("layers.3.self_attn.q_proj", "model.layers.3.self_attn.q_proj"),
    ],
)
def test_module_path(site, path):
    assert module_path(site) == path


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_every_site_resolves_to_the_module_hooks_and_deltas_use(organism_tokenizer, arch):
    model = tiny_model(organism_tokenizer, arch=arch, layers=3)
    assert all_sites(model) == residual_sites(3)
    for s in all_sites(model):  # residual-stream sites: the module whose output the capture hooks read
        assert module_at(model, s) is site_module(model, s)
    for name, p in model.named_parameters():  # parameter sites: the module holding the parameter
        s = site_of(name)
        assert getattr(module_at(model, s.site), s.param) is p, name
        assert (param_layer(name), module_kind(name)) == (s.layer, s.module)
        assert s.module in MODULE_ORDER or s.layer is None, name


def test_plots_read_depth_with_the_same_table():
    for s in residual_sites(5):
        assert plot_depth(s, None, 5) == site_depth(s, 5)
