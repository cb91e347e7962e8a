"""TRL's side of ``tool_step.py``: ``GRPOTrainer(tools=[multiply])`` with its own tool loop.

Question: how many seconds does one TRL 1.16 GRPO step take on the workload of
``tool_step.py`` (the warm-started tiny model under TRL's own ``qwen2_5.jinja`` template, which
TRL recognises and parses tool calls with; the plain in-process function
``tool_task.multiply`` as the tool)? Run by ``tool_step.py`` in a fresh interpreter, after the
agentrl side, from the spec that side wrote: the model directory, the conversational prompts
(system + user, the same tasks in the same order per step; TRL renders them with the tool
schema itself, and the script checks its prompt ids against agentrl's), G, learning rate,
temperature, AdamW settings, clip, seed, the completion budget and the number of tool rounds.

Settings: stock ``generate`` (no vLLM), float32, ``gradient_checkpointing=False``, beta=0,
``shuffle_dataset=False`` (the spec's order), one generation and one optimizer step per step,
1 torch thread (``OMP_NUM_THREADS=1`` comes from the driver).

    .venv/bin/python benchmarks/trl_tool_step.py --spec spec.json --out trl.json

Writes per step: seconds (``on_step_begin`` to ``on_step_end``), rollout seconds (``_generate``:
generation, parsing and the tool loop), model generation seconds (``_generate_single_turn``),
update seconds (the step less ``_generate_and_score_completions``), TRL's logged
``tools/call_frequency`` and ``tools/failure_frequency``, attempts with a tool call, reward,
sampled tokens; and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_task import answer_of, multiply  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--output-dir", default="/tmp/trl-tool-step")
    args = ap.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    torch.set_num_threads(1)

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(spec["model_dir"], padding_side="left")
    G, P = spec["num_generations"], spec["prompts_per_step"]
    n = P * spec["steps"]
    data = Dataset.from_dict({"prompt": spec["prompts"][:n], "answer": spec["answers"][:n]})
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=spec["steps"], per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1, num_generations=G, generation_batch_size=P * G,
        shuffle_dataset=False, max_completion_length=spec["max_completion_length"],
        max_tool_calling_iterations=spec["max_tool_calling_iterations"],
        temperature=spec["temperature"], top_p=spec["top_p"], top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=spec["betas"][0], adam_beta2=spec["betas"][1], weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"], num_iterations=1, beta=0.0, epsilon=spec["epsilon"],
        loss_type="grpo", scale_rewards="group", use_vllm=False, bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, seed=spec["seed"],
    )

    cur: dict = defaultdict(float)  # the current step's figures
    steps: list[dict] = []
    steps_logged: list[dict] = []  # TRL's logged metrics, one dict per step

    def reward(completions, answer, **_) -> list[float]:
        """1.0 when the last assistant message's last <answer> is the product (agentrl's checker)."""
        out = []
        for msgs, want in zip(completions, answer):
            last = next((m.get("content") for m in reversed(msgs) if m.get("role") == "assistant"), None)
            cur["attempts_with_call"] += any(m.get("role") == "tool" for m in msgs)
            cur["model_turns"] += sum(m.get("role") == "assistant" for m in msgs)
            # a <tool_call> TRL could not parse stays plain text: no tool runs and the completion ends
            cur["malformed_calls"] += sum(m.get("role") == "assistant" and not m.get("tool_calls")
                                          and "<tool_call>" in (m.get("content") or "") for m in msgs)
            out.append(float(answer_of(last) == want))
        return out

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            cur.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            s = dict(cur)
            s["step_s"] = time.perf_counter() - s.pop("t0")
            s["update_s"] = s["step_s"] - s.pop("gen_score_s")
            steps.append(s)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "tools/call_frequency" in logs:
                steps_logged.append(dict(logs))

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            cur["gen_score_s"] += time.perf_counter() - t0
            return out

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            cur["rollout_s"] += time.perf_counter() - t0
            cur["sampled_tokens"] += sum(sum(m) for m in out[2]) if out[2] is not None else sum(map(len, out[1]))
            cur["attempts"] += len(out[1])
            return out

        def _generate_single_turn(self, prompt_ids, *a, **k):
            t0 = time.perf_counter()
            out = super()._generate_single_turn(prompt_ids, *a, **k)
            cur["generate_s"] += time.perf_counter() - t0
            cur["generate_calls"] += 1
            return out

    trainer = TimedGRPOTrainer(model=spec["model_dir"], reward_funcs=reward, args=config, train_dataset=data,
                               processing_class=tok, tools=[multiply], callbacks=[Timer()])
    # The prompts TRL renders (its own template, the tool schema) against agentrl's ids.
    ids = [tok.apply_chat_template(p, tools=[multiply], add_generation_prompt=True, tokenize=True,
                                   return_dict=True, chat_template=trainer.chat_template)["input_ids"]
           for p in spec["prompts"][:n]]
    identical = sum(a == b for a, b in zip(ids, spec["prompt_ids"][:n]))
    recognised = getattr(trainer._tokenizer, "response_template", None) is not None or \
        getattr(trainer._tokenizer, "response_schema", None) is not None
    trainer.train()
    for s, lg in zip(steps, steps_logged):
        s["call_frequency"] = lg.get("tools/call_frequency")
        s["failure_frequency"] = lg.get("tools/failure_frequency")
        s["tool_calls"] = round(s["call_frequency"] * s["attempts"]) if s["call_frequency"] is not None else None
        s["tool_failures"] = round(s["failure_frequency"] * s["tool_calls"]) if s["tool_calls"] else 0
        s["reward_mean"] = lg.get("reward")
    for i, s in enumerate(steps, 1):
        print(f"  trl step {i}: {s['step_s']:.2f} s (rollout {s['rollout_s']:.2f}, generate {s['generate_s']:.2f} "
              f"in {s['generate_calls']:.0f} calls, update {s['update_s']:.2f}), tool calls/attempt "
              f"{s['call_frequency']}, failures {s['failure_frequency']}, attempts with a call "
              f"{s['attempts_with_call']:.0f}/{s['attempts']:.0f}, malformed {s['malformed_calls']:.0f}, "
              f"reward {s['reward_mean']}, "
              f"{s['sampled_tokens']:.0f} sampled tokens", flush=True)
    result = {
        "trl_version": trl.__version__, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "threads": torch.get_num_threads(), "steps": steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "call_frequency": [s["call_frequency"] for s in steps],
        "failure_frequency": [s["failure_frequency"] for s in steps],
        "prompts_identical": identical, "response_parser_set": recognised,
        "training_template_swapped": trainer.chat_template is not None,
        "config": {k: getattr(config, k) for k in (
            "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
            "steps_per_generation", "max_completion_length", "max_tool_calling_iterations", "loss_type", "beta",
            "num_iterations", "use_vllm", "bf16", "gradient_checkpointing", "learning_rate", "temperature", "top_p",
            "top_k", "shuffle_dataset", "epsilon", "scale_rewards")},
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
