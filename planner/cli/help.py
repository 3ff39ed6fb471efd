"""How the commands' options read in --help: the help text of options many commands share,
the panel each option is listed in, and flags shown without a value placeholder.

typer >= 0.20 prints a type after every option, `<bool>` after a flag too, which reads as if
the flag took a value (`--all true` then fails): flags get an empty placeholder here. Options
are grouped in panels (model & cluster, batch, parallel layout, search space, objective,
output) so that `plan --help` is not one list of 30 options.
"""

from __future__ import annotations

# Help text for options that several commands share and declare without one.
SHARED_HELP = {
    "--tp": "Tensor-parallel size (--tensor-model-parallel-size).",
    "--pp": "Pipeline-parallel size (--pipeline-model-parallel-size).",
    "--cp": "Context-parallel size (--context-parallel-size).",
    "--ep": "Expert-parallel size (--expert-model-parallel-size).",
    "--etp": "Expert tensor-parallel size (--expert-tensor-parallel-size); default: --tp.",
    "--vpp": "Virtual pipeline stages per rank (--num-virtual-stages-per-pipeline-rank).",
    "--micro-batch-size": "Sequences per micro-batch on each data-parallel rank.",
    "--global-batch-size": "Sequences per optimizer step, all data-parallel ranks together.",
    "--seq-length": "Tokens per sequence.",
    "--recompute-num-layers": "With --recompute full: layers fully recomputed per virtual chunk (Megatron's block method).",
    "--sequence-parallel": "Sequence parallelism with TP (--sequence-parallel).",
    "--precision": "bf16 | fp16 | fp8 | nvfp4 (fp8: Transformer Engine's fp8 GEMMs; nvfp4: its NVFP4 GEMMs, Blackwell only).",
    "--layers-per-stage": "Layers on each pipeline stage, comma-separated (default: even, as Megatron splits).",
    "--offload-optimizer": "Keep the optimizer state in host memory (--optimizer-cpu-offload).",
    "--top": "How many plans to list.",
    "--json": "Print one JSON document on stdout instead of tables.",
    "--cluster": "Cluster YAML path or bundled name (planner clusters lists them).",
    "--megatron-args": "A Megatron-LM launch: a shell script, a torchrun/srun line or the pretrain_gpt.py arguments.",
    "--model": "Model YAML / HF config.json path or bundled name (planner models lists them).",
}

# Panel -> the options listed in it (by their long name); options not named here stay in
# typer's default "Options" panel.
PANELS = {
    "Model and cluster": ("--model", "--cluster", "--megatron-args", "--plan", "--world-size", "--set",
                          "--nodes", "--gpus", "--max-gpus", "--min-gpu-fraction"),
    "Batch": ("--global-batch-size", "--seq-length", "--micro-batch-size"),
    "Parallel layout": ("--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--recompute",
                        "--recompute-num-layers", "--sequence-parallel", "--zero", "--precision", "--fp8-recipe",
                        "--schedule",
                        "--layers-per-stage", "--stage-groups", "--offload-optimizer"),
    "Search space": ("--fix", "--zero-stages", "--allow-tp-across-nodes", "--uneven-chunks", "--allow-tight",
                     "--solver", "--time-limit", "--jobs"),
    "Objective": ("--objective", "--train-tokens", "--charge-idle", "--top", "--all"),
    "Output": ("--json", "--wide", "--explain", "--plot", "--emit", "--out", "--force", "--compare-with", "--verbose"),
}

_PANEL_OF = {opt: panel for panel, opts in PANELS.items() for opt in opts}

# One or two typical invocations per command, shown at the end of its --help.
EXAMPLES = {
    "plan": ["planner plan --model llama3-8b --cluster dgx-h100-x8 --global-batch-size 256 --seq-length 8192",
             "planner plan --model llama3-70b --cluster h100-a100-cloud --global-batch-size 512 --seq-length 4096 "
             "--objective cost --train-tokens 1T --emit megatron --out plans"],
    "estimate": ["planner estimate --model llama3-70b --cluster dgx-h100-x16 --tp 8 --pp 4 --vpp 5 "
                 "--global-batch-size 256 --seq-length 4096 --explain",
                 "planner estimate --cluster dgx-h100-x8 --megatron-args launch.sh --json"],
    "check": ["planner check --cluster dgx-h100-x8 --megatron-args launch.sh   # exit 0 fits, 1 does not, 2 bad input"],
    "sweep": ["planner sweep --model llama3-70b --cluster dgx-h100-x8 --nodes 4,8,16 --global-batch-size 512 "
              "--seq-length 4096"],
    "compare": ["planner compare --cluster dgx-h100-x8 plans/plan-1/plan.json launch.sh"],
    "calibrate": ["planner calibrate --cluster my-cluster.yaml --megatron-log run.log --megatron-args run.sh "
                  "--out calibrated.yaml"],
}


def _long_name(param) -> str | None:
    return next((o for o in param.opts if o.startswith("--")), None)


def polish(command) -> None:
    """Give every option of a click command tree (typer's) its shared help text where it has
    none, its panel, and flags an empty value placeholder."""
    for name, sub in getattr(command, "commands", {}).items():
        if name in EXAMPLES and not sub.epilog:
            # one paragraph each: rich help joins single newlines
            sub.epilog = "Examples:\n\n" + "\n\n".join(EXAMPLES[name])
        polish(sub)
    _flag_help_option(command)
    for param in getattr(command, "params", ()):
        if param.param_type_name != "option":
            continue
        name = _long_name(param)
        if not param.help and name in SHARED_HELP:
            param.help = SHARED_HELP[name]
        if getattr(param, "is_flag", False):
            param.metavar = ""
        if name in _PANEL_OF and hasattr(param, "rich_help_panel") and not param.rich_help_panel:
            param.rich_help_panel = _PANEL_OF[name]


def _flag_help_option(command) -> None:
    """--help is a flag too; click builds it on demand, so it is mended as it is built."""
    build = command.get_help_option

    def get_help_option(ctx):
        opt = build(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    command.get_help_option = get_help_option
