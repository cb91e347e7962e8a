"""TRL's GRPOTrainer (stock transformers ``generate``, no vLLM) on the agentrl tiny model.

The peer of ``train_step.py``, run with a separate interpreter that has TRL installed (TRL is
not an agentrl dependency). It reads a spec written by ``train_step.py --compare-trl``: the
tiny model directory, the arithmetic prompts already rendered through the same chat template
(system prompt with the python tool's schema, user question, assistant header), the answers,
G, learning rate, temperature, thread count, and the completion length. TRL's stock trainer is
single-turn, so every completion samples exactly ``completion_tokens`` tokens
(``max_completion_length`` and ``min_new_tokens`` both set), matching agentrl's sampled tokens
per trajectory. The reward is the arithmetic checker on the completion text (the last
``<answer>N</answer>``, commas/spaces/underscores ignored, equal to the answer).

    /work/trl-venv/bin/python benchmarks/trl_grpo.py --spec spec.json --out result.json

Prints one line per step and writes median seconds per step (after the first, a warm-up),
median generation seconds, peak RSS and the TRL configuration used.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import time
from pathlib import Path

import torch

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_integer(text: str | None) -> int | None:
    """Same rule as agentrl.envs.arithmetic.parse_integer."""
    if text is None:
        return None
    cleaned = re.sub(r"[\s,_]", "", text)
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    return int(cleaned) if re.match(r"^-?\d+$", cleaned) else None


def arithmetic_reward(completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the completion's last <answer> equals the task's answer (agentrl's checker)."""
    out = []
    for text, want in zip(completions, answer):
        found = _ANSWER.findall(text)
        value = parse_integer(found[-1].strip()) if found else None
        out.append(1.0 if value is not None and str(value) == want else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--output-dir", default="/tmp/trl-grpo-bench")
    args = ap.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    torch.set_num_threads(spec["threads"])

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(spec["model_dir"], padding_side="left")
    # agentrl encodes message text literally (the system prompt's "<answer>" stays plain text);
    # TRL's tokenizer call turns it into the added tag token: a few tokens shorter.
    trl_lens = [len(tok(p, add_special_tokens=True)["input_ids"]) for p in spec["prompts"]]
    agentrl_lens = [len(ids) for ids in spec["prompt_ids"]]
    n_prompts = spec["prompts_per_step"] * spec["steps"]
    data = Dataset.from_dict({"prompt": spec["prompts"][:n_prompts], "answer": spec["answers"][:n_prompts]})
    G, L = spec["num_generations"], spec["completion_tokens"]
    batch = spec["prompts_per_step"] * G
    micro = spec.get("micro_batch") or batch
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=spec["steps"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        num_generations=G,
        generation_batch_size=batch,  # one generation of all 8 x G completions per optimizer step
        max_completion_length=L,
        generation_kwargs={"min_new_tokens": L},  # every completion samples exactly L tokens
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=spec["betas"][0],
        adam_beta2=spec["betas"][1],
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        num_iterations=1,
        beta=0.0,  # no KL, no reference model (agentrl's default)
        epsilon=spec["epsilon"],
        loss_type="grpo",  # agentrl's default aggregation: seq-mean-token-mean
        scale_rewards="group",
        use_vllm=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; agentrl does not checkpoint
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=spec["seed"],
    )

    step_s: list[float] = []
    gen_s: list[float] = []
    sampled: list[int] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_s.append(time.perf_counter() - self.t0)

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *a, **k):
            t0 = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **k)
            gen_s.append(time.perf_counter() - t0)
            sampled.append(sum(len(c) for c in completion_ids))
            return completion_ids, logprobs

    trainer = TimedGRPOTrainer(model=spec["model_dir"], reward_funcs=arithmetic_reward, args=config,
                               train_dataset=data, processing_class=tok, callbacks=[Timer()])
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    for i, (s, g) in enumerate(zip(step_s, gen_s), 1):
        print(f"  trl step {i}: {s:.2f} s (generate {g:.2f}), {sampled[i - 1]} sampled tokens", flush=True)
    timed = slice(1, None) if len(step_s) > 1 else slice(None)
    result = {
        "trl_version": trl.__version__, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "threads": torch.get_num_threads(),
        "step_s": step_s, "generate_s": gen_s, "total_s": total,
        "median_step_s": statistics.median(step_s[timed]), "median_generate_s": statistics.median(gen_s[timed]),
        "sampled_tokens_per_step": statistics.median(sampled),
        "prompt_tokens_mean": statistics.mean(trl_lens), "agentrl_prompt_tokens_mean": statistics.mean(agentrl_lens),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "config": {k: getattr(config, k) for k in (
            "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
            "steps_per_generation", "max_completion_length", "generation_kwargs", "loss_type", "beta",
            "num_iterations", "use_vllm", "bf16", "gradient_checkpointing", "learning_rate", "temperature")},
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
