"""Searches: D-Rec (default), exact ILP, the DP baseline, and expert plans."""

from shardplan.search.api import METHODS, plan

__all__ = ["METHODS", "plan"]
