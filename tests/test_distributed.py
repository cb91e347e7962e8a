"""Scale-out on CPU with gloo: a 2-rank FSDP2 update equals the 1-process update on the same
batch; a 2-rank sharded checkpoint resumes in 2 ranks and in 1; LoRA trains only adapters and
its reference is the base model; `torchrun -m agentrl train` runs and resumes in one process.

The torchrun workers are this file run as a script (``python -m torch.distributed.run ...
tests/test_distributed.py worker ...``): the batch is a fixed, seeded set of trajectories saved
as JSONL, so both runs see exactly the same tokens, masks and rewards.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from agentrl.config import ConfigError, LoRAConfig, ParallelConfig, load_config
from agentrl.distributed import shard_whole_groups
from agentrl.parallel import resolve_plan
from agentrl.types import Span, Trajectory, read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"
LOSS_RTOL = 1e-5  # relative difference of the loss, 2 ranks vs 1
UPDATE_RTOL = 1e-4  # ||Δθ_2 - Δθ_1|| / ||Δθ_1|| over all parameters
OVERRIDES = ["algo.num_samples=4", "algo.kl_coef=0.05", "optim.lr=1.0e-3", "train.micro_batch_tokens=64",
             "train.num_iterations=2", "rollout.max_total_tokens=64"]


# -- the fixed batch ---------------------------------------------------------------------


def fixed_batch(num_groups: int = 3, G: int = 4, seed: int = 0) -> list[Trajectory]:
    """Seeded trajectories: prompt, model turn, tool output, model turn; group lengths differ,
    so two ranks plan different numbers of micro-batches."""
    rng = random.Random(seed)
    out = []
    for g in range(num_groups):
        prompt = [1] + [rng.randrange(11, 1024) for _ in range(rng.randint(4, 8))]
        rewards = [1.0, 0.0, float(g % 2), 0.0]
        for i in range(G):
            ids, mask, lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
            spans = [Span(0, len(prompt), "prompt")]
            for kind, n in [("model", rng.randint(3, 6 + 8 * g)), ("tool", rng.randint(2, 5)),
                            ("model", rng.randint(2, 6))]:
                start = len(ids)
                ids += [rng.randrange(11, 1024) for _ in range(n)]
                mask += [int(kind == "model")] * n
                lps += [-rng.uniform(0.1, 4.0) if kind == "model" else 0.0 for _ in range(n)]
                spans.append(Span(start, len(ids), kind))
            out.append(Trajectory(token_ids=ids, prompt_len=len(prompt), loss_mask=mask, logprobs=lps, spans=spans,
                                  messages=[], reward=rewards[i], group_id=f"g{g}", sample_index=i,
                                  metadata={"task_id": f"t{g}"}))
    return out


def rank_share(trajs: list[Trajectory], rank: int, world: int) -> list[Trajectory]:
    """Rank ``rank``'s trajectories: its slice of whole groups, in order."""
    groups = list(dict.fromkeys(t.group_id for t in trajs))
    mine = set(shard_whole_groups(groups, rank, world))
    return [t for t in trajs if t.group_id in mine]


# -- fast tests ------------------------------------------------------------------------------


def test_groups_never_straddle_ranks():
    trajs = fixed_batch(num_groups=5)
    for world in (1, 2, 3, 4, 8):
        shares = [rank_share(trajs, r, world) for r in range(world)]
        assert [t.group_id for s in shares for t in s] == [t.group_id for t in trajs]  # a partition, in order
        owners = {}
        for r, share in enumerate(shares):
            for t in share:
                assert owners.setdefault(t.group_id, r) == r, f"group {t.group_id} on two ranks"
        sizes = [len({t.group_id for t in s}) for s in shares]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="outside"):
        shard_whole_groups([1, 2], rank=2, world_size=2)


def test_plan_resolution():
    cpu = resolve_plan(ParallelConfig(), LoRAConfig(), world_size=1, device="cpu")
    assert not cpu.fsdp and cpu.mixed_precision == "fp32" and cpu.plain
    assert resolve_plan(ParallelConfig(), LoRAConfig(), world_size=2, device="cpu").fsdp
    gpu = resolve_plan(ParallelConfig(), LoRAConfig(enabled=True), world_size=1, device="cuda")
    assert gpu.fsdp and gpu.mixed_precision == "bf16" and gpu.lora and not gpu.plain
    with pytest.raises(ConfigError, match="parallel.fsdp=auto"):
        resolve_plan(ParallelConfig(fsdp=False), LoRAConfig(), world_size=2, device="cpu")
    with pytest.raises(ConfigError, match="FSDP2 policies"):
        resolve_plan(ParallelConfig(fsdp=False, cpu_offload=True), LoRAConfig(), world_size=1, device="cpu")


def test_config_keys():
    cfg = load_config(None, ["parallel.fsdp=true", "parallel.grad_checkpointing=true", "lora.enabled=true",
                             "lora.target_modules=[q_proj, v_proj]"])
    assert cfg.parallel.fsdp is True and cfg.lora.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="bool or 'auto'"):
        load_config(None, ["parallel.fsdp=sometimes"])


# -- the torchrun worker -----------------------------------------------------------------------


def _worker(batch_path: str, out_dir: str, ckpt_run: str) -> None:
    """One update on this rank's share of the fixed batch; then checkpoint round trips."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from agentrl.build import load_model_and_tokenizer
    from agentrl.checkpoint import TrainState, latest_checkpoint
    from agentrl.checkpoint_dcp import load_sharded_checkpoint, save_sharded_checkpoint
    from agentrl.distributed import gather_to_main, init_distributed
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.parallel import prepare_policy, prepare_reference
    from agentrl.trainer import build_optimizer
    from agentrl.update import compute_advantages, grpo_update
    from agentrl.weight_sync import export_weights

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    cfg = load_config(None, OVERRIDES)
    plan = resolve_plan(cfg.parallel, cfg.lora, info.world_size, "cpu")
    path = str(ensure_tiny_model())

    def policy():
        model, tok = load_model_and_tokenizer(path)
        model = prepare_policy(model, plan, cfg.lora, "cpu")
        return (model, tok, *build_optimizer(cfg, model))

    def full_optim(model, opt) -> dict:
        osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: {n: v.clone() for n, v in st.items() if torch.is_tensor(v)} for k, st in osd.get("state", {}).items()}

    model, tok, opt, sched = policy()
    ref = prepare_reference(load_model_and_tokenizer(path)[0], plan, "cpu")
    before = {n: t.clone() for n, t in export_weights(model)}
    mine = rank_share(read_jsonl(batch_path), info.rank, info.world_size)
    adv, filt = compute_advantages(mine, cfg.algo)
    t0 = time.perf_counter()
    st = grpo_update(model, opt, sched, mine, filt.keep.tolist(), cfg.algo, temperature=1.0,
                     micro_batch_tokens=cfg.train.micro_batch_tokens, num_iterations=cfg.train.num_iterations,
                     max_grad_norm=cfg.optim.max_grad_norm, pad_id=tok.pad_token_id, norm_len=64, ref_model=ref)
    update_s = time.perf_counter() - t0
    after = {n: t.clone() for n, t in export_weights(model)}
    old = gather_to_main({f"{t.group_id}/{t.sample_index}": t.old_logprobs for t in mine})
    result = {"stats": asdict(st), "before": before, "after": after, "optim": full_optim(model, opt),
              "old_logprobs": {k: v for d in old or [] for k, v in d.items()}, "update_s": update_s,
              "world": info.world_size, "fsdp": plan.fsdp}

    run = Path(ckpt_run)
    if info.world_size > 1:  # write a sharded checkpoint, then resume it in this job (a fresh policy)
        save_sharded_checkpoint(run, TrainState(step=1, policy_version=1), model, tok, opt, sched, "seed: 0\n",
                                lora=False)
        model2, _, opt2, sched2 = policy()
        state = load_sharded_checkpoint(latest_checkpoint(run), model2, opt2, sched2, lora=False)
        result["resumed"] = {"step": state.step, "weights": dict(export_weights(model2)),
                             "optim": full_optim(model2, opt2), "lr": sched2.get_last_lr()}
    elif (run / "checkpoints").exists():  # the 2-rank checkpoint, resumed in one plain process
        model2, _, opt2, sched2 = policy()
        state = load_sharded_checkpoint(latest_checkpoint(run), model2, opt2, sched2, lora=False)
        result["resumed"] = {"step": state.step, "weights": dict(export_weights(model2)),
                             "optim": full_optim(model2, opt2), "lr": sched2.get_last_lr()}
    if info.is_main:
        torch.save(result, Path(out_dir) / f"world{info.world_size}.pt")


def _launch(args: list[str], nproc: int, cwd: Path, timeout: float = 600) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    else:
        cmd = [sys.executable, *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def two_vs_one(tmp_path_factory):
    """The 2-rank job (update, sharded save, 2-rank resume), then the 1-process job (update, 1-rank resume)."""
    d = tmp_path_factory.mktemp("dist")
    batch = d / "batch.jsonl"
    write_jsonl(str(batch), fixed_batch())
    args = [str(Path(__file__)), "worker", str(batch), str(d), str(d / "run")]
    t2 = _launch(args, 2, ROOT)
    t1 = _launch(args, 1, ROOT)
    r1, r2 = torch.load(d / "world1.pt", weights_only=False), torch.load(d / "world2.pt", weights_only=False)
    print(f"\nlaunch wall time: 2 ranks {t2:.1f}s, 1 process {t1:.1f}s; "
          f"update 2 ranks {r2['update_s']:.2f}s vs 1 process {r1['update_s']:.2f}s")
    return r1, r2


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in a)
    den = sum(float(a[k].double().pow(2).sum()) for k in a)
    return (num / max(den, 1e-30)) ** 0.5


@pytest.mark.slow
def test_two_ranks_match_one_process(two_vs_one):
    r1, r2 = two_vs_one
    assert r2["fsdp"] and not r1["fsdp"]
    s1, s2 = r1["stats"], r2["stats"]
    assert s1["trained_attempts"] == s2["trained_attempts"] == 12
    assert s1["trained_tokens"] == s2["trained_tokens"]
    assert s1["loss"] != 0.0 and abs(s2["loss"] - s1["loss"]) <= LOSS_RTOL * abs(s1["loss"]), (s1["loss"], s2["loss"])
    for k in ("pg_loss", "grad_norm", "kl", "entropy", "clip_frac", "ratio_mean", "mismatch_mean"):
        assert s2[k] == pytest.approx(s1[k], rel=1e-4, abs=1e-7), k
    assert r1["before"].keys() == r2["before"].keys()
    assert _rel(r1["before"], r2["before"]) == 0.0
    d1 = {k: r1["after"][k] - r1["before"][k] for k in r1["before"]}
    d2 = {k: r2["after"][k] - r2["before"][k] for k in r2["before"]}
    assert sum(float(v.abs().sum()) for v in d1.values()) > 0, "the update must move the parameters"
    update_rel = _rel(d1, d2)
    print(f"loss {s1['loss']:.8f} vs {s2['loss']:.8f}; relative update difference {update_rel:.2e}")
    assert update_rel <= UPDATE_RTOL
    # π_old of every token was scored by the sharded model as by the plain one
    assert r1["old_logprobs"].keys() == r2["old_logprobs"].keys() and len(r1["old_logprobs"]) == 12
    for k, v in r1["old_logprobs"].items():
        assert torch.allclose(torch.tensor(v), torch.tensor(r2["old_logprobs"][k]), atol=1e-5), k


@pytest.mark.slow
def test_sharded_checkpoint_resumes_in_two_ranks_and_one(two_vs_one):
    r1, r2 = two_vs_one
    for resumed in (r2["resumed"], r1["resumed"]):  # 2 ranks, then a plain single process
        assert resumed["step"] == 1
        assert resumed["weights"].keys() == r2["after"].keys()
        for k, v in r2["after"].items():
            assert torch.equal(resumed["weights"][k], v), k
        assert resumed["optim"].keys() == r2["optim"].keys() and r2["optim"]
        for k, st in r2["optim"].items():
            for n, v in st.items():
                assert torch.equal(resumed["optim"][k][n], v), (k, n)
        assert resumed["lr"] == pytest.approx([1e-3])


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    _worker(*sys.argv[2:5])
