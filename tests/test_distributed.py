"""Scale-out on CPU with gloo: a 2-rank FSDP2 update equals the 1-process update on the same
batch; a 2-rank sharded checkpoint resumes in 2 ranks and in 1; LoRA trains only adapters and
its reference is the base model; `torchrun -m agentrl train` runs and resumes in one process.

The torchrun workers are this file run as a script (``python -m torch.distributed.run ...
tests/test_distributed.py worker ...``): the batch is a fixed, seeded set of trajectories saved
as JSONL, so both runs see exactly the same tokens, masks and rewards.
"""

from __future__ import annotations

import dataclasses
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

from agentrl.run.config import ConfigError, LoRAConfig, ParallelConfig, load_config
from agentrl.scale.distributed import shard_whole_groups
from agentrl.scale.parallel import resolve_plan
from agentrl.types import Span, Trajectory, Verdict, read_jsonl, write_jsonl

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
                                  messages=[], verdict=Verdict(rewards[i]), group_id=f"g{g}", sample_index=i,
                                  task_id=f"t{g}"))
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


def test_fixed_batch_gives_ranks_unequal_micro_batch_counts():
    """The 2-rank test then runs the padding path (empty micro-batches on the shorter rank)."""
    from agentrl.algo.batching import plan_micro_batches

    cfg = load_config(None, OVERRIDES)
    counts = [len(plan_micro_batches([len(t.token_ids) for t in rank_share(fixed_batch(), r, 2)],
                                     cfg.train.micro_batch_tokens)) for r in range(2)]
    assert counts[0] != counts[1], counts


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


# -- LoRA, gradient checkpointing, legacy checkpoints (one process) ---------------------------


@pytest.fixture()
def tiny():
    from agentrl.run.build import load_model_and_tokenizer
    from agentrl.models.tiny import ensure_tiny_model

    torch.set_num_threads(1)
    path = str(ensure_tiny_model())
    return lambda: load_model_and_tokenizer(path)


def _objective_and_settings(cfg, pad_id):
    """The run's objective scored at T=1 with a 64-token Dr. GRPO normalizer, and its update settings."""
    from agentrl.algo.objective import Objective
    from agentrl.algo.update import UpdateSettings

    objective = dataclasses.replace(Objective.from_config(cfg), temperature=1.0, norm_len=64)
    return objective, UpdateSettings(micro_batch_tokens=cfg.train.micro_batch_tokens,
                                     num_iterations=cfg.train.num_iterations,
                                     max_grad_norm=cfg.optim.max_grad_norm, pad_id=pad_id)


def _update(model, trajs, cfg, ref=None):
    from agentrl.algo.update import compute_advantages, grpo_update
    from agentrl.run.optim import build_optimizer

    opt, sched = build_optimizer(cfg, model)
    objective, settings = _objective_and_settings(cfg, pad_id=0)
    adv, filt = compute_advantages(trajs, objective)
    st = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective, settings, ref_model=ref)
    return st, opt, sched


def test_lora_trains_only_adapters_and_reference_is_the_base(tiny, tmp_path):
    pytest.importorskip("peft")
    from agentrl.algo.batching import collate, score_tokens
    from agentrl.run.checkpoint import TrainState, latest_checkpoint
    from agentrl.run.checkpoint_dcp import load_sharded_checkpoint, save_sharded_checkpoint
    from agentrl.scale.parallel import AdapterDisabledReference, prepare_policy
    from agentrl.run.optim import build_optimizer
    from agentrl.scale.weight_sync import WeightSync, export_weights

    cfg = load_config(None, OVERRIDES + ["lora.enabled=true", "lora.r=4", "lora.alpha=8.0", "optim.lr=1.0e-2"])
    plan = resolve_plan(cfg.parallel, cfg.lora, world_size=1, device="cpu")
    policy = prepare_policy(tiny()[0], plan, cfg.lora, "cpu")
    ref = AdapterDisabledReference(policy)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trajs = fixed_batch()
    st, opt, sched = _update(policy, trajs, cfg, ref)
    assert st.loss > st.pg_loss  # iteration 2's loss has a KL term: the policy moved away from the reference
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed), sorted(changed)[:5]
    assert any("lora_B" in n for n in changed)  # B starts at 0: the adapter now does something

    base = tiny()[0].eval()
    mb = collate(trajs, list(range(len(trajs))), 0)
    with torch.no_grad():
        ref_lp = score_tokens(ref, mb, 1.0)[0]
        base_lp = score_tokens(base, mb, 1.0)[0]
        pol_lp = score_tokens(policy, mb, 1.0)[0]
    m = mb.loss_mask.bool()
    assert torch.allclose(ref_lp[m], base_lp[m], atol=1e-6, rtol=0)
    assert (pol_lp[m] - base_lp[m]).abs().max() > 1e-3  # ...while the policy itself differs

    # the merged export makes a plain copy compute what the LoRA policy computes
    sampler = tiny()[0].eval()

    from agentrl.engines.scripted import ScriptedEngine

    sync = WeightSync(ScriptedEngine([]), sampler, shared=False)  # an engine whose sync only bumps the version
    sync(policy)
    assert sync.engine.policy_version == 1
    with torch.no_grad():
        assert torch.allclose(score_tokens(sampler, mb, 1.0)[0][m], pol_lp[m], atol=1e-5)

    # a LoRA checkpoint (sharded format, no process group) resumes adapters and optimizer
    save_sharded_checkpoint(tmp_path, TrainState(1, 1), policy, tiny()[1], opt, sched, "seed: 0\n", lora=True)
    policy2 = prepare_policy(tiny()[0], plan, cfg.lora, "cpu")
    opt2, sched2 = build_optimizer(cfg, policy2)
    load_sharded_checkpoint(latest_checkpoint(tmp_path), policy2, opt2, sched2, lora=True)
    for n, p in policy2.named_parameters():
        assert torch.equal(p, dict(policy.named_parameters())[n]), n
    with pytest.raises(ValueError, match="lora.enabled=true"):
        load_sharded_checkpoint(latest_checkpoint(tmp_path), *_plain_with_optim(tiny, cfg), lora=False)
    exported = dict(export_weights(policy))
    from safetensors.torch import load_file

    saved = load_file(str(latest_checkpoint(tmp_path) / "model" / "model.safetensors"))
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)


def _plain_with_optim(tiny, cfg):
    from agentrl.run.optim import build_optimizer

    model = tiny()[0]
    return (model, *build_optimizer(cfg, model))


def test_grad_checkpointing_gives_the_same_gradient(tiny):
    from agentrl.algo.batching import collate, score_tokens
    from agentrl.scale.parallel import prepare_policy

    trajs = fixed_batch(num_groups=2)
    mb = collate(trajs, list(range(len(trajs))), 0)
    grads = []
    for ckpt in (False, True):
        plan = resolve_plan(ParallelConfig(grad_checkpointing=ckpt), LoRAConfig(), 1, "cpu")
        model = prepare_policy(tiny()[0].train(), plan, LoRAConfig(), "cpu")
        (score_tokens(model, mb, 1.0)[0] * mb.loss_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert model.model.layers[0].gradient_checkpointing
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, atol=1e-6), n


def test_single_process_checkpoint_resumes_in_sharded_layout(tiny, tmp_path):
    """The optimizer of a plain checkpoint (keyed by position) is re-keyed by parameter name."""
    from agentrl.run.checkpoint import TrainState, latest_checkpoint, save_checkpoint
    from agentrl.run.checkpoint_dcp import load_unsharded_into_sharded
    from agentrl.run.optim import build_optimizer

    cfg = load_config(None, OVERRIDES + ["algo.kl_coef=0.0"])
    model, tok = tiny()
    st, opt, sched = _update(model, fixed_batch(), cfg)
    save_checkpoint(tmp_path, TrainState(1, 1), model, tok, opt, sched, "seed: 0\n")
    model2 = tiny()[0]
    opt2, sched2 = build_optimizer(cfg, model2)
    state = load_unsharded_into_sharded(latest_checkpoint(tmp_path), model2, opt2, sched2)
    assert state.step == 1
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys() and s1
    for i in s1:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[i][k], s2[i][k]), (i, k)


# -- the torchrun worker -----------------------------------------------------------------------


def _worker(batch_path: str, out_dir: str, ckpt_run: str) -> None:
    """One update on this rank's share of the fixed batch; then checkpoint round trips."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from agentrl.run.build import load_model_and_tokenizer
    from agentrl.run.checkpoint import TrainState, latest_checkpoint
    from agentrl.run.checkpoint_dcp import load_sharded_checkpoint, save_sharded_checkpoint
    from agentrl.scale.distributed import barrier, gather_to_main, init_distributed, shutdown
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.scale.parallel import prepare_policy, prepare_reference
    from agentrl.run.optim import build_optimizer
    from agentrl.algo.update import compute_advantages, grpo_update
    from agentrl.scale.weight_sync import export_weights

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
    objective, settings = _objective_and_settings(cfg, pad_id=tok.pad_token_id)
    adv, filt = compute_advantages(mine, objective)
    t0 = time.perf_counter()
    st = grpo_update(model, opt, sched, mine, filt.keep.tolist(), objective, settings, ref_model=ref)
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
    # A rank that exits with its gloo group alive, while another still works, can abort in the
    # group's destructor ("terminate called without an active exception"): leave together.
    barrier()
    shutdown()


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


@pytest.mark.slow
def test_torchrun_cli_lora_then_resume_in_one_process(tmp_path):
    """`torchrun -m agentrl train` with 2 ranks (LoRA, KL to the adapter-off base, gradient
    checkpointing): rank 0 alone writes the run dir, with every rank's rollouts; one plain
    process then resumes the sharded checkpoint."""
    pytest.importorskip("peft")
    run = tmp_path / "run"
    common = [str(CI_CFG), f"output_dir={run}", "eval.at_start=false", "eval.num_tasks=4", "lora.enabled=true",
              "lora.r=4", "algo.kl_coef=0.05", "parallel.grad_checkpointing=true"]
    t2 = _launch(["-m", "agentrl", "train", *common, "train.steps=1"], 2, tmp_path)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # one writer
    assert rows[0]["train/attempts"] == 16.0  # 4 prompts x G=4, counted over both ranks
    trajs = read_jsonl(str(run / "rollouts" / "step_000001.jsonl"))
    assert len(trajs) == 16 and len({t.group_id for t in trajs}) == 4
    for t in trajs:
        t.check()
        assert t.old_logprobs is not None and len(t.old_logprobs) == len(t.token_ids)
    assert len(read_jsonl(str(run / "rollouts" / "eval_step_000001.jsonl"))) == 4  # both ranks' eval tasks
    assert len(list((run / "tensorboard").iterdir())) == 1
    ck = run / "checkpoints" / "step_000001"
    assert sorted(p.name for p in (ck / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (ck / "model" / "model.safetensors").exists() and (ck / "state.pt").exists()
    assert not list((run / "checkpoints").glob(".tmp_*"))

    t1 = _launch(["-m", "agentrl", "train", *common, "train.steps=2", "resume=true"], 1, tmp_path)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert (run / "checkpoints" / "step_000002" / "dcp").is_dir()  # LoRA keeps the sharded format
    print(f"\ntorchrun 2 ranks, 1 step: {t2:.1f}s; 1-process resume, 1 step: {t1:.1f}s")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    _worker(*sys.argv[2:5])
