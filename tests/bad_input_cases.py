"""The bad-input table of tests/test_bad_input_table.py: 500+ inputs over every entry point, each with the
rule its refusal must name; here the helpers, the hostile files and the CLI's cases (the Python API's,
the widgets', the magic's and the environment's: tests/bad_input_api_cases.py).

A case is an argv for ``python -m launch`` (run in-process through ``launch.cli.main``), a Python call
(``launch.run`` / ``run_many`` / ``torchrun`` / ``validate`` / ``write_report``, the widgets, the planner),
``%%torchrun``'s line and cell, or one of these under a bad environment variable. ``{fx}`` in an argv is the
folder of hostile files (``make_fixtures``), ``{box}`` the case's own empty folder (nothing may appear in it).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launch.processes.run_dirs import RunDirError


@dataclass(frozen=True)
class Paths:
    fx: Path  # hostile files shared by every case (read, never written)
    box: Path  # this case's folder: its cwd, scratch and TMPDIR live in it


@dataclass(frozen=True)
class Case:
    entry: str  # the entry point, as the tally groups them
    label: str
    rule: str  # a regular expression the refusal's message must match
    kind: str  # "cli", "python" or "magic"
    argv: tuple[str, ...] = ()
    call: Callable[[Paths], object] | None = None
    env: dict[str, str] = field(default_factory=dict)
    errors: tuple[type[BaseException], ...] = (ValueError, RunDirError)  # RunDirError: a folder that cannot be used

    @property
    def id(self) -> str:
        return f"{self.entry}: {self.label}"[:140]


def cli(command: str, rule: str, env: dict[str, str] | None = None) -> Case:
    argv = tuple(shlex.split(command))
    return Case(f"cli {argv[0]}", command, rule, "cli", argv=argv, env=env or {})


def py(entry: str, label: str, call: Callable[[Paths], object], rule: str, **more) -> Case:
    return Case(entry, label, rule, "python", call=call, **more)


def magic(line: str, cell: str, rule: str) -> Case:
    return Case("%%torchrun", f"{line} | {cell}", rule, "magic", call=lambda p: (line, cell))


NESTED = "[" * 200_000 + "]" * 200_000
BASE_CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
}
MIXTRAL = {**BASE_CONFIG, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN_MOE = {**BASE_CONFIG, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 128, "decoder_sparse_step": 1}  # fmt: skip
HOSTILE_CONFIGS: dict[str, tuple[str, str]] = {  # file name: (its text, the rule)
    "nested.json": ('{"a":' * 100_000 + "1" + "}" * 100_000, r"config|nest"),
    "nested_list.json": (NESTED, r"config|nest"),
    "empty.json": ("", r"config"),
    "list.json": ("[1, 2]", r"config.*object|mapping|dict"),
    "null.json": ("null", r"config.*object|mapping|dict"),
    "string.json": ('"llama"', r"config.*object|mapping|dict"),
    "truncated.json": ('{"model_type": "llama", "hidden_size": 2', r"config|JSON"),
    "binary.json": ("\udcff\udcfe\x00\x01garbage", r"binary\.json"),
    "no_type.json": (json.dumps({k: v for k, v in BASE_CONFIG.items() if k != "model_type"}), r"model_type"),
    "unknown_type.json": (json.dumps({**BASE_CONFIG, "model_type": "mamba"}), r"model_type|mamba"),
    "type_int.json": (json.dumps({**BASE_CONFIG, "model_type": 5}), r"model_type"),
    "missing_hidden.json": (json.dumps({k: v for k, v in BASE_CONFIG.items() if k != "hidden_size"}), r"hidden_size"),
    "hidden_huge.json": (json.dumps(BASE_CONFIG).replace("256", "1" + "0" * 400), r"hidden_size"),
    "hidden_inf.json": (json.dumps(BASE_CONFIG).replace("256", "1e999"), r"hidden_size"),
    "hidden_nan.json": (json.dumps(BASE_CONFIG).replace("256", "NaN"), r"hidden_size"),
    "hidden_float.json": (json.dumps({**BASE_CONFIG, "hidden_size": 256.5}), r"hidden_size"),
    "hidden_str.json": (json.dumps({**BASE_CONFIG, "hidden_size": "abc"}), r"hidden_size"),
    "hidden_list.json": (json.dumps({**BASE_CONFIG, "hidden_size": [256]}), r"hidden_size"),
    "hidden_bool.json": (json.dumps({**BASE_CONFIG, "hidden_size": True}), r"hidden_size"),
    "hidden_zero.json": (json.dumps({**BASE_CONFIG, "hidden_size": 0}), r"hidden_size"),
    "hidden_negative.json": (json.dumps({**BASE_CONFIG, "hidden_size": -256}), r"hidden_size"),
    "layers_zero.json": (json.dumps({**BASE_CONFIG, "num_hidden_layers": 0}), r"num_hidden_layers|n_layers"),
    "layers_null.json": (json.dumps({**BASE_CONFIG, "num_hidden_layers": None}), r"num_hidden_layers"),
    "heads_zero.json": (json.dumps({**BASE_CONFIG, "num_attention_heads": 0}), r"num_attention_heads|heads"),
    "heads_not_dividing.json": (json.dumps({**BASE_CONFIG, "num_attention_heads": 3}), r"heads"),
    "kv_heads_more.json": (json.dumps({**BASE_CONFIG, "num_key_value_heads": 8}), r"key_value_heads|kv"),
    "vocab_negative.json": (json.dumps({**BASE_CONFIG, "vocab_size": -1}), r"vocab"),
    "max_pos_inf.json": (json.dumps({**BASE_CONFIG, "max_position_embeddings": "INF"}).replace('"INF"', "1e999"),
                         r"max_position_embeddings"),
    "max_pos_list.json": (json.dumps({**BASE_CONFIG, "max_position_embeddings": [1]}), r"max_position_embeddings"),
    "max_pos_str.json": (json.dumps({**BASE_CONFIG, "max_position_embeddings": "abc"}), r"max_position_embeddings"),
    "preset_unknown.json": (json.dumps({**BASE_CONFIG, "workbook_preset": {"foo": 1}}), r"workbook_preset"),
    "preset_list.json": (json.dumps({**BASE_CONFIG, "workbook_preset": [[1, 2]]}), r"workbook_preset"),
    "preset_str.json": (json.dumps({**BASE_CONFIG, "workbook_preset": "abc"}), r"workbook_preset"),
    "preset_bad_value.json": (json.dumps({**BASE_CONFIG, "workbook_preset": {"seq_len": "x"}}),
                              r"workbook_preset|seq_len"),
    "preset_zero_batch.json": (json.dumps({**BASE_CONFIG, "workbook_preset": {"global_batch": 0}}),
                               r"global_batch"),
    "mixtral_topk_above.json": (json.dumps({**MIXTRAL, "num_experts_per_tok": 9}), r"top_k|experts_per_tok"),
    "mixtral_topk_zero.json": (json.dumps({**MIXTRAL, "num_experts_per_tok": 0}), r"top_k|experts_per_tok"),
    "mixtral_no_experts.json": (json.dumps({**MIXTRAL, "num_local_experts": 0}), r"experts"),
    "qwen_mlp_only_int.json": (json.dumps({**QWEN_MOE, "mlp_only_layers": 5}), r"mlp_only_layers"),
    "qwen_mlp_only_str.json": (json.dumps({**QWEN_MOE, "mlp_only_layers": ["a"]}), r"mlp_only_layers"),
    "qwen_sparse_step_zero.json": (json.dumps({**QWEN_MOE, "decoder_sparse_step": 0}), r"decoder_sparse_step"),
    "qwen_topk_above.json": (json.dumps({**QWEN_MOE, "num_experts_per_tok": 5}), r"top_k|experts_per_tok"),
    "sliding_negative.json": (json.dumps({**BASE_CONFIG, "model_type": "mistral", "sliding_window": -5}),
                              r"sliding_window"),
}  # fmt: skip


def make_fixtures(fx: Path) -> None:
    """The hostile files the cases read: configs, a plain file, run folders that are not runs."""
    for name, (text, _) in HOSTILE_CONFIGS.items():
        (fx / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    (fx / "plain.txt").write_text("a file, not a folder\n")
    (fx / "not_a_run").mkdir()
    nested = fx / "nested_metrics"
    nested.mkdir()
    (nested / "metrics.json").write_text(NESTED)
    (nested / "summary.json").write_text(NESTED)
    degrees = fx / "bad_degrees"
    degrees.mkdir()
    summary = {"recipe": "M4", "degrees": "abc", "ok": True, "losses": [1.0], "reference_losses": [1.0]}
    (degrees / "summary.json").write_text(json.dumps(summary))
    (degrees / "metrics.json").write_text(json.dumps({"ok": True, "degrees": "abc"}))
    not_json = fx / "not_json"
    not_json.mkdir()
    (not_json / "summary.json").write_text("{not json")
    (not_json / "metrics.json").write_text("{not json")
    (fx / "shared_dir").mkdir(mode=0o777)
    os.chmod(fx / "shared_dir", 0o777)
    (fx / "link_dir").symlink_to(fx / "not_a_run")


LONG = "/tmp/" + "x" * 6000
INT_FLAG_VALUES = {"x": "invalid int", "1.5": "invalid int", "2^30": "invalid int", "''": "invalid int"}
SIZE_RULE = r"must be|at least|>= ?1|positive"


def _degree_cases(prefix: str, flags: list[str]) -> list[Case]:
    cases = []
    for flag in flags:
        for value, rule in {**INT_FLAG_VALUES, "0": SIZE_RULE, "-1": SIZE_RULE}.items():
            cases.append(cli(f"{prefix} {flag} {value}", f"{flag.lstrip('-').replace('-', '_')}|{flag}.*{rule}"))
    return cases


RUN_DEGREES = ["--world", "--dp-replicate", "--dp-shard", "--cp", "--ulysses", "--tp", "--pp", "--ep", "--etp"]
OPTION_FLAGS = ["--global-batch", "--seq-len", "--num-experts", "--microbatches"]

CLI_CASES = [
    *_degree_cases("run M4", RUN_DEGREES),
    *_degree_cases("run S1", OPTION_FLAGS),
    *_degree_cases("check --world 4", [f for f in RUN_DEGREES[1:] if f != "--dp-shard"]),
    *_degree_cases("command M4 --nnodes 1 --nproc-per-node 2", ["--dp-shard", "--steps", "--global-batch"]),
    cli("run nope", r"unknown recipe|nope"),
    cli("run ''", r"recipe"),
    cli("run 'M4;rm -rf x'", r"unknown recipe|M4;rm"),
    cli("run DeepEP", r"not runnable"),
    cli("run M4 --world 100000", r"more ranks than this machine"),
    cli("run M4 --dp-shard 1000000000", r"more ranks than this machine|world_size=1000000000 is above"),
    cli("run M4 --tp 2", r"tp|M4"),
    cli("run M4 --steps 0", r"steps must be"),
    cli("run M4 --link warp", r"link must be .*preset"),
    cli("run M4 --steps -3", r"steps must be"),
    cli("run M4 --steps x", r"--steps.*invalid int"),
    cli("run M4 --steps 1.5", r"--steps.*invalid int"),
    cli("run M4 --steps 2 --steps 3", r"--steps given twice"),
    cli(f"run M4 --seed {10**30}", r"seed"),
    cli(f"run M4 --seed -{10**30}", r"seed"),
    cli(f"run M4 --seed {2**64}", r"seed"),
    cli("run M4 --seed x", r"--seed.*invalid int"),
    cli("run M4 --seed 1e30", r"--seed.*invalid int"),
    cli("run M4 --timeout -5", r"timeout must be a positive"),
    cli("run M4 --timeout 0", r"timeout must be a positive"),
    cli("run M4 --timeout nan", r"timeout must be a positive"),
    cli("run M4 --timeout=-inf", r"timeout must be a positive"),
    cli("run M4 --timeout x", r"--timeout.*invalid float"),
    cli("run M4 --out /dev/null", r"not a directory"),
    cli("run M4 --out {fx}/plain.txt", r"not a directory"),
    cli("run M4 --out {fx}/plain.txt/sub", r"run directory|out"),
    cli("run M4 --out /proc", r"/proc"),
    cli("run M4 --out /proc/x", r"/proc/x"),
    cli("run M4 --out /sys/kernel", r"/sys/kernel"),
    cli(f"run M4 --out {LONG}", r"out|too long"),
    cli("run M4 --out ''", r"out"),
    cli("run M4 --out {fx}/shared_dir", r"writable by others|writable"),
    cli("run M4 --out {fx}/link_dir", r"symbolic link"),
    cli("run M4 --foo 2", r"unrecognized arguments: --foo"),
    cli("run M4 --dp-shard 2 --dp-shard 4", r"--dp-shard given twice"),
    cli("run P1 --microbatches 3", r"microbatches"),
    cli("run M2 --seq-len 0", r"seq_len|seq-len"),
    cli("run M4 --seq-len 16", r"seq_len|seq-len|M4"),
    cli("run M4", r"more ranks than this machine", env={"HYPER_PARALLEL_MAX_RANKS": "1"}),
    cli("check", r"--world is required"),
    cli("check --world 1000000000", r"more ranks|world"),
    cli("check --world 1073741824", r"more ranks|world"),
    cli("check --world 0", r"world_size|--world"),
    cli("check --world -4", r"world_size|--world"),
    cli("check --world x", r"--world.*invalid int"),
    cli("check --world 4 --tp 3", r"tp|divide"),
    cli("check --world 4 --recipe nope", r"unknown recipe|nope"),
    cli("check --world 4 --seq-len 8", r"need --recipe"),
    cli("check --world 4 --world 8", r"--world given twice"),
    cli("command M4 --nnodes 0 --nproc-per-node 2", r"--nnodes must be"),
    cli("command M4 --nnodes -2 --nproc-per-node 2", r"--nnodes must be"),
    cli("command M4 --nnodes 1 --nproc-per-node 0", r"--nproc-per-node must be"),
    cli("command M4 --nnodes x --nproc-per-node 2", r"--nnodes.*invalid int"),
    cli("command M4 --nproc-per-node 2", r"--nnodes"),
    cli("command M4 --nnodes 2 --nproc-per-node 2", r"world_size"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint noport", r"HOST:PORT"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint :29500", r"HOST:PORT"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint host:0", r"HOST:PORT|port"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint host:70000", r"HOST:PORT|port"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint 'host:29500x'", r"HOST:PORT|port"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint '$(touch pwned):29500'", r"rdzv-endpoint|HOST"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint 'a b;c:29500'", r"rdzv-endpoint|HOST"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --rdzv-endpoint '`id`:29500'", r"rdzv-endpoint|HOST"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --steps 0", r"steps must be"),
    cli("command nope --nnodes 1 --nproc-per-node 2", r"unknown recipe|nope"),
    cli("command M4 --nnodes 1 --nproc-per-node 2 --seed 3", r"unrecognized arguments: --seed"),
    cli("workbook --jobs 0", r"--jobs must be"),
    cli("workbook --jobs -1", r"--jobs must be"),
    cli("workbook --jobs x", r"--jobs.*invalid int"),
    cli("workbook --jobs 100000", r"--jobs"),
    cli("workbook --out /dev/null", r"/dev/null"),
    cli("workbook --out {fx}/plain.txt", r"plain.txt"),
    cli("workbook --out /proc", r"/proc"),
    cli("workbook --out ''", r"out"),
    cli("workbook --out {fx}/shared_dir", r"writable"),
    cli("report", r"give a run directory"),
    cli("report {box}/missing", r"missing|no such|not a run"),
    cli("report {fx}/plain.txt", r"plain.txt"),
    cli("report /dev/null", r"/dev/null"),
    cli("report {fx}/not_a_run", r"not_a_run|summary|run directory"),
    cli("report {fx}/nested_metrics", r"nested_metrics|summary|metrics"),
    cli("report {fx}/bad_degrees", r"degrees"),
    cli("report {fx}/not_json", r"not_json|JSON|summary"),
    cli("report {fx}/not_a_run --compare {fx}/not_a_run {fx}/not_a_run", r"either RUN_DIR or --compare"),
    cli("report --compare {box}/a {box}/b", r"a|b|run directory"),
    cli("report --compare {fx}/not_json {fx}/not_json", r"not_json|JSON|summary"),
    cli("bench --world 3", r"--world.*invalid choice"),
    cli("bench --world 4 --steps 0", r"--steps must be"),
    cli("bench --world 4 --warmup -1", r"--warmup"),
    cli("bench --world 4 --cold -1", r"--cold"),
    cli("bench --world 4 --configs nope", r"unknown configuration"),
    cli("bench --world 4 --timeout 0", r"timeout must be a positive"),
    cli("bench --world 4 --timeout nan", r"timeout must be a positive"),
    cli("bench --world 4 --timeout -1", r"timeout must be a positive"),
    cli("bench --world 4 --out /dev/null", r"/dev/null"),
    cli("bench --world 4 --out {fx}/plain.txt", r"plain.txt"),
    cli("bench --world 4 --out /proc", r"/proc"),
    cli("bench-latency --repeats 0", r"--repeats must be"),
    cli("bench-latency --repeats -1", r"--repeats must be"),
    cli("bench-latency --runs 0", r"--runs must be"),
    cli("bench-latency --runs -1", r"--runs must be"),
    cli("bench-latency --runs x", r"--runs.*invalid int"),
    cli("nope", r"invalid choice: 'nope'"),
    cli("list --foo", r"unrecognized arguments: --foo"),
]  # fmt: skip

PLAN = "plan --world 8"
PLAN_CASES = [
    cli("plan", r"--world is required"),
    cli("plan --world 0", r"world"),
    cli("plan --world -8", r"world"),
    cli("plan --world 1073741824", r"world"),
    cli("plan --world 1000000000", r"world"),
    cli("plan --world x", r"--world.*invalid int"),
    cli("plan --world 8 --tp 3", r"tp|divide"),
    cli("plan --world 8 --tp 0", r"tp"),
    cli("plan --world 8 --pp -2", r"pp"),
    cli(f"{PLAN} --top 0", r"--top"),
    cli(f"{PLAN} --seq-len 0", r"seq.len"),
    cli(f"{PLAN} --seq-len -1", r"seq.len"),
    cli(f"{PLAN} --batch 0", r"batch"),
    cli(f"{PLAN} --batch -4", r"batch"),
    cli(f"{PLAN} --virtual-stages 0", r"virtual.stages"),
    cli(f"{PLAN} --virtual-stages -1", r"virtual.stages"),
    cli(f"{PLAN} --pp 2 --virtual-stages 100000", r"virtual.stages|stages|layers"),
    cli(f"{PLAN} --pp 2 --stage-layers a,b", r"--stage-layers"),
    cli(f"{PLAN} --pp 2 --stage-layers 1,2", r"stage.layers|layers"),
    cli(f"{PLAN} --pp 2 --stage-layers -1,9", r"stage.layers|layers"),
    cli(f"{PLAN} --first-stage-layers 2", r"--first-stage-layers"),
    cli(f"{PLAN} --pp 2 --first-stage-layers -3", r"first.stage|layers"),
    cli(f"{PLAN} --pp 2 --first-stage-layers 100000", r"first.stage|layers"),
    cli(f"{PLAN} --gpus-per-node 0", r"gpus.per.node"),
    cli(f"{PLAN} --gpus-per-node -8", r"gpus.per.node"),
    cli(f"{PLAN} --gpus-per-node 3", r"gpus.per.node"),
    cli(f"{PLAN} --rank -1", r"rank"),
    cli(f"{PLAN} --rank 8", r"rank"),
    cli(f"{PLAN} --rank 1000000000", r"rank"),
    cli(f"{PLAN} --peak-tflops nan", r"peak.tflops"),
    cli(f"{PLAN} --peak-tflops -1", r"peak.tflops"),
    cli(f"{PLAN} --peak-tflops 0", r"peak.tflops"),
    cli(f"{PLAN} --peak-tflops inf", r"peak.tflops"),
    cli(f"{PLAN} --intra-node-gbs 0", r"intra.node"),
    cli(f"{PLAN} --inter-node-gbs nan", r"inter.node"),
    cli(f"{PLAN} --memory-gib -1", r"memory.gib"),
    cli(f"{PLAN} --memory-gib 1e400", r"memory.gib"),
    cli(f"{PLAN} --memory-reserve-gib nan", r"reserve"),
    cli(f"{PLAN} --memory-reserve-gib -1", r"reserve"),
    cli(f"{PLAN} --micro-batch 0", r"micro.batch"),
    cli(f"{PLAN} --grad-accum 0", r"grad.accum"),
    cli(f"{PLAN} --grad-accum -2", r"grad.accum"),
    cli(f"{PLAN} --model nope", r"--model.*invalid choice"),
    cli(f"{PLAN} --hardware nope", r"--hardware.*invalid choice"),
    cli(f"{PLAN} --zero 4", r"--zero.*invalid choice"),
    cli(f"{PLAN} --pp-schedule nope", r"--pp-schedule.*invalid choice"),
    cli(f"{PLAN} --format yaml", r"--format.*invalid choice"),
    cli(f"{PLAN} --out {{box}}/x.html", r"--out writes a --layouts review"),
    cli(f"{PLAN} --layouts garbage", r"layouts|garbage"),
    cli(f"{PLAN} --layouts 'tp=3'", r"tp|divide"),
    cli(f"{PLAN} --layouts 'dp_shard=8,dp_shard=8'", r"twice|dp_shard"),
    cli(f"{PLAN} --layouts 'foo=8'", r"foo"),
    cli(f"{PLAN} --layouts ''", r"layouts"),
    cli(f"{PLAN} --layouts ';;;'", r"layouts"),
    cli(f"{PLAN} --layouts 'dp_shard=x'", r"dp_shard|x"),
    cli(f"{PLAN} --layouts dp_shard=8 --out {{box}}", r"--out|folder|directory"),
    cli(f"{PLAN} --layouts dp_shard=8 --out /proc/x.html", r"/proc/x.html|--out"),
    cli(f"{PLAN} --layouts dp_shard=8 --out /dev/null/x.html", r"/dev/null|--out"),
    cli(f"{PLAN} --layouts dp_shard=8 --out {{fx}}/plain.txt/x.html", r"plain.txt|--out"),
    cli(f"{PLAN} --model-config {{box}}/missing.json", r"missing.json"),
    cli(f"{PLAN} --model-config {{fx}}", r"model.config|directory"),
    cli(f"{PLAN} --model-config /dev/zero", r"/dev/zero"),
    cli(f"{PLAN} --model-config /dev/null", r"/dev/null|config"),
    cli(f"{PLAN} --model-config /proc/self/mem", r"/proc/self/mem|config"),
    *[cli(f"{PLAN} --model-config {{fx}}/{name}", rule) for name, (_, rule) in HOSTILE_CONFIGS.items()],
    cli("plan --world 1073741824 --batch 1073741824", r"world"),
    cli("plan --world 1000000000 --compare", r"world"),
]  # fmt: skip
