"""The behaviours torch's own FSDP2 test suite checks (test/distributed/_composable/fsdp/test_fully_shard_*.py in
the pytorch repository), each held on ours against torch's ``fully_shard`` run the same way in the same launch.

Cases: ``tests/workers/drop_in_fsdp2_param_cases.py`` and ``drop_in_fsdp2_unit_cases.py``, in the 4-rank launch
shared with tests/test_drop_in_stacks.py. Every quantity is compared on every rank with difference 0: ours and
FSDP2 do the same arithmetic in the same order (the collectives reduce the same buffers, FSDP2's fp16 divisions
included), so anything but bit-equality is a behaviour difference.
"""

from __future__ import annotations

import pytest
from drop_in_launch import STACKS_AND_FSDP2_SUITE, case_result, shared_launch

pytestmark = pytest.mark.distributed

SIDE_BY_SIDE = {
    "state_dict_loads_in_place": ("dp_tp", "hsdp"),
    "tensor_subclass_all_gather": ("fsdp", "hsdp"),
    "tensor_subclass_without_extension": (None,),
    "bf16_all_gather_of_uneven_rows": (None,),
    "torchao_float8_all_gather": ("transformer", "m4_f8"),
    "fp16_compute_and_reduction": (None,),
    "shard_placement_fn_per_parameter": ("largest_dim", "dim_one"),
    "experts_sharded_on_dim_one": (None,),
    "unit_of_modules_feeding_each_other": (None,),
    "tied_embedding_and_output_as_one_unit": (None,),
    "chunked_loss_skips_the_head_of_a_unit": ("separate", "tied"),
    "checkpoint_recompute_repeats_the_casts": ("inputs", "outputs"),
    "dataclass_activations_between_units": ("fp32", "bf16"),
    "jvp_through_a_unit": (None,),
    "forward_method_registered_with_torch": (None,),
    "blocks_compiled_with_fullgraph": (None,),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return shared_launch(tmp_path_factory, STACKS_AND_FSDP2_SUITE)


def variants(results: list[dict], name: str, rank: int) -> dict[str, dict]:
    case_result(results, name)
    result = results[rank][name]
    return {variant or name: result[variant] if variant else result for variant in SIDE_BY_SIDE[name]}


@pytest.mark.parametrize("name", sorted(SIDE_BY_SIDE))
def test_bit_equal_to_torch_fsdp2(results, name):
    """Losses, gradients, parameters (and what a case records besides) equal FSDP2's, and every fact ours
    records (dtypes seen, calls counted, placements) equals the one torch's run recorded."""
    for rank in range(len(results)):
        for variant, result in variants(results, name, rank).items():
            assert result["torch"] and set(result["torch"].values()) == {0.0}, (rank, variant, result["torch"])
            assert result["facts"] == result["torch_facts"], (rank, variant, result["facts"], result["torch_facts"])


def test_state_dict_values_are_views_so_in_place_loads_reach_every_parameter(results):
    for rank in range(len(results)):
        for variant, result in variants(results, "state_dict_loads_in_place", rank).items():
            assert result["facts"] == {"views": True, "largest_off_fill": 0.0}, (rank, variant)


def test_all_gather_extension_runs_on_every_all_gather_over_the_shard_dim(results):
    """2 units x 2 weights x 3 steps x (forward + backward) = 24 calls per rank; the mesh handed to it is the
    shard dim's: 4 ranks on FSDP, 2 of HSDP's (replicate 2, shard 2)."""
    for rank in range(len(results)):
        facts = variants(results, "tensor_subclass_all_gather", rank)
        assert facts["fsdp"]["facts"] == {"pre_all_gather_calls": 24, "shard_meshes": [[1, 4]]}, rank
        assert facts["hsdp"]["facts"] == {"pre_all_gather_calls": 24, "shard_meshes": [[1, 2]]}, rank


def test_torchao_float8_weights_gather_e4m3_through_their_extension(results):
    """torchao's float8 weights (2 blocks x 6 linears) stay its tensor subclass as shards, and every all-gather
    of them calls their fsdp_pre_all_gather: 72 calls per rank over 3 steps (forward and backward), each
    returning e4m3 data alone (the scale is metadata, from an amax all-reduced inside the call), as under
    FSDP2 (test_bit_equal_to_torch_fsdp2 holds losses, gradients and parameters to difference 0)."""
    for rank in range(len(results)):
        facts = variants(results, "torchao_float8_all_gather", rank)["transformer"]["facts"]
        assert facts == {
            "weight_shards": ["Tensor", "WeightWithDynamicFloat8CastTensor"],
            "pre_all_gather_calls": 72,
            "gathered_dtypes": [["torch.float8_e4m3fn"]],
        }, rank


def test_units_of_several_modules_train_every_weight(results):
    """b computes in bf16 on a's fp32 output (cast by the unit); all 17 tied rows move, the padded last shard's
    too."""
    assert case_result(results, "unit_of_modules_feeding_each_other")["facts"] == {"output_dtype": "torch.bfloat16"}
    assert case_result(results, "tied_embedding_and_output_as_one_unit")["facts"] == {"rows_trained": 17}


def test_recomputation_sees_the_casts_of_forward(results):
    """Forward then the recomputation in backward: the unit's input in bf16 both times, the function's output in
    the policy's output dtype (float32 when set, else the compute dtype)."""
    seen = {
        variant: r["facts"]["seen"]
        for variant, r in variants(results, "checkpoint_recompute_repeats_the_casts", 0).items()
    }
    forward_then_recompute = {
        "inputs": ["in torch.bfloat16", "out torch.bfloat16"] * 2,
        "outputs": ["in torch.bfloat16", "out torch.float32"] * 2,
    }
    assert seen == forward_then_recompute


def test_sharding_follows_shard_placement_fn(results):
    facts = variants(results, "shard_placement_fn_per_parameter", 0)
    assert facts["largest_dim"]["facts"]["placements"] == ["(Shard(dim=0),)", "(Shard(dim=1),)"]
    assert facts["dim_one"]["facts"] == {"contiguous": True}
    assert case_result(results, "experts_sharded_on_dim_one")["facts"] == {"expert_placements": ["S(1)", "S(0)"]}


def test_jvp_tangent_of_an_output_independent_of_the_primal_is_zero(results):
    assert case_result(results, "jvp_through_a_unit")["facts"] == {"tangent_is_zero": True}


def test_compiled_blocks_trace_one_graph_without_fully_shard_hooks(results):
    """torchtitan compiles each block with fullgraph=True before fully_shard: ours runs its hooks outside the
    graph as FSDP2 does, so the one graph both record (the second block reuses it) has the same nodes."""
    facts = case_result(results, "blocks_compiled_with_fullgraph")
    assert (
        facts["facts"]["graph_nodes"] == facts["torch_facts"]["graph_nodes"] and len(facts["facts"]["graph_nodes"]) == 1
    )
