"""Test fixtures and slow references shared by the test suite and bench/ (`mechopd.testing.zoo`: tiny
real-architecture checkpoints; `coverage`, `coverage_design`: the claims' interval coverage, simulated)."""
