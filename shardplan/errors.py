"""Typed errors of shardplan: every message names the object at fault and says what to do.

Hierarchy: ShardplanError > {ArgumentError, IRError > (SignatureError, ShapeError, CycleError),
MeshError, PlanError, InfeasibleError, UnsupportedOpError, UnknownModelError,
MissingDependencyError, SolverError, BackendError}. The CLI maps each class to an exit code
(docs/errors.md lists them).
"""

from __future__ import annotations


class ShardplanError(Exception):
    """Base class of every error shardplan raises on purpose."""

    exit_code = 1


class ArgumentError(ShardplanError):
    """An argument of a public function or CLI flag has the wrong type or value (named)."""

    exit_code = 2


class IRError(ShardplanError):
    """The graph or one of its operators is malformed."""

    exit_code = 3


class SignatureError(IRError):
    """An operator's einsum-like signature is inconsistent (names, kinds, groups)."""


class ShapeError(IRError):
    """A tensor's shape disagrees with the loop-dim extents of an operator that uses it."""


class CycleError(IRError):
    """The graph has a cycle (an operator depends on its own output)."""


class MeshError(ShardplanError):
    """The mesh text or mesh parameters are invalid."""

    exit_code = 4


class PlanError(ShardplanError):
    """A plan is invalid for its graph and mesh (bad cut, wrong number of rounds, bad JSON)."""

    exit_code = 5


class InfeasibleError(ShardplanError):
    """No plan fits the constraints (e.g. the per-device memory budget)."""

    exit_code = 6


class UnsupportedOpError(ShardplanError):
    """An operator kind (or framework op) has no entry in the catalogue or a translation table."""

    exit_code = 7


class UnknownModelError(ShardplanError):
    """A model name is not in the zoo."""

    exit_code = 2


class MissingDependencyError(ShardplanError):
    """An optional framework (jax, torch, onnx, matplotlib) is needed but not installed."""

    exit_code = 8


class SolverError(ShardplanError):
    """A search method failed, was unknown, or hit its limit without a plan."""

    exit_code = 9


class BackendError(ShardplanError):
    """Running a plan on an engine (JAX, torch.distributed) failed."""

    exit_code = 10


class NothingSplitWarning(UserWarning):
    """A plan leaves mesh axes unused (every op replicated across them) or shards no parameter:
    the devices hold copies of the model. The message says why and how to get a split."""
