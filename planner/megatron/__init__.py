"""Megatron-LM facing code: read a launch (shell words, flags, layout) into a model and a
strategy, check it against Megatron's rules, and emit launches for a plan.

Modules: `flags` (Megatron's argument table),
`launch` (a launch -> ModelSpec + Strategy; its parts `launcher` (the launch in a script, the
world size), `model_from_flags`, `strategy_from_flags`, `launch_errors`), `layout` (--pipeline-model-parallel-layout),
`rules` (what Megatron rejects), `check` (the CI gate), `emit` (plan -> flags and launch.sh),
`tokenizers` (the vocabulary a launch trains with). Words come from a script through planner.bash
(nothing executed); `shell` re-exports it.
"""
