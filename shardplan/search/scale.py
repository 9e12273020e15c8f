"""Moved to `shardplan.search.step` (issue 22); this name stays importable for existing scripts."""

from shardplan.search.step.search import plan_training

__all__ = ["plan_training"]
