"""Reading compiled HLO: the collectives XLA inserted, parsed from handwritten HLO text."""

from shardplan.fidelity.hlo import collective_summary, parse_collectives

# -- parse_collectives --------------------------------------------------------------------------

_HLO = "\n".join(
    [
        "HloModule jit_step, is_scheduled=true, num_partitions=8",
        "ENTRY %main {",
        "  %p = f32[4,8]{1,0} parameter(0)",
        "  %all-reduce = f32[4,8]{1,0} all-reduce(%p), channel_id=1, "
        "replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add, "
        'metadata={op_name="jit(f)/fc1.linear/dot_general" stack_frame_id=3}',
        "  %all-reduce.2 = (f32[16]{0}, bf16[2,3]{1,0}) all-reduce(%a, %b), channel_id=2, "
        "replica_groups=[2,4]<=[8], to_apply=%add",
        "  %all-gather.1 = f32[16,32]{0,1} all-gather(%x), channel_id=4, "
        "replica_groups=[4,2]<=[2,4]T(1,0), dimensions={1}",
        "  %all-gather = f32[16,64]{1,0} all-gather(%y), channel_id=5, "
        "replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0', 'axis_2'}, "
        "dimensions={0}",
        "  %reduce-scatter = s32[8]{0} reduce-scatter(%z), replica_groups={}, dimensions={0}, "
        "to_apply=%add",
        "  %all-to-all = f32[2,4]{1,0} all-to-all(%w), replica_groups={{0,1,2,3,4,5,6,7}}, "
        "dimensions={0}",
        "  ROOT %collective-permute = f32[16,16]{0,1} collective-permute(%v), channel_id=3, "
        "source_target_pairs={{0,0},{1,1},{2,4},{3,5},{4,2},{5,3},{6,6},{7,7}}",
        "  %ags = (f32[2]{0}, f32[8]{0}) all-gather-start(%q), replica_groups={{0,1,2,3}}, "
        "dimensions={0}",
        "  %agd = f32[8]{0} all-gather-done(%ags)",
        "  %not = f32[4] add(%all-reduce, %all-reduce)",
        "}",
    ]
)


def test_parse_collectives_on_handwritten_hlo():
    got = parse_collectives(_HLO)
    assert [(c.kind, c.bytes_per_device, c.group_size) for c in got] == [
        ("all-reduce", 128, 2),
        ("all-reduce", 16 * 4 + 6 * 2, 4),
        ("all-gather", 16 * 32 * 4, 2),
        ("all-gather", 16 * 64 * 4, 8),
        ("reduce-scatter", 32, 8),
        ("all-to-all", 32, 8),
        ("collective-permute", 16 * 16 * 4, 4),
        ("all-gather", 32, 4),
    ]
    assert got[0].op_name == "jit(f)/fc1.linear/dot_general" and got[0].instruction == "all-reduce"
    assert got[1].op_name == ""
    assert collective_summary(got)["all-reduce"] == (2, 128 + 76)
