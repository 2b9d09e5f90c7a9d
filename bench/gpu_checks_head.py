"""The fused loss head's checks of bench/gpu_check.py (run from there; see its docstring): `objectives.head` at
V = 151936 against the plain reference, the bare LM-head matmul floor and the logits path's `total_loss`. Each check
returns its table row (name, ok, value, seconds); gpu_check.py prints the table."""

from __future__ import annotations

import time

import torch

Row = tuple[str, bool | None, str, float]  # gpu_check.row's arguments: name, ok (None: skip), value, seconds


def check_loss_head(args) -> Row:
    """The fused loss head (objectives/head.py) at V = 151936 on the device: loss and gradient against the plain
    reference (float32), its time over a bare LM-head matmul forward + backward, peak memory over the reference's."""
    from mechopd.generate.scorer import to_logp
    from mechopd.objectives.divergences import nca_anchor, reverse_kl_full
    from mechopd.objectives.head import fused_head_loss

    dev, n, d, V = args.device, 1024, 2048, 151936
    if dev == "cpu":  # the script's own smoke test: small shapes
        n, d = 64, 64
    g = torch.Generator(device=dev).manual_seed(0)
    hx, hc, ht = (torch.randn(n, d, device=dev, generator=g) for _ in range(3))
    w, wt = (torch.randn(V, d, device=dev, generator=g) * d**-0.5 for _ in range(2))  # logits ~ N(0, 1)
    weights = torch.full((n,), 1.0 / n, device=dev)

    def timed(fn):
        torch.cuda.synchronize() if dev == "cuda" else None
        torch.cuda.reset_peak_memory_stats() if dev == "cuda" else None
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize() if dev == "cuda" else None
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
        return out, time.perf_counter() - t0, peak

    def run(kind):
        x, c, ww = hx.clone().requires_grad_(), hc.clone().requires_grad_(), w.clone().requires_grad_()
        if kind == "fused":
            loss = fused_head_loss(x, ww, ht, wt, weights, hc=c, beta=0.5, chunk=1024)[0]
        elif kind == "floor":
            loss = (x @ ww.T).sum()
        else:
            lq = to_logp((x @ ww.T)[None], 1.0)
            loss = (
                reverse_kl_full(lq, to_logp((ht @ wt.T)[None], 1.0))
                + 0.5 * nca_anchor(lq, to_logp((c @ ww.T)[None], 1.0))
            ).mean()
        loss.backward()
        return float(loss.detach()), x.grad

    t0 = time.time()
    res = {k: timed(lambda k=k: run(k)) for k in ("reference", "fused", "floor", "fused", "floor")}  # 2nd run kept
    (ref, g_ref), t_ref, m_ref = res["reference"]
    (got, g_got), t_f, m_f = res["fused"]
    t_floor = res["floor"][1]
    rel = abs(got - ref) / abs(ref)
    grel = float((g_got - g_ref).norm() / g_ref.norm())
    return (
        "fused loss head (NCA, V=151936)",
        rel < 1e-4 and grel < 1e-3,
        f"loss rel {rel:.1e}, grad rel {grel:.1e}; "
        f"time {t_f * 1e3:.1f} ms = {t_f / t_floor:.2f}x matmul floor, {t_f / t_ref:.2f}x reference; peak "
        f"{m_f:.2f} GiB = {m_f / m_ref:.2f}x reference",
        time.time() - t0,
    )


def check_head_estimators(args) -> Row:
    """The fused head's top-k (k 256, tail) and sampled OPD estimators and NCA on the device at V = 151936 against the
    logits path (`losses.method_terms` + `total_loss` on float32 log-probabilities): loss and gradient."""
    from mechopd.generate.scorer import to_logp
    from mechopd.objectives.head import fused_head_loss
    from mechopd.objectives.losses import LossInputs, TermOptions, method_terms, total_loss

    dev, n, d, V = args.device, 512, 2048, 151936
    if dev == "cpu":
        n, d = 32, 64
    g = torch.Generator(device=dev).manual_seed(1)
    hx, hc, ht = (torch.randn(n, d, device=dev, generator=g) for _ in range(3))
    w, wt = (torch.randn(V, d, device=dev, generator=g) * d**-0.5 for _ in range(2))
    y = torch.randint(0, V, (n,), device=dev, generator=g)
    mask = torch.ones(1, n, dtype=torch.bool, device=dev)
    t0, worst = time.time(), []
    for est in (dict(estimator="topk", topk=256, tail=True), dict(estimator="sampled")):
        grads = []
        for kind in ("logits", "fused"):
            x, c = hx.clone().requires_grad_(), hc.clone().requires_grad_()
            if kind == "fused":
                loss = fused_head_loss(
                    x,
                    w,
                    ht,
                    wt,
                    torch.full((n,), 1.0 / n, device=dev),
                    hc=c,
                    beta=0.5,
                    chunk=256,
                    options=TermOptions(**est),
                    tokens=y,
                ).loss
            else:
                lq, lc, lf = (to_logp((h @ m.T)[None], 1.0) for h, m in ((x, w), (c, w), (ht, wt)))
                inputs = LossInputs(student_nctx=lq, student_ctx=lc, teacher=lf, tokens=y[None]).with_tokens()
                loss = total_loss(method_terms("nca", 0.5, **est), inputs, mask).loss
            loss.backward()
            grads.append((float(loss.detach()), torch.cat([x.grad.flatten(), c.grad.flatten()])))
        (ref, g_ref), (got, g_got) = grads
        worst.append((est["estimator"], abs(got - ref) / abs(ref), float((g_got - g_ref).norm() / g_ref.norm())))
    ok = all(r < 1e-4 and gr < 1e-3 for _, r, gr in worst)
    return (
        "fused head estimators (NCA)",
        ok,
        "; ".join(f"{e}: loss rel {r:.1e}, grad rel {gr:.1e}" for e, r, gr in worst),
        time.time() - t0,
    )
