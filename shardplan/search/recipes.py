"""Moved to `shardplan.search.step.recipes` (issue 22); this name stays importable."""

from shardplan.search.step.recipes import megatron_recipe

__all__ = ["megatron_recipe"]
