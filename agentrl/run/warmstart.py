"""Offline warm start: supervised fine-tuning on an environment's demonstrations, cached.

A randomly initialised model cannot discover a tool-call format by chance in minutes, so
before RL the model is fine-tuned on synthetic conversations (question -> tool call -> tool
result -> answer) that the environment writes (``env.demonstrations(n, seed)``).

Two phases. For the first ``clean_steps`` steps (default: half of ``steps``) the batches hold
correct demonstrations only; then a share ``corruption`` of wrong ones joins the mix.

What the warm start teaches:
  * the turn and tool-call format (``<tool_call>{"name": "python", ...}</tool_call>``),
  * writing the question's expression into the code, and copying the tool's printed
    result into ``<answer>...</answer>`` (learned in the clean phase, kept in the mix).

What it deliberately does not teach: *that the tool should be used*. In the mix, a share
``corruption`` of the demonstrations skips the tool and answers with a wrong guess
(``corruption_kind="guess"``: the true answer with about half its characters changed; the
model cannot compute it in its head, so it learns to guess a number of the right shape).
After SFT the model calls the tool on roughly ``1 - corruption`` of its samples, on every
task family, and answers correctly when it does; greedy decoding follows the majority habit
(guessing), so greedy accuracy starts low. Every family keeps a success probability near
``1 - corruption`` at temperature 1, so GRPO gets a signal on every family, and what it
adds is measurable: relying on the tool. The habit is a data frequency the model converges
to, not a matter of stopping SFT early, so it does not hinge on the step count.
``corruption_kind="miscopy"`` instead keeps the tool call and copies its result with one
character changed (an imperfect copying habit; greedy decoding mostly copies correctly
anyway, so it leaves less headroom).

Sequences are tokenized the way the rollout builds them (prompt from
``ChatTemplate.encode_prompt``, each assistant turn from the template's rendering, the
rest from ``ChatTemplate.continuation``); the loss covers only assistant-written tokens
(``loss_mask == 1``, the rollout's convention), i.e. the tokens the policy will generate.

The result is an ordinary Hugging Face directory under
``<cache>/warmstart-<hash of base weights, demonstrations, tools and hyperparameters>``,
written atomically and reused when present, so the SFT runs once per machine.

Example::

    from agentrl.envs.arithmetic import ArithmeticEnv
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.run.warmstart import warm_start

    path = warm_start(ensure_tiny_model(), ArithmeticEnv(seed=0))      # ~1 min on 2 CPU cores
    assert warm_start(ensure_tiny_model(), ArithmeticEnv(seed=0)) == path  # cached: instant
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.run.config import SFTSettings
from agentrl.run.demonstrations import Demonstration, EncodedDemo, encode_demonstration, make_demonstrations
from agentrl.run.optim import lr_factor

if TYPE_CHECKING:
    from agentrl.env import Environment

# Bump when the SFT procedure changes, so cached results of older code are not reused.
WARMSTART_VERSION = 2


# -- supervised fine-tuning -----------------------------------------------------------------


def masked_lm_loss(logits, input_ids, loss_mask):
    """Mean next-token cross-entropy over positions whose *target* has ``loss_mask == 1``.

        L = - sum_t m[t+1] log p(x[t+1] | x[<=t]) / sum_t m[t+1]

    >>> import torch
    >>> logits = torch.zeros(1, 3, 4)
    >>> round(masked_lm_loss(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 0, 1]])).item(), 4)
    1.3863
    """
    import torch.nn.functional as F

    targets = input_ids[:, 1:]
    m = loss_mask[:, 1:].to(logits.dtype)
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                          reduction="none").view_as(m)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def _padded_batch(batch: list[EncodedDemo], pad_id: int):
    """(ids, loss mask, attention mask), each [B, longest], right-padded."""
    import torch

    width = max(len(e.token_ids) for e in batch)

    def padded(seqs: list[list[int]], fill: int):
        return torch.tensor([x + [fill] * (width - len(x)) for x in seqs], dtype=torch.long)

    return (padded([e.token_ids for e in batch], pad_id), padded([e.loss_mask for e in batch], 0),
            padded([[1] * len(e.token_ids) for e in batch], 0))


def _prefix_before_targets(ids, mask, attn) -> int:
    """The rows' common prefix (``agentrl.algo.shared_prefix.shared_prefix_len``), cut one token
    before the earliest trained target: the prefix's last position must not predict a trained
    token (its logits are not computed in the shared pass)."""
    import torch

    from agentrl.algo.shared_prefix import shared_prefix_len as common_prefix_len

    first_target = torch.where(mask.any(1), mask.argmax(1), attn.sum(1))
    return max(0, min(common_prefix_len(ids, attn), int(first_target.min()) - 1))


def shared_prefix_len(batch: list[EncodedDemo]) -> int:
    """Tokens every sequence of the batch starts with, ending before the first trained target
    (0 for a single sequence: nothing to share).

    >>> shared_prefix_len([EncodedDemo([5, 6, 7, 8], [0, 0, 1, 1]), EncodedDemo([5, 6, 9], [0, 0, 1])])
    1
    """
    ids, mask, attn = _padded_batch(batch, 0)
    return _prefix_before_targets(ids, mask, attn)


def batch_loss(model, batch: list[EncodedDemo], pad_id: int, min_shared: int = 32):
    """Masked SFT loss of a batch; a prefix common to every sequence (the system prompt and
    tool list) is run once and its KV cache shared by the batch, exactly (same loss and
    gradient as the padded full forward up to float rounding), which makes a step ~3x
    cheaper for the arithmetic demonstrations."""
    import torch
    import torch.nn.functional as F

    ids, mask, attn = _padded_batch(batch, pad_id)
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is None or head is None:  # an unusual architecture: the plain full-logits path
        return masked_lm_loss(model(input_ids=ids, attention_mask=attn).logits, ids, mask)
    p = _prefix_before_targets(ids, mask, attn)
    extra = {}
    if p >= min_shared:  # 0 for a single row
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        body(input_ids=ids[:1, :p], past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(len(batch))  # every row's gradient flows into the one prefix pass
        positions = torch.arange(p, ids.size(1)).unsqueeze(0).expand(len(batch), -1)
        extra = {"past_key_values": cache, "use_cache": True, "position_ids": positions}
    else:
        p = 0
    hidden = body(input_ids=ids[:, p:], attention_mask=attn, **extra).last_hidden_state[:, :-1]
    # the LM head only where a target is trained: most of a demonstration is prompt and tool text
    where = mask[:, p + 1:].bool()
    return F.cross_entropy(head(hidden[where]).float(), ids[:, p + 1:][where])


def wrong_per_batch(settings: SFTSettings) -> list[int]:
    """How many corrupted demonstrations each step's batch holds: none in the clean phase,
    then ``corruption * batch_size`` on average, rounded by error diffusion.

    A fixed share per batch rather than a random draw: the tool-use habit the model
    converges to is then ``1 - corruption`` without batch-to-batch noise in the last steps
    (with random batches it ended anywhere in 0.36-0.51 for ``corruption=0.6``).

    >>> wrong_per_batch(SFTSettings(steps=6, clean_steps=2, batch_size=4, corruption=0.6))
    [0, 0, 2, 2, 3, 2]
    """
    out, owed = [], 0.0
    for step in range(settings.steps):
        n = 0
        if step >= settings.clean_phase:
            owed += settings.corruption * settings.batch_size
            n = min(int(owed + 1e-9), settings.batch_size)
            owed -= n
        out.append(n)
    return out


def sft(model, encoded: list[EncodedDemo], settings: SFTSettings, pad_id: int, log=None,
        callback=None, progress: bool | None = None) -> list[float]:
    """Train ``model`` in place on random batches of ``encoded``; returns the loss per step.

    ``callback(step)``, when given, runs after every optimizer step (for measurements).
    ``progress`` shows a progress bar (elapsed time, ETA, the loss of the last 50 steps) in the
    style of the GRPO loop's; by default when ``log`` is given. ``log`` gets one line at the end."""
    import torch
    from tqdm.auto import tqdm

    rng = random.Random(f"warmstart-batches-{settings.seed}")
    clean = [e for e in encoded if not e.corrupted] or encoded
    wrong = [e for e in encoded if e.corrupted]
    plan = wrong_per_batch(settings) if wrong else [0] * settings.steps
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.98), weight_decay=0.0)
    # Warmup, then cosine decay to 10% of the peak.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup=settings.warmup_steps, total=settings.steps, floor=0.1))
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(total=settings.steps, desc="warm start", unit="step", dynamic_ncols=True,
               disable=not (log is not None if progress is None else progress))
    with bar, torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        for step in range(settings.steps):
            batch = [wrong[rng.randrange(len(wrong))] for _ in range(plan[step])]
            batch += [clean[rng.randrange(len(clean))] for _ in range(settings.batch_size - plan[step])]
            loss = batch_loss(model, batch, pad_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if callback is not None:
                callback(step + 1)
            bar.update(1)
            if (step + 1) % 10 == 0 or step + 1 == settings.steps:
                bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.4f}")
    if log is not None and losses:
        log(f"warm start: {settings.steps} steps in {time.perf_counter() - t0:.0f} s, "
            f"loss {sum(losses[-50:]) / len(losses[-50:]):.4f} (mean of the last {len(losses[-50:])})")
    model.eval()
    return losses


# -- cached entry point ----------------------------------------------------------------------


def _dir_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def cache_key(base_model_dir: Path, demos: list[Demonstration], tools: list[dict] | None,
              settings: SFTSettings, template: str | None) -> str:
    """Hash of everything the result depends on: base files, data, tools, template, settings."""
    import torch
    import transformers

    h = hashlib.sha256()
    h.update(json.dumps({"version": WARMSTART_VERSION, "settings": asdict(settings), "tools": tools,
                         "template": template, "torch": torch.__version__,
                         "transformers": transformers.__version__}, sort_keys=True).encode())
    h.update(_dir_digest(base_model_dir).encode())
    for d in demos:
        h.update(json.dumps([d.corrupted, [m.to_chat() for m in d.messages]], sort_keys=True).encode())
    return h.hexdigest()[:16]


def warm_start(base_model_dir: str | Path, env: "Environment", settings: SFTSettings | None = None, *,
               cache_dir: str | Path | None = None, tool_timeout: float = 10.0,
               template: str | None = None, num_threads: int | None = None, log=print) -> Path:
    """SFT ``base_model_dir`` on ``env``'s (partly corrupted) demonstrations; returns the HF dir.

    Cached under ``<cache_dir>/warmstart-<key>`` (default cache: ``agentrl.models.cache.
    default_cache_dir()``); a second call with the same inputs returns the same path without
    training. ``num_threads`` sets torch's CPU threads for the SFT (restored after).
    ``settings`` are the SFT hyperparameters (default :class:`SFTSettings`); ``tool_timeout`` is
    the run's ``tools.timeout``, so the tool descriptions in the demonstrations' prompts are the
    ones the run will show.

    >>> from agentrl.envs.arithmetic import ArithmeticEnv            # doctest: +SKIP
    >>> from agentrl.models.tiny import ensure_tiny_model            # doctest: +SKIP
    >>> warm_start(ensure_tiny_model(), ArithmeticEnv(), SFTSettings(steps=300), log=None)  # doctest: +SKIP
    PosixPath('.../warmstart-...')
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.models.cache import default_cache_dir, publish_once
    from agentrl.run.checkpoint import save_hf
    from agentrl.toolbox import ToolBox

    base = Path(base_model_dir)
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"{base} is not a Hugging Face model directory (no config.json); "
                                "pass a local model dir, e.g. agentrl.models.tiny.ensure_tiny_model()")
    settings = settings or SFTSettings()
    demos = make_demonstrations(env, settings)
    tools = ToolBox(env.tools(), default_timeout=tool_timeout).schemas() or None
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"warmstart-{cache_key(base, demos, tools, settings, template)}"
    if (final / "config.json").exists():
        return final

    t0 = time.perf_counter()
    old_threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        if log is not None:  # once per machine: say what runs, and where it is kept, before it runs
            log(f"warm start: SFT of {base.name} on {len(demos)} demonstrations "
                f"({settings.corruption:.0%} {settings.corruption_kind}), {settings.steps} steps, "
                f"once per machine -> {final}")
        tokenizer = AutoTokenizer.from_pretrained(base)
        chat = ChatTemplate(tokenizer, template)
        encoded = [encode_demonstration(chat, d.messages, tools, d.corrupted)  # ~5 s for 2000 on a CPU
                   for d in tqdm(demos, desc="warm start: tokenizing", unit="demo", dynamic_ncols=True,
                                 leave=False, disable=log is None)]
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else chat.stop_token_ids[0]
        losses = sft(model, encoded, settings, pad, log)
    finally:
        torch.set_num_threads(old_threads)

    def publish(tmp: Path) -> None:
        save_hf(model, tokenizer, tmp)
        info = {"base_model": str(base), "settings": asdict(settings), "num_demos": len(demos),
                "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])), "seconds": time.perf_counter() - t0}
        (tmp / "warmstart.json").write_text(json.dumps(info, indent=2))

    return publish_once(final, publish)
