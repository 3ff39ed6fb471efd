"""Write emitted plans: DIR/plan-K/{megatron.args, launch.sh, stages.json}, atomically; a
failed run leaves no half-written plan folder."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import PlannerError
from ..megatron.emit import checked_args, launch_script, stage_host_map
from .report import estimate_to_dict


def write_plans(plans, out: str, force: bool) -> list[str]:
    root = Path(out)
    if root.exists() and any(root.iterdir()) and not force:
        raise PlannerError(f"{out}: output folder exists and is not empty; pass --force to overwrite")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent if root.parent.exists() else None, prefix=f".{root.name}."))
    written = []
    try:
        for k, e in enumerate(plans, 1):
            d = staging / f"plan-{k}"
            d.mkdir()
            s = e.strategy
            args = checked_args(e.model, s)
            gpn = {g.name: g.gpus_per_node for g in e.cluster.node_groups}
            used = {gpn[g] for g in e.stage_groups if g in gpn}
            if len(used) > 1:
                raise PlannerError(f"plan-{k} runs on node groups with {' and '.join(map(str, sorted(used)))} GPUs "
                                   "per node; one torchrun launch needs the same --nproc-per-node everywhere")
            hmap = stage_host_map(s, e.stage_groups, gpn)
            lines = []
            i = 0
            while i < len(args):
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    lines.append(f"{args[i]} {args[i + 1]}")
                    i += 2
                else:
                    lines.append(args[i])
                    i += 1
            (d / "megatron.args").write_text("\n".join(lines) + "\n", encoding="utf-8")
            script = launch_script(args, s, hmap, min(gpn.values()), f"plan-{k}")
            (d / "launch.sh").write_text(script, encoding="utf-8")
            os.chmod(d / "launch.sh", 0o755)
            doc = estimate_to_dict(e)
            doc["stage_hosts"] = hmap
            (d / "plan.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            written.append(str(root / f"plan-{k}"))
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written
