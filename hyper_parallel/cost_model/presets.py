"""The models the planner knows by name: the recipes' tiny models (code, so the cost model can be
checked byte for byte against their traced runs) and models at scale (Hugging Face ``config.json``
files in ``configs/``, read by ``ModelConfig.from_hf_config`` exactly as ``--model-config`` reads yours).

    small          the recipes' mini transformer (TransformerConfig of hyper_parallel.models.transformer:
                   vocab 64, d_model 32, 4 heads, 2 layers, feed-forward 64, seq_len 16; global batch 8)
    small-moe      the MoE recipes' model (recipes/moe.py MOE_CONFIG): layer 1's feed-forward is a MoE
                   with 4 experts of hidden 32, top-2, and a shared expert of hidden 32
    small-mlp      the MLP of M1/M4 (MLPConfig: d_in 16, d_model 32, hidden 64, d_out 8, 2 blocks,
                   seq_len 8, biases; global batch 16)
    configs/*.json llama-8b-like, llama-70b-like, llama-405b-like (Llama 3 shapes), mixtral-8x7b,
                   qwen1.5-moe-a2.7b, moe-16e (a DeepSeekMoE-style model with a shared expert), gpt2

A preset file is a plain config.json plus one key the HF loaders ignore, ``workbook_preset``: the
training settings a config.json does not hold (seq_len, global batch, a description).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hyper_parallel.cost_model import hf_config
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.recipes import registry

CONFIG_DIR = Path(__file__).with_name("configs")


def load_model_config(path: str | Path, **training) -> ModelConfig:
    """A ``config.json`` file as a ``ModelConfig`` (``training`` keywords and its ``workbook_preset`` applied)."""
    data = hf_config.load(path)
    preset = data.get("workbook_preset") or {}
    known = {field.name for field in dataclasses.fields(ModelConfig)}
    if not isinstance(preset, dict) or set(preset) - known:
        unknown = sorted(set(preset) - known) if isinstance(preset, dict) else preset
        raise ValueError(
            f"--model-config {path}: 'workbook_preset' must be an object of ModelConfig fields such as "
            f'{{"seq_len": 4096, "global_batch": 1024}}, got {unknown!r}'
        )
    return ModelConfig.from_hf_config(data, **(preset | training))


_SMALL = ModelConfig("small", description="the recipes' mini transformer (TransformerConfig defaults)")
_TINY = [
    _SMALL,
    _SMALL.replace(
        name="small-moe",
        moe_layers=(1,),
        num_experts=4,
        top_k=2,
        moe_hidden=32,
        shared_expert_hidden=32,
        description="the MoE recipes' model: layer 1 a MoE of 4 experts (hidden 32), top-2, shared expert",
    ),
    ModelConfig(
        "small-mlp",
        architecture="mlp",
        d_model=32,
        ffn_hidden=64,
        n_layers=2,
        seq_len=8,
        global_batch=16,
        d_in=16,
        d_out=8,
        description="the M1/M4 residual MLP (MLPConfig defaults)",
    ),
]
PRESETS: dict[str, ModelConfig] = {m.name: m for m in _TINY} | {
    m.name: m for m in (load_model_config(path) for path in sorted(CONFIG_DIR.glob("*.json")))
}
CLI_MODELS = tuple(PRESETS)


def get_model(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(PRESETS)}")
    return PRESETS[name]


RUN_OPTIONS = ("global_batch", "seq_len", "num_experts")
"""The options of a run (``metrics["options"]``, hyper_parallel/recipes/options.py) that change the model the
cost model describes; ``microbatches`` only matters to pipeline recipes, which it does not describe."""


def recipe_model(recipe: str, options: dict[str, int] | None = None) -> ModelConfig:
    """The model (and parallel style) a recipe's worker trains, e.g. ``recipe_model("M6")``: its preset with
    the recipe's workload facts (``Recipe.workload``); ``options``: a run's resolved options (its
    ``metrics["options"]``) where they differ from the recipe's defaults."""
    row = registry.get(recipe)
    if row.workload.preset is None:
        raise ValueError(f"the cost model does not describe {row.implementation!r} (recipe {row.name})")
    changes = {**row.workload.model_changes(), **{k: v for k, v in (options or {}).items() if k in RUN_OPTIONS}}
    return PRESETS[row.workload.preset].replace(name=f"{row.workload.preset} ({row.name})", **changes)
