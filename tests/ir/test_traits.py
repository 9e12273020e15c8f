"""Op-kind traits: every traited kind is a catalogue kind, and the operand/dim references the
traits make exist in that kind's signature (checked on small real ops)."""

from shardplan import zoo
from shardplan.ir.catalogue import CATALOGUE
from shardplan.ir.dims import DimKind
from shardplan.ir.traits import KIND_TRAITS, OPAQUE_KIND, Trait, has_trait, traits_of


def test_traited_kinds_exist():
    assert set(KIND_TRAITS) - {OPAQUE_KIND} <= set(CATALOGUE)


def test_unlisted_kinds_have_no_traits():
    assert traits_of("linear").traits == frozenset()
    assert not has_trait("linear", Trait.NORMALISES)


def _ops_by_kind():
    ops = {}
    for name in ("gpt2-small", "resnet50", "bert-base"):
        for op in zoo.build(name, small=True).ops:
            ops.setdefault(op.kind, op)
    return ops


def test_trait_references_match_signatures():
    ops = _ops_by_kind()
    checked = 0
    for kind, traits in KIND_TRAITS.items():
        op = ops.get(kind)
        if op is None:
            continue
        if traits.index is not None:
            ix = traits.index
            assert ix.position < len(op.inputs) and ix.bound_operand < len(op.inputs)
            assert op.signature.inputs[ix.bound_operand][ix.bound_dim]  # a real tensor dim
        if Trait.STATISTICS_OVER_PARALLEL in traits:
            kept = op.signature.inputs[0][traits.statistics_kept][0]
            others = [d for d in op.signature.loop_dims if d.name != kept]
            assert others and all(d.kind is DimKind.PARALLEL for d in others)
        if Trait.SCALE_OPERAND in traits:
            assert len(op.inputs) > 1
        checked += 1
    assert checked >= 7  # layer_norm, batch_norm, softmax, cross_entropy, embedding, reshape, relu
