"""Test fixtures shared by the test suite and bench/ (`mechopd.testing.zoo`: tiny real-architecture checkpoints)."""
