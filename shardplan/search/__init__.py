"""Searches: D-Rec (default), exact ILP, the DP baseline, and expert plans.

`plan(graph, mesh, ...)` canonicalises a `shardplan.problem.Problem` and `solve(problem, method)`
dispatches it through `search.solvers.SOLVERS`.
"""

from shardplan.search.api import METHODS, plan, solve

__all__ = ["METHODS", "plan", "solve"]
