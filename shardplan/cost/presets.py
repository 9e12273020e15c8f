"""Cost presets: the general "shardplan" model and D-Rec's published "mindspore" constants.

"shardplan": costs in seconds — bytes over the round's link bandwidth with ring collectives, plus
compute (a roofline of FLOPs and bytes over the cuts; in training plus each op's own backward,
`cost/backward.py`) at the mesh's FLOP rate.
"mindspore": D-Rec/SAPP as in reference-drec.md §3.8 — costs in elements, (q-1)/q of the tensor a
cut does not index, mu = 0.25 on parameter tensors (MATMUL_MEM_COEF), any layout mismatch costs
REDIS_COEF = 16 x the local tensor size, "no cut" costs (1.5 * cheapest cut)^2 / 350, no compute.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shardplan.errors import ShardplanError
from shardplan.ir.op import Role, Tensor
from shardplan.precision import Precision, get_precision


class Optimizer(enum.Enum):
    NONE = "none"
    SGD_MOMENTUM = "sgd-momentum"
    ADAM = "adam"

    @property
    def state_bytes_per_param(self) -> int:
        """fp32 optimizer state per parameter: Adam m and v, SGD's momentum buffer."""
        return {"none": 0, "sgd-momentum": 4, "adam": 8}[self.value]


@dataclass(frozen=True, slots=True)
class CostPreset:
    """Constants of one cost model; `symbolic=True` means D-Rec's element-count formulas."""

    name: str
    symbolic: bool
    param_coef: float = 1.0
    redis_coef: float = 16.0
    expert_coef: float = 1.5
    replicate_below: float = 350.0
    training_flops_factor: float = 3.0


PRESETS: dict[str, CostPreset] = {
    "shardplan": CostPreset("shardplan", symbolic=False),
    "mindspore": CostPreset("mindspore", symbolic=True, param_coef=0.25),
}


def get_preset(preset: str | CostPreset) -> CostPreset:
    if isinstance(preset, CostPreset):
        return preset
    if preset not in PRESETS:
        raise ShardplanError(f"unknown cost preset {preset!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]


@dataclass(frozen=True, slots=True)
class CostOptions:
    """What the evaluator and the search are asked to model."""

    preset: CostPreset = PRESETS["shardplan"]
    train: bool = True
    optimizer: Optimizer = Optimizer.ADAM
    precision: Precision | None = None
    """None: every tensor at its declared dtype_bytes (the graph's own widths)."""
    zero: int = 0
    """ZeRO stage 0-3 of the plan's parameter state (`cost/zero.py`); the searches price 0."""
    grad_sync_weight: float = 1.0
    """Weight of the gradient all-reduce, which runs once per step, against the per-micro-batch
    terms: 1 / m when a micro-batch graph of m is planned for the training step (D-Rec inside
    the step search), so its objective is the step's divided by m."""

    def element_bytes(self, t: Tensor) -> int:
        """Bytes per element the cost model prices `t` at: the precision's width for parameters
        and activations (a stage's received activation too); graph inputs and constants (token
        ids, masks) keep their own."""
        if self.precision is None or (t.role in (Role.INPUT, Role.CONSTANT) and not t.received):
            return t.dtype_bytes
        return self.precision.element_bytes

    def state_bytes_for(self, width: int) -> float:
        """Training bytes per parameter element stored `width` bytes wide: weight + gradient,
        the fp32 master copy under mixed precision, and the optimizer state."""
        master = self.precision.master_bytes if self.precision is not None else 0
        return 2 * width + master + self.optimizer.state_bytes_per_param

    def update_bytes_for(self, width: int) -> float:
        """Bytes the optimizer step reads and writes per parameter element stored `width` bytes
        wide: its fp32 state (master copy, optimizer state) read and written, the gradient read,
        the weight written (and read, when it is its own master). PyTorch's Adam/SGD and Apex's
        FusedAdam (Megatron-LM's optimizer) are element-wise passes over these tensors."""
        master = self.precision.master_bytes if self.precision is not None else 0
        fp32_state = master + self.optimizer.state_bytes_per_param
        return 2 * fp32_state + width + (width if master else 2 * width)

    def state_bytes(self, t: Tensor) -> float:
        """Bytes per element of parameter `t`: `state_bytes_for` its width in training, the
        weight alone in inference."""
        width = self.element_bytes(t)
        return self.state_bytes_for(width) if self.train else width

    @classmethod
    def make(
        cls,
        preset: str | CostPreset = "shardplan",
        train: bool = True,
        optimizer: str | Optimizer = "adam",
        dtype: str | Precision | None = None,
    ) -> CostOptions:
        if not isinstance(optimizer, Optimizer):
            try:
                optimizer = Optimizer(optimizer)
            except ValueError as e:
                raise ShardplanError(
                    f"unknown optimizer {optimizer!r}; choose one of {[o.value for o in Optimizer]}"
                ) from e
        precision = get_precision(dtype) if dtype is not None else None
        return cls(get_preset(preset), train, optimizer, precision)
