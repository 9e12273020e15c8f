"""The symbolic, profiling-free cost model: every formula of shardplan lives in this package."""

from shardplan.cost.evaluate import CostBreakdown, OpCost, ScoreCache, evaluate_strategies
from shardplan.cost.presets import PRESETS, CostOptions, CostPreset, Optimizer, get_preset
from shardplan.cost.terms import CommTerms

__all__ = [
    "PRESETS",
    "CommTerms",
    "CostBreakdown",
    "CostOptions",
    "CostPreset",
    "OpCost",
    "Optimizer",
    "ScoreCache",
    "evaluate_strategies",
    "get_preset",
]
