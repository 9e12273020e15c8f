"""Feed exported configurations to the engines' own configuration code (run as a subprocess).

`python engine_checks.py CASES.json` reads a list of cases and prints one JSON line with a
result per case: {"ok": bool, "error": "...", ...}. Each case initialises torch.distributed's
fake backend with the case's world size (no processes, no devices), so the engines' world-size
and batch checks run as they would at launch:
- torchtitan 0.2: its ConfigManager parses the job TOML (`--job.config_file`), then its
  ParallelDims validates the degrees against the world size, and with async TP on its
  `maybe_enable_async_tp` runs (it refuses async TP without torch.compile of the model).
  torchtitan's package __init__ imports its Triton float8/MoE kernels, so the config and
  parallel_dims modules are loaded without it (the package path registered by hand); its device
  mesh is built (the fake backend), which checks that the expert ways divide the FSDP ways.
- megatron-core: TransformerConfig(**kwargs) (its __post_init__ checks), then
  parallel_state.initialize_model_parallel (the world must divide into tensor x context x
  pipeline groups, the expert ways into the data x context ways; gloo groups off: the fake
  backend has no gloo) and the
  ConstantNumMicroBatchesCalculator (global batch = micro-batch x data ways x micro-batches).
- deepspeed: DeepSpeedConfig(config, mpu=megatron's parallel_state) — its batch assertion
  train_batch = micro x accumulation x data ways. Its CPU shared-memory kernel (built on
  deepspeed.comm init) is marked incompatible first: it is unrelated to the config and would
  be compiled.
Run in a subprocess because the fake process group is process-global.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import warnings


def _titan() -> None:
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)  # type: ignore[union-attr]
        sys.modules["torchtitan"] = pkg


def _init(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        dist.destroy_process_group()
    dist.init_process_group(backend="fake", rank=0, world_size=world, store=FakeStore())


def check_torchtitan(case: dict) -> dict:
    _titan()
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    job = ConfigManager().parse_args(["--job.config_file", case["path"]])
    p = job.parallelism
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=case["world"],
    )
    _init(case["world"])
    dims.build_mesh()  # the device mesh of every dimension, EP's FSDP ways included
    if p.enable_async_tensor_parallel:  # torchtitan's own check: async TP needs compile
        from torchtitan.distributed.tensor_parallel import maybe_enable_async_tp

        maybe_enable_async_tp(job, dims.get_mesh("tp"))
    return {
        "dp": dims.dp_replicate * dims.dp_shard,
        "tp": dims.tp,
        "pp": dims.pp,
        "cp": dims.cp,
        "ep": dims.ep,
        "schedule": p.pipeline_parallel_schedule,
        "local_batch_size": job.training.local_batch_size,
        "global_batch_size": job.training.global_batch_size,
        "pipeline_microbatch_size": p.pipeline_parallel_microbatch_size,
        "ac_mode": job.activation_checkpoint.mode,
        "module_fqns_per_model_part": p.module_fqns_per_model_part,
        "async_tp": p.enable_async_tensor_parallel,
        "compile": job.compile.enable,
        "compile_components": list(job.compile.components),
    }


def _megatron_groups(case: dict, kw: dict) -> object:
    from megatron.core import parallel_state as ps

    _init(case["world"])
    ps.initialize_model_parallel(
        tensor_model_parallel_size=kw["tensor_model_parallel_size"],
        pipeline_model_parallel_size=kw["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=kw.get("virtual_pipeline_model_parallel_size"),
        context_parallel_size=kw.get("context_parallel_size", 1),
        expert_model_parallel_size=kw.get("expert_model_parallel_size", 1),
        create_gloo_process_groups=False,
    )
    return ps


def check_megatron(case: dict) -> dict:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    sys.path.insert(0, case["repo"])
    from shardplan.exporters.megatron import transformer_config

    kw = case["kwargs"]
    cfg = transformer_config(kw)
    ps = _megatron_groups(case, kw)
    dp = ps.get_data_parallel_world_size()
    calc = ConstantNumMicroBatchesCalculator(
        case["global_batch_size"], case["micro_batch_size"], dp, False, 0
    )
    return {
        "dp": dp,
        "micro_batches": calc.get(),
        "num_layers": cfg.num_layers,
        "cp": ps.get_context_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
        "vpp": ps.get_virtual_pipeline_model_parallel_world_size(),
        "sequence_parallel": cfg.sequence_parallel,
        "tp_comm_overlap": cfg.tp_comm_overlap,
        "num_moe_experts": cfg.num_moe_experts,
    }


def check_deepspeed(case: dict) -> dict:
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    import deepspeed.comm as dsc
    from deepspeed.runtime.config import DeepSpeedConfig

    ps = _megatron_groups(case, case["kwargs"])
    dsc.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
    cfg = DeepSpeedConfig(case["config"], mpu=ps)
    return {
        "dp": ps.get_data_parallel_world_size(),
        "train_batch_size": cfg.train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "zero_stage": cfg.zero_optimization_stage,
    }


CHECKS = {"torchtitan": check_torchtitan, "megatron": check_megatron, "deepspeed": check_deepspeed}


def main(path: str) -> None:
    warnings.simplefilter("ignore")
    out = []
    for case in json.loads(open(path).read()):
        try:
            out.append({"ok": True, **CHECKS[case["engine"]](case)})
        except Exception as e:  # the engines raise AssertionError, ValueError, RuntimeError
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
