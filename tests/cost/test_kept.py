"""`cost.kept`: the kept tensors read once per graph price every plan as the rule read op by op
does; `zero_params`, `update_bytes` and `gradient_elements` with a memo kept across plans give
what they give without one."""

from __future__ import annotations

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.kept import kept_items, saved_bytes
from shardplan.cost.terms import round_numels
from shardplan.cost.zero import gradient_elements, update_bytes, zero_params
from shardplan.ir.op import Role
from shardplan.ir.traits import Saved, saved_for_backward
from shardplan.mesh import parse_mesh
from shardplan.search import experts
from shardplan.sharding import operand_layouts, resolved

OPTS = CostOptions.make(dtype="bf16")


def _plans():
    """Four models (AlexNet's dropout keeps masks, Llama's RoPE reads constant tables), three
    meshes, three plans."""
    for name in ("gpt3", "bert-base", "alexnet", "llama"):
        g = _small(name)
        for text in ("8", "2x3", "3x2x2"):
            mesh = parse_mesh(text)
            found = (experts.megatron(g, mesh), experts.data_parallel(g, mesh))
            mixed = {op.name: found[i % 2][op.name] for i, op in enumerate(g.ops)}
            for st in (*found, mixed):
                yield g, mesh, {k: tuple(v) for k, v in st.items()}


def _small(name):
    small = dict(zoo.MODELS[name].small)
    return zoo.build(name, **({**small, "layers": 2} if "layers" in small else small))


def _reference(g, st, rounds):
    """The rule read op by op: the first appearance of a kept tensor decides its layout."""
    out = {}
    produced = {n: resolved(lay) for op in g.ops for n, lay in
                zip(op.outputs, operand_layouts(op, st[op.name])[1], strict=True)}  # fmt: skip
    for op in g.ops:
        ins = operand_layouts(op, st[op.name])[0]
        rule = saved_for_backward(op.kind)
        wanted = []
        if rule is Saved.INPUTS:
            wanted = [(n, n, produced.get(n) or ins[i], None) for i, n in enumerate(op.inputs)
                      if g.tensors[n].role not in (Role.PARAMETER, Role.CONSTANT)]  # fmt: skip
        elif rule is Saved.OUTPUTS:
            wanted = [(n, n, produced[n], None) for n in op.outputs]
        elif rule is Saved.MASK:
            wanted = [(f"{n}:mask", n, produced[n], 1.0) for n in op.outputs]
        for key, n, layout, width in wanted:
            if key not in out:
                t = g.tensors[n]
                w = OPTS.element_bytes(t) if width is None else width
                out[key] = round_numels(t.numel, layout, rounds)[-1] * w
    return out


def test_saved_bytes_equal_the_rule_read_op_by_op_in_order():
    masks = 0
    for g, mesh, st in _plans():
        items = kept_items(g)
        assert len({i.key for i in items}) == len(items)  # each tensor once
        got = saved_bytes(g, st, mesh.rounds, OPTS, items=items)
        want = _reference(g, st, mesh.rounds)
        assert list(got) == list(want) and got == want
        assert saved_bytes(g, st, mesh.rounds, OPTS) == got  # items read here: the same
        masks += sum(k.endswith(":mask") for k in got)
    assert masks  # dropout masks were priced at a byte per element


def test_no_parameter_or_constant_is_kept():
    g = _small("llama")  # its RoPE tables are constants its multiplies read
    roles = {g.tensors[i.name].role for i in kept_items(g)}
    assert Role.PARAMETER not in roles and Role.CONSTANT not in roles


def test_zero_params_with_a_memo_across_plans_equal_those_without():
    for name in ("gpt3", "bert-base", "alexnet"):
        g = _small(name)
        for text in ("8", "2x3", "3x2x2"):
            mesh = parse_mesh(text)
            memo: dict = {}
            plans = [p for h, m, p in _plans() if h.name == g.name and m == mesh]
            for st in plans + plans[::-1]:  # the memo filled by other plans, then reused
                fresh = zero_params(g, mesh.rounds, st, True)
                assert zero_params(g, mesh.rounds, st, True, memo=memo) == fresh
                assert update_bytes(g, mesh.rounds, st, OPTS, fresh, memo) == update_bytes(
                    g, mesh.rounds, st, OPTS, fresh
                )
                assert gradient_elements(g, mesh.rounds, fresh, memo) == gradient_elements(
                    g, mesh.rounds, fresh
                )
            assert any(k[0] == "cut" for k in memo) and any(k[0] != "cut" for k in memo)
            listed = {k: list(v) for k, v in plans[0].items()}  # a caller's lists, as before
            assert zero_params(g, mesh.rounds, listed, True, memo=memo) == zero_params(
                g, mesh.rounds, plans[0], True
            )
