"""Generation layer, below both training and analysis: the lean KV-cache decoder (`lean`), the one sampler with
per-row seeds and the game driver (`sampler`), and the one scorer that turns a two-view batch into aligned
log-probabilities (`scorer`). `mechopd.train`, `mechopd.evaluation.evaluate` and every probe call it; it imports none of them."""
