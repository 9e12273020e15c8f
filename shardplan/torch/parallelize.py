"""`parallelize`: the user's own `nn.Module` trained under a plan, with DTensor parameters.

Algorithm (one pass at set-up, one interpreter pass per forward):
1. `trace_torch` exports the module and imports it as `from_torch` does (the same program: one
   path for planning and running), keeping FX node name -> graph tensor name(s). The plan is
   made for that graph (or a given plan is checked to be for it: same tensor names and shapes).
2. Every planned tensor gets DTensor placements (`shardplan.exporters.dtensor.placement_texts`,
   one per ROUND). When the rounds of every mesh axis agree for every tensor (the same dim split,
   or all replicated, or all partial), the placements collapse onto the user's mesh axes
   (`shardplan.exporters.axes`) and the user's `DeviceMesh` is used as is; otherwise a
   round-shaped DeviceMesh (one dim per prime round, `r0`, `r1`, ...) is derived from the same
   ranks in the same order, because one mesh dim cannot say "batch in round 1, hidden in round 2".
3. Parameters are replaced, in place and under their own names, by `nn.Parameter(DTensor)` at
   their planned homes (`distribute_tensor`, which sends rank 0's values); a gradient hook
   redistributes each gradient to its parameter's placements (the plan's gradient all-reduce or
   reduce-scatter), so any `torch.optim` optimizer sees matching placements.
4. `forward` runs the decomposed FX graph node by node on DTensors, with the user's own ATen ops:
   each input of a node is redistributed to the placements its planned consumer op reads
   (`operand_layout` of the op the importer emitted for that node), each result to the planned
   placements of its tensor (a partial sum the plan leaves partial stays partial). DTensor's own
   sharding rules then run the op, so a node the plan does not map (views, folded constants)
   still computes the right value. Plain tensors mixed with DTensors (buffers, masks, `arange`)
   become replicated DTensors. User inputs are taken whole on every rank and sliced locally;
   outputs are returned whole (`full_tensor()`, differentiable), in the module's own structure.

Costs: set-up O(|nodes| + |params|) plus one export; a forward is O(|nodes|) dispatches plus the
collectives of the redistributions. Autograd records the DTensor ops, so `loss.backward()` works.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import PlanError, ShardplanError
from shardplan.exporters.axes import collapse_texts
from shardplan.exporters.dtensor import placement_texts, to_placements
from shardplan.importers.torch import CHECK_OPS
from shardplan.ir.op import Role
from shardplan.lazy import require
from shardplan.mesh import Mesh, parse_mesh
from shardplan.plans import Plan
from shardplan.sharding import operand_layout
from shardplan.torch._ranks import agree, failed
from shardplan.torch._rewrites import RANDOM, REWRITES

_READ_TEXT = {-1: "R"}


def _torch() -> Any:
    return require(
        "torch", "torch.distributed.tensor", extra="torch", user="shardplan.torch.parallelize"
    )


@dataclass(frozen=True)
class ParallelInfo:
    """What `parallelize` attached to the module (as `module.shardplan`).

    Attributes:
        plan: the plan the module runs.
        device_mesh: the DeviceMesh its DTensors live on.
        per_round: True when the mesh is round-shaped (the plan is not expressible on the mesh
            axes), False when it is the user's mesh with its own axis names.
        placements: graph tensor name -> placement strings per mesh dim of `device_mesh`.
        unmapped: FX nodes of the program the plan has no tensor for (run by DTensor's rules).
    """

    plan: Plan
    device_mesh: Any
    per_round: bool
    placements: Mapping[str, tuple[str, ...]] = field(repr=False)
    unmapped: tuple[str, ...] = ()


def parallelize(
    module: Any,
    example_args: Sequence[Any] = (),
    example_kwargs: dict[str, Any] | None = None,
    *,
    mesh: Mesh | str | int | None = None,
    plan: Plan | None = None,
    device_mesh: Any = None,
    **plan_options: Any,
) -> Any:
    """Run `module` under a plan on the current torch.distributed world; returns `module` itself.

    Args:
        module: the user's `nn.Module`; its parameters are replaced in place by DTensor
            parameters with the same names (`state_dict()` keys unchanged).
        example_args, example_kwargs: the inputs of one forward; shapes are baked in (later
            calls must use the same shapes, else PlanError naming the input).
        mesh: the shardplan mesh to plan for (`"2x2"`, a `Mesh`); default: the DeviceMesh's
            shape and axis names, else one axis of the world size.
        plan: a plan made for this module's graph (e.g. `shardplan.plan(from_torch(module,
            args), ...)`); default: `shardplan.plan(graph, mesh, **plan_options)`.
        device_mesh: the user's `DeviceMesh` (shape = the mesh's); default: one is made over
            all ranks (`init_device_mesh("cpu", ...)`).
        plan_options: passed to `shardplan.plan` (method, memory, train, preset, optimizer).

    Raises:
        PlanError: the plan is for another graph, or the mesh does not match the world.
        UnsupportedOpError: the module has an ATen op the importer cannot translate.
    """
    torch = _torch()
    from shardplan.importers.torch import trace_torch

    _require_world(torch)
    failure: BaseException | None = None
    try:
        trace = trace_torch(module, example_args, example_kwargs)
        if plan is None:
            from shardplan.search.api import plan as make_plan

            graph = trace.result.graph
            plan = make_plan(graph, _plan_mesh(torch, mesh, device_mesh), **plan_options)
        elif plan_options:
            raise PlanError(
                f"parallelize: plan options {sorted(plan_options)} are for planning; a given "
                "plan is used as is"
            )
    except Exception as e:  # every rank must hear of it before any rank enters a collective
        failure = e
    return _set_up(torch, module, trace if failure is None else None, plan, device_mesh, failure)


def parallelize_traced(module: Any, trace: Any, plan: Plan, device_mesh: Any = None) -> Any:
    """`parallelize` with the module already traced (`trace_torch(module, ...)`), e.g. to plan
    its graph first without exporting twice."""
    torch = _torch()
    _require_world(torch)
    return _set_up(torch, module, trace, plan, device_mesh, None)


def _set_up(
    torch: Any,
    module: Any,
    trace: Any,
    plan: Plan | None,
    device_mesh: Any,
    failure: BaseException | None,
) -> Any:
    """Check the plan against the trace and the world, agree with every rank (`_ranks.agree`)
    on success, the plan and a dropout seed, then distribute and install the runner."""
    from shardplan.search.api import warn_if_nothing_split

    if failure is None:
        try:
            assert plan is not None
            check_same_graph(trace.result.graph, plan.graph)
            warn_if_nothing_split(plan, "parallelize")
            world = torch.distributed.get_world_size()
            if plan.mesh.size != world:
                raise PlanError(
                    f"parallelize: the plan's mesh {plan.mesh.text()} has {plan.mesh.size} "
                    f"devices but the process group has {world} ranks"
                )
        except Exception as e:
            failure = e
    seed = agree(torch, failure, plan)
    assert plan is not None
    dmesh, per_round, texts = _device_mesh(torch, plan, device_mesh)
    info = ParallelInfo(plan, dmesh, per_round, texts, _unmapped(trace))
    _distribute_parameters(torch, module, trace, info)
    runner = _Runner(torch, trace, info, module, seed)
    # an instance attribute: nn.Module.__call__ (hooks included) calls it in place of forward
    module.forward = runner
    module.shardplan = info
    return module


def _require_world(torch: Any) -> None:
    if not torch.distributed.is_initialized():
        raise PlanError(
            "parallelize needs an initialized torch.distributed process group: call "
            "torch.distributed.init_process_group(...) in every process first (torchrun does "
            "the environment for you)"
        )


def _plan_mesh(torch: Any, mesh: Any, device_mesh: Any) -> Mesh:
    if mesh is not None:
        return parse_mesh(mesh)
    if device_mesh is not None:
        names = device_mesh.mesh_dim_names or ()
        return Mesh(tuple(device_mesh.mesh.shape), tuple(names))
    return parse_mesh(torch.distributed.get_world_size())


def check_same_graph(got: Any, want: Any) -> None:
    """PlanError naming the first tensor that differs unless `want` is `got`'s graph."""
    for name, t in want.tensors.items():
        other = got.tensors.get(name)
        if other is None or other.shape != t.shape:
            found = "missing" if other is None else str(other.shape)
            raise PlanError(
                f"parallelize: the plan was made for another graph: tensor {name!r} is "
                f"{t.shape} in the plan but {found} in this module's export; plan "
                "from_torch(module, example_args) with the same example inputs"
            )
    if len(got.ops) != len(want.ops):
        raise PlanError(
            f"parallelize: the plan has {len(want.ops)} ops, this module's export "
            f"{len(got.ops)}; plan from_torch(module, example_args)"
        )


def _device_mesh(torch: Any, plan: Plan, device_mesh: Any) -> tuple[Any, bool, dict[str, Any]]:
    """The DeviceMesh and every tensor's placement strings on it (see the module docstring)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    rounds = plan.mesh.rounds
    per_round_texts = _all_texts(plan)
    shape = plan.mesh.shape
    if device_mesh is not None and tuple(device_mesh.mesh.shape) != shape:
        raise PlanError(
            f"parallelize: the DeviceMesh has shape {tuple(device_mesh.mesh.shape)} but the "
            f"plan's mesh is {plan.mesh.text()}; give a DeviceMesh of shape {shape}"
        )
    collapsed = {n: collapse_texts(t, plan.mesh) for n, t in per_round_texts.items()}
    if rounds and all(c is not None for c in collapsed.values()):
        if device_mesh is None:
            names = plan.mesh.names
            device_mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        return device_mesh, False, dict(collapsed)  # type: ignore[arg-type]
    round_shape = tuple(r.q for r in rounds) or (1,)
    names = tuple(f"r{r.index}" for r in rounds) or ("r0",)
    texts = per_round_texts if rounds else {n: ("R",) for n in per_round_texts}
    if device_mesh is None:
        return init_device_mesh("cpu", round_shape, mesh_dim_names=names), True, texts
    ranks = device_mesh.mesh.reshape(round_shape)  # row-major: the same rank at the same place
    return DeviceMesh(device_mesh.device_type, ranks, mesh_dim_names=names), True, texts


def _all_texts(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Placements of every tensor, plus `op@i` -> what op reads as operand i (never partial)."""
    texts = dict(placement_texts(plan))
    for op in plan.graph.ops:
        strategy = tuple(plan.strategies[op.name])
        for i in range(len(op.inputs)):
            layout = operand_layout(op, strategy, i)
            texts[f"{op.name}@{i}"] = tuple(_READ_TEXT.get(s, f"S({s})") for s in layout)
    return texts


def _unmapped(trace: Any) -> tuple[str, ...]:
    return tuple(
        n.name
        for n in trace.program.graph.nodes
        if n.op == "call_function" and n.name not in trace.values
    )


def _distribute_parameters(torch: Any, module: Any, trace: Any, info: ParallelInfo) -> None:
    """Replace each parameter (tied ones once) by a DTensor parameter at its planned home."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    from torch.export.graph_signature import InputKind

    node_of = {
        s.target: s.arg.name
        for s in trace.program.graph_signature.input_specs
        if s.kind is InputKind.PARAMETER
    }
    ndims = info.device_mesh.ndim
    groups: dict[int, list[str]] = {}
    params: dict[int, Any] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
        params[id(p)] = p
    for key, names in groups.items():
        p = params[key]
        if isinstance(p, DTensor):
            raise PlanError(f"parallelize: parameter {names[0]!r} is already a DTensor")
        tensor = next((trace.values.get(node_of[n]) for n in names if n in node_of), None)
        placements = (
            to_placements(info.placements[tensor])
            if tensor in info.placements
            else (Replicate(),) * ndims
        )
        value = distribute_tensor(p.detach(), info.device_mesh, placements)
        new = torch.nn.Parameter(value, requires_grad=p.requires_grad)
        if p.requires_grad:
            new.register_hook(_grad_to(new))
        for name in names:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, leaf, new)


def _grad_to(param: Any) -> Any:
    mesh, placements = param.device_mesh, tuple(param.placements)

    def hook(grad: Any) -> Any:
        # the plan's gradient sync: a partial gradient is all-reduced / reduce-scattered here
        if tuple(grad.placements) == placements:
            return grad
        return grad.redistribute(mesh, placements)

    return hook


class _Runner:
    """The forward of a parallelized module: the decomposed program on DTensors."""

    def __init__(
        self, torch: Any, trace: Any, info: ParallelInfo, module: Any, seed: int = 0
    ) -> None:
        from torch.export.graph_signature import InputKind, OutputKind

        self.torch, self.info, self.module = torch, info, module
        self.seed, self.calls = seed, 0  # random ops draw from (seed, call, node): same per rank
        ep = trace.program
        self.program = ep
        self.graph_module = ep.graph_module
        self.nodes = list(ep.graph.nodes)
        self.values = trace.values
        self.in_spec, self.out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
        sig = ep.graph_signature
        self.bindings = {s.arg.name: (s.kind, s.target) for s in sig.input_specs}
        self.user_inputs = [s.arg.name for s in sig.input_specs if s.kind is InputKind.USER_INPUT]
        self.outputs = [(s.kind, s.target) for s in sig.output_specs]
        self.user_output = OutputKind.USER_OUTPUT
        self.buffer_mutation = OutputKind.BUFFER_MUTATION
        self.kinds = InputKind
        graph = trace.result.graph
        self.shapes = {n: t.shape for n, t in graph.tensors.items()}
        self.reads = _reads(graph, self.nodes, self.values)
        self.expected = {
            n.name: tuple(n.meta["val"].shape)
            for n in self.nodes
            if n.op == "placeholder" and hasattr(n.meta.get("val"), "shape")
        }
        self.roles = {n: t.role for n, t in graph.tensors.items()}
        self._cache: dict[str, Any] = {}
        self.fallbacks: set[str] = set()
        """Nodes run on whole tensors because DTensor has no sharding rule for their op."""

    # -- placements ----------------------------------------------------------------------------
    def placements(self, key: str) -> Any:
        if key not in self._cache:
            self._cache[key] = to_placements(self.info.placements[key])
        return self._cache[key]

    def dtensor(self, value: Any) -> Any:
        """A plain tensor as a replicated DTensor (the same value on every rank)."""
        from torch.distributed.tensor import DTensor, Replicate

        mesh = self.info.device_mesh
        return DTensor.from_local(value, mesh, (Replicate(),) * mesh.ndim, run_check=False)

    def redistribute(self, value: Any, placements: Sequence[Any], keep_partial: bool) -> Any:
        target = tuple(
            cur if keep_partial and want.is_partial() and not cur.is_partial() else want
            for cur, want in zip(value.placements, placements, strict=True)
        )
        if keep_partial:  # a partial with another reducer is left as DTensor made it
            target = tuple(
                cur if cur.is_partial() and want.is_partial() else want
                for cur, want in zip(value.placements, target, strict=True)
            )
        if tuple(value.placements) == target:
            return value
        return value.redistribute(self.info.device_mesh, target)

    # -- one forward ---------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        torch = self.torch
        from torch.distributed.tensor import DTensor
        from torch.export._tree_utils import reorder_kwargs
        from torch.utils import _pytree as pytree

        flat, spec = pytree.tree_flatten((args, reorder_kwargs(kwargs, self.in_spec)))
        if spec != self.in_spec:
            raise PlanError(
                "the parallelized module was called with another input structure than its "
                f"example inputs: got {spec}, expected {self.in_spec}"
            )
        env: dict[Any, Any] = {}
        inputs = dict(zip(self.user_inputs, flat, strict=True))
        self.calls += 1
        for node in self.nodes:
            if node.op == "placeholder":
                env[node] = self._bind(node, inputs)
            elif node.op == "get_attr":
                env[node] = getattr(self.graph_module, node.target)
            elif node.op == "call_function" and str(node.target) in CHECK_OPS:
                env[node] = None  # shape checks of the export; the program has no use for them
            elif node.op == "call_function":
                try:
                    env[node] = self._call(node, env, torch, DTensor)
                except Exception as e:
                    raise failed(torch, node, e) from e
            elif node.op == "output":
                try:  # gathering the outputs is a collective too: a peer's failure ends it here
                    return self._outputs(node, env, DTensor, pytree)
                except Exception as e:
                    raise failed(torch, node, e) from e
        raise ShardplanError("the exported program has no output node")  # pragma: no cover

    def _bind(self, node: Any, inputs: Mapping[str, Any]) -> Any:
        kind, target = self.bindings.get(node.name, (self.kinds.USER_INPUT, None))
        if kind is self.kinds.PARAMETER:
            return self.module.get_parameter(target)
        if kind is self.kinds.BUFFER:
            return self.module.get_buffer(target)
        if kind is self.kinds.CONSTANT_TENSOR:
            return self.program.constants[target]
        if kind is not self.kinds.USER_INPUT:
            return self.program.constants.get(target)
        value = inputs[node.name]
        if not isinstance(value, self.torch.Tensor):
            return value
        want = self.expected.get(node.name)
        if want is not None and tuple(value.shape) != want:
            raise PlanError(
                f"input {node.name!r} has shape {tuple(value.shape)} but the module was "
                f"parallelized for {want}; parallelize again with inputs of the new shape"
            )
        tensor = self.values.get(node.name)
        if tensor is None or tensor not in self.info.placements:
            return value
        # every rank holds the whole input: Replicate -> Shard is a local slice, no message
        return self.dtensor(value).redistribute(self.info.device_mesh, self.placements(tensor))

    def _call(self, node: Any, env: dict[Any, Any], torch: Any, dtensor_type: Any) -> Any:
        from torch.fx import Node
        from torch.fx.node import map_aggregate

        reads = self.reads.get(node.name, {})
        found: list[Any] = []

        def read(arg: Any) -> Any:
            if not isinstance(arg, Node):
                return arg
            value = env[arg]
            key = reads.get(arg.name)
            planned = self.shapes.get(self.values.get(arg.name, ""))
            if key is not None and isinstance(value, dtensor_type) and value.shape == planned:
                value = self.redistribute(value, self.placements(key), keep_partial=False)
            if isinstance(value, (torch.Tensor, dtensor_type)):
                found.append(value)
            return value

        args = map_aggregate(node.args, read)
        kwargs = map_aggregate(node.kwargs, read)
        if any(isinstance(v, dtensor_type) for v in found) and not all(
            isinstance(v, dtensor_type) for v in found
        ):
            # constants computed on every rank alike (masks, positions) join as replicated
            def lift(v: Any) -> Any:
                plain = isinstance(v, torch.Tensor) and not isinstance(v, dtensor_type)
                return self.dtensor(v) if plain else v

            args, kwargs = map_aggregate(args, lift), map_aggregate(kwargs, lift)
        target = REWRITES.get(str(node.target), node.target) if found else node.target
        random_op = RANDOM.get(str(node.target))
        if random_op is not None:  # eval mode honoured; one mask per (seed, call, node)
            key = (self.seed * 1_000_003 + self.calls * 7919 + zlib.crc32(node.name.encode())) % (
                2**63
            )  # crc32, not hash(): Python salts str hashes per process
            kwargs = {**kwargs, "training": self.module.training, "seed": key}
            target = random_op
        try:
            out = target(*args, **kwargs)
        except NotImplementedError as e:
            if "sharding strategy" not in str(e):
                raise
            out = self._replicated(node, args, kwargs, dtensor_type)
        else:
            if isinstance(out, dtensor_type) and _invalid(out):
                # DTensor's rule gave a placement the result cannot have (e.g. Shard(0) on the
                # 0-d result of `sum(x, dim=[])`): compute that node on whole tensors instead
                out = self._replicated(node, args, kwargs, dtensor_type)
        return self._place(node.name, out, dtensor_type)

    def _replicated(self, node: Any, args: Any, kwargs: Any, dtensor_type: Any) -> Any:
        """An op DTensor has no sharding rule for runs on whole tensors (all-gathered); the
        node is listed in `fallbacks` so that the cost is not hidden."""
        from torch.fx.node import map_aggregate

        self.fallbacks.add(f"{node.name} ({node.target})")

        def whole(v: Any) -> Any:
            return v.full_tensor() if isinstance(v, dtensor_type) else v

        out = node.target(*map_aggregate(args, whole), **map_aggregate(kwargs, whole))
        lift = lambda v: self.dtensor(v) if isinstance(v, self.torch.Tensor) else v  # noqa: E731
        return map_aggregate(out, lift)

    def _place(self, name: str, out: Any, dtensor_type: Any) -> Any:
        tensors = self.values.get(name)
        if tensors is None:
            return out
        if isinstance(tensors, str):
            return self._to_planned(tensors, out, dtensor_type)
        if isinstance(out, (tuple, list)):
            placed = [
                self._to_planned(t, v, dtensor_type) if t is not None else v
                for t, v in zip(tensors, out, strict=False)
            ]
            return type(out)(placed) if isinstance(out, tuple) else placed
        return out

    def _to_planned(self, tensor: str, value: Any, dtensor_type: Any) -> Any:
        if not isinstance(value, dtensor_type) or tensor not in self.info.placements:
            return value
        if tuple(value.shape) != self.shapes.get(tensor):
            return value
        return self.redistribute(value, self.placements(tensor), keep_partial=True)

    def _outputs(self, node: Any, env: dict[Any, Any], dtensor_type: Any, pytree: Any) -> Any:
        results = node.args[0]
        user: list[Any] = []
        for (kind, target), arg in zip(self.outputs, results, strict=True):
            value = env[arg] if hasattr(arg, "op") else arg
            if isinstance(value, dtensor_type):
                value = value.full_tensor()
            if kind is self.user_output:
                user.append(value)
            elif kind is self.buffer_mutation:
                with self.torch.no_grad():
                    self.module.get_buffer(target).copy_(value)
            else:
                raise PlanError(
                    f"parallelize: the exported program has an output of kind {kind} "
                    f"({target!r}); only user outputs and buffer updates are supported"
                )
        return pytree.tree_unflatten(user, self.out_spec)


def _invalid(value: Any) -> bool:
    return any(p.is_shard() and p.dim >= value.dim() for p in value.placements)


def _reads(
    graph: Any, nodes: Sequence[Any], values: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    """FX node -> {input FX node -> the `op@i` key of the planned layout its op reads it in}.

    The ops emitted for node `n` are named `n`, `n:i` or `n/part`; the first of them that reads
    the input's graph tensor decides.
    """
    ops_of: dict[str, list[Any]] = {}
    for op in graph.ops:
        ops_of.setdefault(op.name.split("/")[0].split(":")[0], []).append(op)
    out: dict[str, dict[str, str]] = {}
    for node in nodes:
        # ops are named after the node's tensor, which carries the module path ("emb.embedding")
        made = values.get(node.name)
        key = made.split("/")[0].split(":")[0] if isinstance(made, str) else node.name
        if node.op != "call_function" or key not in ops_of:
            continue
        row: dict[str, str] = {}
        for parent in node.all_input_nodes:
            tensor = values.get(parent.name)
            if not isinstance(tensor, str) or graph.tensors[tensor].role is Role.CONSTANT:
                continue
            for op in ops_of[key]:
                if tensor in op.inputs:
                    row[parent.name] = f"{op.name}@{op.inputs.index(tensor)}"
                    break
        if row:
            out[node.name] = row
    return out


__all__ = ["ParallelInfo", "check_same_graph", "parallelize", "parallelize_traced"]
