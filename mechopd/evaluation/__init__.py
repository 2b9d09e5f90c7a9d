"""Evaluation in both views: the held-out evaluation, removability, context following, per-item records, pinned prompts."""
