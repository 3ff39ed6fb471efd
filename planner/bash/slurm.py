"""What the reader knows of Slurm: the options of srun / sbatch that take a value, `#SBATCH`
headers, and the SLURM_* variables a job's options set."""

from __future__ import annotations

SRUN_VALUED = set("""-A --account -c --cpus-per-task -D --chdir -e --error -i --input -J --job-name -N --nodes
-n --ntasks -o --output -p --partition -t --time -w --nodelist -x --exclude --container-image --container-mounts
--container-workdir --container-name --container-env --export --mpi --ntasks-per-node --gpus-per-node --gpus -G
--gres --mem --mem-per-cpu --mem-per-gpu --cpus-per-gpu --gpus-per-task --ntasks-per-gpu --cpu-bind --distribution
-m --network --reservation --qos -q --constraint -C --dependency -d --comment --nodefile -F --het-group
--accel-bind --switches --wait -W --signal --open-mode --kill-on-bad-exit""".split())
SBATCH_VALUED = SRUN_VALUED | {"--array", "-a", "--begin", "-b", "--mail-type", "--mail-user"}
# the job's size options -> the SLURM_* variables they set in the job
SLURM_VARS = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
              "--ntasks": ("SLURM_NTASKS",), "--gpus-per-node": ("SLURM_GPUS_PER_NODE",)}


def sbatch_options(words: list[str]) -> dict:
    """--nodes=2 / -N 2 / --ntasks-per-node 8 / --gpus-per-node=8 / --gres=gpu:8 -> dict."""
    out: dict = {}
    i = 0
    alias = {"-N": "--nodes", "-n": "--ntasks", "-G": "--gpus", "-p": "--partition", "-A": "--account"}
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("-"):
            continue
        key, eq, val = w.partition("=")
        if not eq and key in SBATCH_VALUED and i < len(words):
            val = words[i]
            i += 1
        elif not eq and len(key) > 2 and key[1] != "-" and key[:2] in alias:   # -N2
            key, val = key[:2], key[2:]
        out[alias.get(key, key)] = val
    return out


def sbatch_header_options(text: str) -> dict:
    """The options of the #SBATCH lines before the first command (where sbatch reads them)."""
    out: dict = {}
    for ln in text.splitlines():
        s = ln.strip()
        if not s or (s.startswith("#") and not s.startswith("#SBATCH")):
            continue
        if not s.startswith("#SBATCH"):
            break
        out.update(sbatch_options(s[len("#SBATCH"):].split()))
    return out
