"""The device mesh: axes (outermost = slowest link first), their prime rounds, and a machine.

Shape, axis names and rounds are the mesh's own; bandwidth per axis and FLOP rate come from the
Machine the mesh is bound to (`mesh.hardware`: a preset of `shardplan.hardware` named by
`machine`, `DEFAULT_MACHINE` unless one is named, or a user's own `Machine` value) and are kept
on the Mesh so the cost model reads one value (explicit per-axis bandwidths override the
machine's links, for what-if studies). `rounds` is computed once per Mesh.

Each axis of size n is factored into prime rounds in ascending order (8 -> 2,2,2; 6 -> 2,3;
12 -> 2,2,3), outer axes first. A round splits every device group into q parts over that
axis's links; the search makes one cut per operator per round. A mesh has at most
`checks.MAX_DEVICES` (2**20) devices, so trial division factors any axis in at most 2**10 steps;
parsing is linear in the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from shardplan import checks
from shardplan.errors import ArgumentError, MeshError
from shardplan.hardware import DEFAULT_MACHINE, MACHINES, Machine


@dataclass(frozen=True, slots=True)
class Round:
    """One step of the device recursion: split each device group q ways along `mesh_axis`."""

    index: int
    mesh_axis: int
    axis_name: str
    q: int
    bandwidth_bytes_per_s: float


def _sequence(x: object, what: str) -> tuple[object, ...]:
    """A tuple or list as a tuple (None and () mean "the default"); anything else a MeshError."""
    if x is None:
        return ()
    if not isinstance(x, (tuple, list)):
        raise MeshError(f"{what} must be a tuple (one entry per mesh axis), got {x!r}")
    return tuple(x)


def _positive(x: object) -> bool:
    """A positive finite number (not a bool): bandwidths, FLOP rates and budgets."""
    try:
        return checks.finite_number(x, "value") > 0
    except ArgumentError:
        return False


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


@dataclass(frozen=True, slots=True)
class Mesh:
    """Devices as a tuple of axes, outermost (slowest) first.

    Example: `Mesh((4, 8), ("node", "gpu"), (25e9, 300e9))` is 4 nodes x 8 GPUs.
    `memory_bytes` is the per-device budget used when a plan is asked to fit (None: unchecked).
    """

    shape: tuple[int, ...]
    names: tuple[str, ...] = ()
    bandwidth_bytes_per_s: tuple[float, ...] = ()
    memory_bytes: float | None = None
    flops_per_s: float | None = None
    """Dense FLOP/s per device; None: the machine's rate in its compute dtype."""
    machine: str | Machine = DEFAULT_MACHINE
    """The machine's name (a preset, or a user's Machine given here as a value)."""
    hardware: Machine | None = field(default=None, compare=False, repr=False)
    """The Machine itself; None: the preset named by `machine`."""
    _rounds: tuple[Round, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = checks.mesh_shape(self.shape)  # no coercion: Mesh('16') and Mesh((2.5,)) fail
        object.__setattr__(self, "shape", shape)
        names = _sequence(self.names, "mesh axis names") or default_names(len(shape))
        if (
            len(names) != len(shape)
            or len(set(names)) != len(names)
            or not all(isinstance(n, str) and n for n in names)
        ):
            raise MeshError(f"mesh axis names {names} must be unique, one per axis of {shape}")
        object.__setattr__(self, "names", names)
        hardware = _bound_machine(self.machine, self.hardware)
        object.__setattr__(self, "hardware", hardware)
        object.__setattr__(self, "machine", hardware.name)
        if self.flops_per_s is None:
            object.__setattr__(self, "flops_per_s", hardware.flops_per_s)
        bw = _sequence(self.bandwidth_bytes_per_s, "mesh bandwidths") or hardware.link_bandwidths(
            shape
        )
        if len(bw) != len(shape) or not all(_positive(b) for b in bw):
            raise MeshError(f"need one positive bandwidth per mesh axis {shape}, got {bw}")
        object.__setattr__(self, "bandwidth_bytes_per_s", tuple(float(b) for b in bw))
        if self.memory_bytes is not None and not _positive(self.memory_bytes):
            raise MeshError(f"per-device memory must be positive, got {self.memory_bytes}")
        if not _positive(self.flops_per_s):
            raise MeshError(f"FLOP rate must be positive, got {self.flops_per_s}")
        object.__setattr__(self, "_rounds", self._make_rounds())  # once: the search reads it often

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def rounds(self) -> tuple[Round, ...]:
        return self._rounds

    def _make_rounds(self) -> tuple[Round, ...]:
        out: list[Round] = []
        for axis, n in enumerate(self.shape):
            for q in _prime_factors(n):
                out.append(
                    Round(len(out), axis, self.names[axis], q, self.bandwidth_bytes_per_s[axis])
                )
        return tuple(out)

    def text(self) -> str:
        return "x".join(str(s) for s in self.shape)

    def with_memory(self, memory_bytes: float | None) -> Mesh:
        return replace(self, memory_bytes=memory_bytes)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "shape": list(self.shape),
            "names": list(self.names),
            "bandwidth_bytes_per_s": list(self.bandwidth_bytes_per_s),
            "memory_bytes": self.memory_bytes,
            "flops_per_s": self.flops_per_s,
            "machine": self.machine,
        }
        if MACHINES.get(self.machine) != self.hardware:  # a user's machine travels with the plan
            assert self.hardware is not None
            out["hardware"] = self.hardware.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Mesh:
        try:
            hw = data.get("hardware")
            machine = Machine.from_dict(hw) if hw is not None else str(  # type: ignore[arg-type]
                data.get("machine", DEFAULT_MACHINE)
            )
            return cls(
                tuple(data["shape"]),
                tuple(data["names"]),  # type: ignore[arg-type]
                tuple(data["bandwidth_bytes_per_s"]),  # type: ignore[arg-type]
                data.get("memory_bytes"),
                float(data["flops_per_s"]),  # type: ignore
                machine,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise MeshError(f"mesh JSON {repr(data)[:200]} is malformed: {e}") from e


def _bound_machine(machine: object, hardware: Machine | None) -> Machine:
    """The Machine a mesh is bound to: a Machine value as given, else the preset named."""
    if isinstance(machine, Machine):
        return machine
    if hardware is not None and isinstance(hardware, Machine) and hardware.name == machine:
        return hardware
    if not isinstance(machine, str) or machine not in MACHINES:
        raise MeshError(
            f"unknown machine {machine!r}; choose one of {sorted(MACHINES)} or pass a "
            "shardplan.hardware.Machine (--machine FILE.json on the command line)"
        )
    return MACHINES[machine]


def default_names(rank: int) -> tuple[str, ...]:
    if rank == 1:
        return ("dev",)
    if rank == 2:
        return ("node", "gpu")
    return tuple(f"axis{i}" for i in range(rank))


_MESH_TEXT = re.compile(r"^\s*\d+(\s*[x×*,]\s*\d+)*\s*$")


def parse_mesh(
    text: str | int | Mesh,
    machine: str | Machine = DEFAULT_MACHINE,
    memory_bytes: float | None = None,
    names: tuple[str, ...] = (),
) -> Mesh:
    """Parse `"8"`, `"2x8"`, `"4x8"`, `"3x4"` (also `4,8`) into a Mesh with `machine`'s constants
    (`hardware.DEFAULT_MACHINE`, "a100", unless named). A Mesh is returned as it is.

    A single axis larger than the machine's node (e.g. 1024 GPUs) is read as a flat axis of
    inter-node links.
    """
    if isinstance(text, Mesh):
        return text
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise MeshError(
            f"mesh must be a Mesh, a whole number of devices or text like '2x8', got {text!r} "
            f"({type(text).__name__})"
        )
    spec = _bound_machine(machine, None)
    raw = str(text)
    if len(raw) > 100 or not _MESH_TEXT.match(raw):
        raise MeshError(
            f"cannot parse mesh {raw[:50]!r}; write axis sizes like '8', '2x8' or '4x8'"
        )
    shape = tuple(int(s) for s in re.split(r"[x×*,]", raw.replace(" ", "")))
    if any(s < 1 for s in shape):
        raise MeshError(f"mesh {raw!r}: every axis size must be >= 1")
    shape = checks.mesh_shape(shape, f"mesh {raw!r}")
    return Mesh(shape, names, spec.link_bandwidths(shape), memory_bytes, spec.flops_per_s, spec)


def parse_bytes(text: str | float | int) -> float:
    """Parse `80GB`, `16GiB`, `512MB`, `100B` or a positive number of bytes (see
    `checks.memory_bytes`: text needs a unit, NaN / infinity / <= 0 are refused)."""
    return checks.memory_bytes(text)
