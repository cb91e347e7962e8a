"""The main example, ``examples/arithmetic_tiny.yaml``, for ``arith_steps`` GRPO steps on the device.

Unchanged but for: the device, bf16 through FSDP2 (what ``auto`` picks on one GPU; said
explicitly so the CPU smoke run takes the same path), ``eval.every=0`` (held-out accuracy only
before and after: the evaluation every 5 steps would cost a fifth of the time budget),
one checkpoint at the end, and the python tool isolated without bubblewrap. The warm start
(SFT, cached per machine) runs inside ``Trainer(...)`` and is timed as set-up.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from gpu_check.bootstrap import REPO
from gpu_check.policy import use_tool_without_bwrap
from gpu_check.profile import Profile
from gpu_check.results import ArithmeticData

CONFIG = REPO / "examples" / "arithmetic_tiny.yaml"


def run_arithmetic(profile: Profile, work: Path, log) -> ArithmeticData:
    """Build the trainer (warm start included), train, read the run's metrics back."""
    from agentrl import Trainer, load_config

    steps = profile.arith_steps
    cfg = load_config(CONFIG, [
        f"output_dir={work / 'arithmetic_run'}", f"model.device={profile.device}", f"train.steps={steps}",
        "parallel.fsdp=true", "parallel.mixed_precision=bf16", "eval.every=0",
        f"train.checkpoint_every={steps}", *profile.arith_overrides,
    ])
    data = ArithmeticData(device=profile.device, steps_asked=steps, eval_tasks=cfg.eval.num_tasks)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=log)
    data.isolation_level = use_tool_without_bwrap(trainer)
    data.setup_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = trainer.train()
    data.train_s = time.perf_counter() - t1
    data.steps_done = result.steps_done
    data.accuracy_before, data.accuracy_after = result.first_eval, result.final_eval
    rows = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    steps_rows = [r for r in rows if r.get("time/step") is not None]
    if steps_rows:
        data.median_step_s = statistics.median(r["time/step"] for r in steps_rows)
        data.reward_first, data.reward_last = steps_rows[0]["reward/mean"], steps_rows[-1]["reward/mean"]
        data.mismatch_abs_max = max((r.get("mismatch/abs_max") or 0.0) for r in steps_rows)
    return data
