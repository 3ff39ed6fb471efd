"""Finding the Megatron-LM launch in a script: the launcher and the world size.

A script's commands (read by planner.bash without running them) are searched for the one that
runs a training script (pretrain_*.py, train_*.py, finetune*.py) behind its launcher programs
(python, torchrun, `python -m torch.distributed.run`, srun, uv, wrappers such as nsys or
numactl); the launcher's options, the Slurm job's size or WORLD_SIZE give the world size.
Training scripts of other model families (T5, BERT, Mamba, multimodal, ...) are refused by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..bash import read_script
from ..bash.slurm import sbatch_options
from ..errors import SpecError
from .flags import Word

# launchers whose options come before the training script
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
_WRAPPERS_SCAN = {"nsys", "numactl", "uv", "env", "exec", "time", "nohup", "taskset", "stdbuf", "ncu", "apptainer",
                  "singularity", "docker", "enroot", "mpirun", "mpiexec"}
_ENTRY_HINT = re.compile(r"^(pretrain|train|finetune)")
GPT_ENTRIES = ("pretrain_gpt.py",)
# Megatron-LM's training scripts of other model families (its root, examples/ and their older
# names), by file name or by the end of their path -> the family, named when refusing them
OTHER_FAMILIES = {
    "pretrain_t5.py": "T5 (encoder-decoder)",
    "pretrain_bert.py": "BERT (encoder-only)",
    "pretrain_retro.py": "RETRO (retrieval-augmented)",
    "pretrain_ict.py": "ICT (BERT retriever)",
    "pretrain_mamba.py": "Mamba (state-space)",
    "pretrain_hybrid.py": "hybrid Mamba-Transformer",
    "pretrain_vlm.py": "vision-language (multimodal)",
    "pretrain_vision_classify.py": "vision transformer (classifier)",
    "pretrain_vision_dino.py": "vision transformer (DINO)",
    "pretrain_vision_inpaint.py": "vision transformer (inpainting)",
    "pretrain_mimo.py": "MIMO (multimodal)",
    "examples/mimo/train.py": "MIMO (multimodal)",
    "examples/multimodal/train.py": "LLaVA-style vision-language (multimodal)",
}


@dataclass
class FoundLaunch:
    """The training command of a script: its flags, launcher words, entry script and world size."""
    args: list[Word]
    launcher: list[Word]
    entry: str
    line: int
    wrappers: list
    env: dict
    world: int | None = None
    world_from: str = ""
    notes: list = field(default_factory=list)
    prefix_env: dict = field(default_factory=dict)   # NAME=value words before the launch command
    entry_path: str = ""                              # the training script as written


def _basename(w: Word) -> str:
    return os.path.basename(w.text)


def _find_entry(words: list[Word]) -> int | None:
    """Index of the training script: the first word ending in .py after the launcher programs
    (python, torchrun, srun, ...) or a `-m torch.distributed.run` module."""
    for i, w in enumerate(words):
        if w.text.endswith(".py") and not w.text.startswith("-"):
            return i
    return None


def _option_value(words: list[str], names: tuple[str, ...]) -> str | None:
    val = None
    for i, w in enumerate(words):
        k, eq, v = w.partition("=")
        if k in names:
            val = v if eq else (words[i + 1] if i + 1 < len(words) else None)
    return val


def world_from_launcher(f: FoundLaunch, sbatch: dict) -> None:
    texts = [w.text for w in f.launcher]
    unknown = {w.text: w.unknown for w in f.launcher if w.unknown}
    torchrun = any(_basename(w) == "torchrun" for w in f.launcher) or \
        any(t in ("torch.distributed.run", "torch.distributed.launch") for t in texts)
    if torchrun:
        nn = _option_value(texts, ("--nnodes",))
        npn = _option_value(texts, ("--nproc-per-node", "--nproc_per_node"))
        if nn is None:
            nn = "1"      # torchrun's default
        if npn is None:
            npn = "1"
        if nn and ":" in nn:
            f.notes.append(f"torchrun --nnodes {nn} is elastic: priced at its maximum")
            nn = nn.split(":")[-1]
        if nn in unknown or npn in unknown or not (nn.isdigit() and npn.isdigit()):
            bad = [x for x in (nn, npn) if not x.isdigit()]
            names = [n for x in bad for n in unknown.get(x, ())]
            f.notes.append("torchrun's --nnodes / --nproc-per-node " + (
                f"depend on {', '.join(names)}, not set here" if names else f"are {', '.join(bad)}") +
                ": world size from --world-size or the cluster (or --set them)")
            return
        f.world, f.world_from = int(nn) * int(npn), f"torchrun --nnodes {nn} --nproc-per-node {npn}"
        return
    # one process per Slurm task: srun python pretrain_gpt.py (here or around a bash -c)
    sruns = [w for w in f.wrappers if w.program == "srun"]
    srun_words = [x.text for w in sruns for x in w.words]
    if any(_basename(w) == "srun" for w in f.launcher):
        srun_words += texts
    if srun_words or any(w.program == "sbatch" for w in f.wrappers):
        opts = dict(sbatch)
        opts.update(sbatch_options(srun_words))
        env = f.env

        def pick(env_names, opt):
            # the job's own SLURM_* variables (or --set) first, then srun's flags, then #SBATCH
            for n in env_names:
                if str(env.get(n, "")).isdigit():
                    return env[n]
            return opts.get(opt)
        nodes = pick(("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "--nodes")
        tpn = pick(("SLURM_NTASKS_PER_NODE",), "--ntasks-per-node")
        ntasks = pick(("SLURM_NTASKS",), "--ntasks")
        if ntasks and str(ntasks).isdigit():
            f.world, f.world_from = int(ntasks), f"Slurm tasks ({ntasks})"
            return
        if nodes and tpn and str(nodes).isdigit() and str(tpn).isdigit():
            f.world, f.world_from = int(nodes) * int(tpn), f"Slurm {nodes} nodes x {tpn} tasks per node"
            return
        f.notes.append(f"Slurm job size not known (--nodes={nodes or '?'}, --ntasks-per-node={tpn or '?'}): "
                       "world size from --world-size or the cluster (or --set SLURM_NNODES=.. SLURM_NTASKS_PER_NODE=..)")
        return
    ws = f.env.get("WORLD_SIZE")
    if ws and ws.isdigit():
        f.world, f.world_from = int(ws), "WORLD_SIZE"
        return
    if f.launcher:
        f.notes.append(f"the launcher ({' '.join(texts[:3])}) does not say the world size: from --world-size or the cluster")


def find_launch(text: str, source: str, env: dict, base_dir: Path | None, args: list[str] | None = None,
                pins: dict | None = None):
    """(found launch or None, shell result)."""
    res = read_script(text, source, env, base_dir, args, pins)
    cands = []
    for c in res.commands:
        i = _find_entry(c.words)
        if i is None:
            continue
        head = c.words[:i]
        # a bare `.py` word after a non-launcher (echo x.py, cp a.py b) is not a launch
        progs = [_basename(w) for w in head]
        if head and not (any(_PYTHON.match(p) or p in ("torchrun", "srun", "uv", "deepspeed") or p in _WRAPPERS_SCAN
                             for p in progs) or head[0].unknown):
            continue
        cands.append((c, i))
    if not cands:
        return None, res
    pick = [x for x in cands if _ENTRY_HINT.match(_basename(x[0].words[x[1]]))]
    if not pick:
        names = sorted({x[0].words[x[1]].text for x in cands})
        raise SpecError(source, None, f"no Megatron-LM training launch found: it runs {', '.join(names)} "
                        "(not a pretrain_*.py / train_*.py / finetune*.py script)")
    c, i = pick[-1]
    penv = dict(env)
    penv.update({k: v for k, v in res.variables.items() if isinstance(v, str)})
    penv.update({k: v for k, v in c.env.items() if isinstance(v, str)})
    f = FoundLaunch(args=c.words[i + 1:], launcher=c.words[:i], entry=_basename(c.words[i]), line=c.line,
               wrappers=c.wrappers, env=penv, prefix_env={k: v for k, v in c.env.items() if isinstance(v, str)},
               entry_path=c.words[i].text)
    if len(cands) > 1:
        f.notes.append(f"{len(cands)} commands run a Python script; read the training launch at line {c.line}")
    world_from_launcher(f, res.sbatch)
    if f.world is not None and f.world < 1:
        # torchrun --nnodes 0, srun --ntasks 0: no rank would start
        raise SpecError(source, "world size", f"{f.world_from} starts {f.world} processes; expected at least 1")
    return f, res


def refuse_other_family(entry: str, source: str) -> None:
    """A training script of another model family (T5, BERT, Mamba, multimodal, ...) is refused
    by name: its model is not the decoder-only GPT the planner prices, and reading its flags as
    one would price something else."""
    for key, family in OTHER_FAMILIES.items():
        if os.path.basename(entry) == key or ("/" in key and (entry == key or entry.endswith("/" + key))):
            raise SpecError(source, None, f"{key}: {family} is not a decoder-only GPT model; "
                            "the planner reads pretrain_gpt.py launches")
