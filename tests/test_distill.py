"""On-policy distillation (algo.distill, agentrl/algo/distill.py): per-token advantages, their loss
and gradient in each surrogate against numbers computed by hand (arithmetic in the comments, on
plain floats with ``math``, never with the code under test); the config's refusals; the update
(no zero-advantage skipping, a teacher equal to the student moves nothing); a tiny end-to-end run."""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import pytest

from synthetic_trajectories import seeded_update_batch
import torch

from agentrl.algo.distill import distill_advantages, reverse_kl_tokens
from agentrl.algo.objective import Objective
from agentrl.algo.surrogates import SURROGATES
from agentrl.algo.surrogates.gspo import gspo_loss
from agentrl.run.config import load_config
from agentrl.types import ConfigError, Span, Trajectory, Verdict

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def close(got: torch.Tensor, want, atol: float = 1e-5) -> None:
    want_t = torch.as_tensor(want, dtype=torch.float64)
    assert torch.allclose(got.detach().double(), want_t, atol=atol, rtol=0), (got, want)


# μ (the sampler), the teacher and the mask of two attempts of three positions; position 2 untrained
MU = [[-1.0, -0.5, -2.0], [-0.3, -4.0, 0.0]]
TEACHER = [[-0.2, -3.0, -2.0], [-1.3, -40.0, NAN]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
ENV = [0.5, -1.0]  # A_i


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


# ---------------------------------------------------------------- the advantage


def test_reverse_kl_and_advantages_by_hand():
    # d = log μ - log π_T: -1 - -0.2 = -0.8, -0.5 - -3 = 2.5; -0.3 - -1.3 = 1.0, -4 - -40 = 36 -> clamped to 20
    close(reverse_kl_tokens(_t(MU), _t(TEACHER), _t(MASK)), [[-0.8, 2.5, 0.0], [1.0, 20.0, 0.0]])
    # pure, coef 0.5: A_t = -0.5 d
    pure = distill_advantages(_t(MU), _t(TEACHER), _t(MASK), coef=0.5)
    close(pure, [[0.4, -1.25, 0.0], [-0.5, -10.0, 0.0]])
    # mixed: A_t = A_i - 0.5 d: 0.5 + 0.4, 0.5 - 1.25; -1 - 0.5, -1 - 10
    mixed = distill_advantages(_t(MU), _t(TEACHER), _t(MASK), coef=0.5, env_advantages=_t(ENV))
    close(mixed, [[0.9, -0.75, 0.0], [-1.5, -11.0, 0.0]])
    assert torch.isfinite(mixed).all()  # the NaN teacher log-prob sat at an untrained position


def test_masked_tokens_get_zero_whatever_sits_there():
    mu, teacher = _t([[float("-inf"), -1.0]]), _t([[NAN, -1.0]])
    adv = distill_advantages(mu, teacher, _t([[0.0, 1.0]]), coef=1.0, env_advantages=_t([2.0]))
    assert adv.tolist() == [[0.0, 2.0]]  # masked: 0 (not A_i); trained with d = 0: A_i alone


def test_the_objective_mixes_as_distill_reward_says():
    adv = _t(ENV)
    mixed, d = Objective(distill=True, distill_coef=0.5).token_advantages(adv, _t(MU), _t(TEACHER), _t(MASK))
    pure, _ = Objective(distill=True, distill_coef=0.5, distill_reward=False).token_advantages(
        adv, _t(MU), _t(TEACHER), _t(MASK))
    close(mixed, [[0.9, -0.75, 0.0], [-1.5, -11.0, 0.0]])
    close(pure, [[0.4, -1.25, 0.0], [-0.5, -10.0, 0.0]])
    close(d, [[-0.8, 2.5, 0.0], [1.0, 20.0, 0.0]])


# ---------------------------------------------------------------- the surrogates with A_t [B, T]


def _loss(loss: str, lp, old, adv, mask, **cfg):
    x = _t(lp).clone().requires_grad_(True)
    m = _t(mask)
    out = Objective(loss=loss, distill=True, **cfg).policy_loss(
        x, _t(old), adv if isinstance(adv, torch.Tensor) else _t(adv), m,
        total_seqs=int((m.sum(1) > 0).sum()), total_tokens=int(m.sum()))
    out.loss.backward()
    return out, x.grad


PURE = [[0.4, -1.25, 0.0], [-0.5, -10.0, 0.0]]  # the pure advantages above (coef 0.5)
OLD = [[-1.0, -0.5, -2.0], [-0.3, -4.0, 0.0]]


def test_clip_at_ratio_one_is_the_per_token_policy_gradient():
    out, grad = _loss("clip", OLD, OLD, PURE, MASK)
    # ρ = 1: L_t = -A_t; seq-mean-token-mean, G = 2, |y_i| = 2: 1/2 [(-0.4 + 1.25)/2 + (0.5 + 10)/2] = 2.8375
    close(out.loss, 2.8375)
    # dL/dlp_t = -A_t / (|y_i| G) = -A_t / 4
    close(grad, [[-0.1, 0.3125, 0.0], [0.125, 2.5, 0.0]])


def test_clip_off_ratio_one_clips_each_token_by_the_sign_of_its_own_advantage():
    lp = [[-1.0 + 0.3, -0.5 - 0.3, -2.0], [-0.3 + 0.1, -4.0, 0.0]]
    out, grad = _loss("clip", lp, OLD, PURE, MASK)
    r = [math.exp(0.3), math.exp(-0.3), math.exp(0.1)]  # 1.35 > 1.2, 0.741 < 0.8, 1.105 inside
    l00 = -1.2 * 0.4  # A > 0, ρ above 1.2: clipped
    l01 = -min(r[1] * -1.25, 0.8 * -1.25)  # A < 0, ρ below 0.8: -min(-0.926, -1.0) = 1.0, clipped
    l10 = -r[2] * -0.5  # inside: -ρA
    l11 = 10.0  # ρ = 1, A = -10
    close(out.loss, 0.5 * ((l00 + l01) / 2 + (l10 + l11) / 2))
    close(grad, [[0.0, 0.0, 0.0], [r[2] * 0.5 / 4, 10.0 / 4, 0.0]])  # clipped tokens: 0; else -ρA/4
    close(out.clip_frac, 0.5)  # 2 of 4 trained tokens


def test_gspo_token_takes_a_per_token_advantage():
    # mean log-ratio 0: s = 1, inside the paper's clip; L_t = -s A_t, gradient -s A_t / |y|
    out, grad = _loss("gspo_token", [[0.1, -0.1]], [[0.0, 0.0]], [[2.0, -1.0]], [[1.0, 1.0]])
    close(out.loss, (-2.0 + 1.0) / 2)
    close(grad, [[-1.0, 0.5]])
    # mean log-ratio 0.3: s = e^0.3 = 1.35 beyond 1 + 4e-4; the A > 0 token is clipped (-1.0004·2, no
    # gradient), the A < 0 token is not: -min(s·-1, 1.0004·-1) = s, gradient -s·(-1)/2
    s = math.exp(0.3)
    out, grad = _loss("gspo_token", [[0.2, 0.4]], [[0.0, 0.0]], [[2.0, -1.0]], [[1.0, 1.0]])
    close(out.loss, (-1.0004 * 2.0 + s) / 2)
    close(grad, [[0.0, s / 2]])


def test_sapo_gates_each_token_by_the_sign_of_its_advantage():
    out, grad = _loss("sapo", [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, -1.0]], [[1.0, 1.0]])
    # ρ = 1: f = σ(0)·4/τ = 2/τ; L = -2/1.0·1, -2/1.05·(-1); gradient -A·4σ(1-σ)ρ/|y| = -A/2
    close(out.loss, (-2.0 + 2.0 / 1.05) / 2)
    close(grad, [[-0.5, 0.5]])


def test_cispo_takes_a_per_token_advantage():
    out, grad = _loss("cispo", [[-2.0, -1.0]], [[-2.0, -1.0]], [[1.0, -3.0]], [[1.0, 1.0]])
    # ρ = 1: L = -A log π = -(1)(-2), -(-3)(-1); gradient -A/|y|
    close(out.loss, (2.0 - 3.0) / 2)
    close(grad, [[-0.5, 1.5]])


@pytest.mark.parametrize("name", [n for n, s in SURROGATES.items() if s.token_advantages])
def test_a_per_token_advantage_constant_in_a_row_is_the_per_attempt_one(name):
    """A_i [B] broadcast and the same values written out [B, T] give the same loss and gradient."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 2
    lp = old + (torch.rand(3, 5, generator=g) - 0.5) * 0.6
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    adv = torch.tensor([1.5, -0.7, 0.3])
    a, ga = _loss(name, lp.tolist(), old.tolist(), adv, mask.tolist(), gspo_eps_low=0.2, gspo_eps_high=0.2)
    b, gb = _loss(name, lp.tolist(), old.tolist(), adv[:, None].expand(3, 5).clone(), mask.tolist(),
                  gspo_eps_low=0.2, gspo_eps_high=0.2)
    close(a.loss, b.loss.item(), atol=1e-6)
    close(ga, gb, atol=1e-6)


def test_gspo_refuses_per_token_advantages():
    with pytest.raises(ValueError, match="one per attempt"):
        gspo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))


def test_a_teacher_equal_to_the_student_gives_no_signal():
    """Pure distillation, coef 1, μ = π_T: every A_t is 0, so the loss and its gradient are 0."""
    for name in [n for n, s in SURROGATES.items() if s.token_advantages]:
        adv, _ = Objective(loss=name, distill=True, distill_reward=False).token_advantages(
            _t(ENV), _t(MU), _t(MU), _t(MASK))
        assert adv.abs().sum() == 0
        out, grad = _loss(name, OLD, OLD, adv, MASK)
        assert out.loss.item() == 0 and grad.abs().sum() == 0, name


# ---------------------------------------------------------------- config and printed block


@pytest.mark.parametrize("overrides, needle", [
    (["algo.loss=gspo", "algo.distill=true"], "algo.distill=true does not combine with algo.loss=gspo: "),
    (["algo.loss=gspo", "algo.distill=true"], "set algo.loss=gspo_token"),
    (["algo.distill_coef=0"], "algo.distill_coef=0.0 is out of range: use > 0"),
])
def test_config_refusals_name_the_key_and_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert needle in str(e.value)


def test_distill_needs_a_teacher_and_a_teacher_needs_distill():
    from agentrl.run.reference import check_distill

    assert load_config(None, ["algo.loss=gspo_token", "algo.distill=true"]).algo.distill  # GSPO-token takes A_t
    with pytest.raises(ConfigError, match=r"algo.distill=true needs a teacher: set model.teacher_path"):
        check_distill(load_config(None, ["algo.distill=true"]))
    assert "is not loaded: algo.distill is false" in check_distill(load_config(None, ["model.teacher_path=tiny"]))
    assert check_distill(load_config(None, ["algo.distill=true", "model.teacher_path=tiny"])) is None
    assert check_distill(load_config(None)) is None


def test_printed_block_gains_a_line_only_with_distillation():
    default = Objective().describe().splitlines()
    assert "distill" not in "\n".join(default)
    on = Objective(distill=True).describe().splitlines()
    assert on[3] == (" distill     A_t = A_i + 1.0·(log π_T - log μ)(y_t),  π_T: model.teacher_path, μ: the sampler"
                     "   (on-policy distillation)")
    assert on[:3] + on[4:] == default  # every other line as it was
    pure = Objective(distill=True, distill_coef=0.5, distill_reward=False).describe().splitlines()[3]
    assert pure.startswith(" distill     A_t = 0.5·(log π_T - log μ)(y_t),") and "no A_i" in pure
    off = Objective(distill_coef=0.5, distill_reward=False).describe()  # set, but not read: said so
    assert " ignored     algo.distill_coef=0.5, algo.distill_reward=False (not read with algo.distill=false)" in off


# ---------------------------------------------------------------- the teacher's loading


def test_teacher_path_resolves_like_model_path(tmp_path):
    from agentrl.run.build import resolve_model_path
    from agentrl.run.reference import teacher_model_path

    # "tiny" is the model model.path=tiny names (the same seed, model.tiny_seed)
    for seed in (0, 1):
        cfg = load_config(None, ["model.teacher_path=tiny", f"model.tiny_seed={seed}"])
        assert teacher_model_path(cfg) == resolve_model_path(cfg)
    ckpt = tmp_path / "checkpoints" / "step_000030"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    assert teacher_model_path(load_config(None, [f"model.teacher_path={ckpt}"])) == str(ckpt / "model")
    assert teacher_model_path(load_config(None, [f"model.teacher_path={tmp_path}"])) == str(tmp_path)


def test_a_teacher_with_another_tokenizer_is_refused_at_load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.run.reference import build_teacher, check_same_tokenizer
    from agentrl.scale.parallel import resolve_plan

    student_dir = ensure_tiny_model()
    student, tok = AutoModelForCausalLM.from_pretrained(student_dir), AutoTokenizer.from_pretrained(student_dir)
    other = ensure_tiny_model(vocab_size=512)  # another BPE: the same ids are other pieces of text
    cfg = load_config(None, ["algo.distill=true", f"model.teacher_path={other}"])
    plan = resolve_plan(cfg.parallel, cfg.lora, 1, "cpu")
    with pytest.raises(ConfigError, match=r"has another tokenizer than the student's .* tokens differ"):
        build_teacher(cfg, plan, tok, student, "cpu", True, log=lambda *_: None)
    small = copy.deepcopy(student)
    small.resize_token_embeddings(len(tok) - 24)
    with pytest.raises(ConfigError, match="the teacher's output layer must cover the student's"):
        check_same_tokenizer(tok, tok, small, student, "small")
    teacher = build_teacher(load_config(None, ["algo.distill=true", "model.teacher_path=tiny", "model.tiny_seed=1"]),
                            plan, tok, student, "cpu", True, log=lambda *_: None)
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.training


def test_an_unloadable_teacher_names_its_key(tmp_path):
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.run.reference import build_teacher
    from agentrl.scale.parallel import resolve_plan
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = ensure_tiny_model()
    cfg = load_config(None, ["algo.distill=true", f"model.teacher_path={tmp_path}"])  # exists, holds no model
    with pytest.raises(ConfigError, match=r"model.teacher_path='.*': cannot load model"):
        build_teacher(cfg, resolve_plan(cfg.parallel, cfg.lora, 1, "cpu"), AutoTokenizer.from_pretrained(d),
                      AutoModelForCausalLM.from_pretrained(d), "cpu", True)


# ---------------------------------------------------------------- through the update


def _batch(rewards: list[list[float]], seed: int = 0) -> list[Trajectory]:
    return seeded_update_batch(rewards, seed)


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM

    from agentrl.models.tiny import ensure_tiny_model

    return (AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32),
            AutoModelForCausalLM.from_pretrained(ensure_tiny_model(seed=1), dtype=torch.float32))


def _update(model, teacher, trajs, objective, *, tokens=64, iterations=1):
    from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update

    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    _, filt = compute_advantages(trajs, objective)
    stats = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective,
                        UpdateSettings(micro_batch_tokens=tokens, num_iterations=iterations), teacher_model=teacher)
    return model, stats


def _teacher_logprobs(teacher, t: Trajectory) -> list[float]:
    """log π_T(y_t | y_<t) by a plain forward and log_softmax, not through score_tokens."""
    with torch.no_grad():
        logits = teacher(input_ids=torch.tensor([t.token_ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(t.token_ids[1:])[:, None])[:, 0]
    return [0.0] + lp.tolist()


def test_no_attempt_is_skipped_and_the_metric_is_the_mean_reverse_kl(tiny):
    student, teacher = tiny
    rewards = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # the second group: A_i = 0 for all four
    _, grpo = _update(student, teacher, _batch(rewards), Objective())
    assert grpo.skipped_attempts == 4 and "distill/reverse_kl" not in grpo.metrics()
    trajs = _batch(rewards)
    _, st = _update(student, teacher, trajs, Objective(distill=True))
    assert st.skipped_attempts == 0 and all(t.old_logprobs is not None for t in trajs)
    # the metric by hand: mean over trained tokens of log μ - log π_T
    d = [mu - lt for t in trajs for mu, lt, m in zip(t.logprobs, _teacher_logprobs(teacher, t), t.loss_mask) if m]
    assert st.metrics()["distill/reverse_kl"] == pytest.approx(sum(d) / len(d), abs=1e-4)
    assert st.trained_tokens == len(d)


def test_the_update_is_the_same_for_any_micro_batch_size(tiny):
    student, teacher = tiny
    objective = Objective(distill=True, distill_coef=0.5)
    (a, sa), (b, sb) = (_update(student, teacher, _batch([[1.0, 0.0, 0.0, 1.0]] * 2), objective, tokens=n,
                                iterations=2) for n in (16, 4096))
    assert sa.loss == pytest.approx(sb.loss, abs=1e-5) and sa.grad_norm > 0
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-5)


def test_a_teacher_equal_to_the_student_moves_nothing(tiny):
    """μ scored by the student itself, the teacher a copy of it, pure distillation: every A_t is 0
    exactly, so the SGD step leaves every parameter as it was."""
    from agentrl.algo.batching import collate, score_tokens

    student, _ = tiny
    trajs = _batch([[1.0, 0.0, 1.0, 0.0]])
    for t in trajs:  # one row per micro-batch, as the update below runs it: the same numbers, bit for bit
        t.logprobs = score_tokens(student, collate([t], [0], 0), 1.0)[0][0].tolist()
    objective = Objective(distill=True, distill_reward=False)
    moved, st = _update(student, copy.deepcopy(student), trajs, objective, tokens=1)
    assert st.metrics()["distill/reverse_kl"] == 0.0 and st.loss == 0.0 and st.grad_norm == 0.0
    assert all(torch.equal(p, q) for p, q in zip(moved.parameters(), student.parameters()))


def test_the_update_refuses_distillation_without_a_teacher(tiny):
    from agentrl.algo.update import UpdateSettings, grpo_update

    student, _ = tiny
    with pytest.raises(ValueError, match="teacher_model"):
        grpo_update(student, None, None, [], [], Objective(distill=True), UpdateSettings(micro_batch_tokens=64))


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_two_step_distillation_run_logs_the_reverse_kl(tmp_path, capsys):
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.run.trainer import Trainer

    teacher = tmp_path / "teacher"
    shutil.copytree(ensure_tiny_model(seed=1), teacher)  # a tiny model directory: another init, the same tokenizer
    cfg = load_config(ROOT / "examples" / "arithmetic_ci.yaml",
                      [f"output_dir={tmp_path / 'run'}", "eval.num_tasks=4", "algo.distill=true",
                       f"model.teacher_path={teacher}"])
    result = Trainer(cfg).train()
    out = capsys.readouterr().out
    assert " distill     A_t = A_i + 1.0·(log π_T - log μ)(y_t)" in out and f"teacher: {teacher}" in out
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # two random inits (both near uniform, ~0.05 nats apart per token) disagree: well above the
        # sampler's numerics (below); nothing is skipped
        assert math.isfinite(r["distill/reverse_kl"]) and r["distill/reverse_kl"] > 0.01
        assert r["train/skipped_zero_adv"] == 0.0 and r["grad_norm"] > 0
    # the teacher is the student itself: the first step's reverse KL is the sampler's numerics alone
    cfg = load_config(ROOT / "examples" / "arithmetic_ci.yaml",
                      [f"output_dir={tmp_path / 'self'}", "eval.num_tasks=4", "train.steps=1", "algo.distill=true",
                       "model.teacher_path=tiny"])
    result = Trainer(cfg).train()
    row = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert abs(row["distill/reverse_kl"]) < 1e-3
