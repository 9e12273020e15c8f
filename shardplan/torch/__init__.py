"""Train your own PyTorch module under a plan: `parallelize` (DTensor parameters, the module's own
ATen program with the planned redistributions) and `to_torch_tp` (a plan as PyTorch's
tensor-parallel styles). Importing this package does not import torch; calling does.
"""

from __future__ import annotations

from shardplan.torch.parallelize import (
    ParallelInfo,
    check_same_graph,
    parallelize,
    parallelize_traced,
)

__all__ = ["ParallelInfo", "check_same_graph", "parallelize", "parallelize_traced"]
