"""Correctness on the device: sampler against trainer log-probs, masks and spans.

Both read trajectories as the trainer wrote them (``rollouts/step_*.jsonl``): ``logprobs`` are
the sampler's μ, ``old_logprobs`` the trainer's π_old on the same token ids, computed by the
update before its optimizer step (so from the same weights).
"""

from __future__ import annotations

import math

from gpu_check.results import LogprobData, MasksData

SPAN_KINDS = ("prompt", "model", "tool", "template")
MAX_LISTED = 12  # problems listed in the report; the count is always complete


def logprob_match(trajs: list, dtype: str, tolerance: tuple[float, float]) -> LogprobData:
    """|μ - π_old| over every sampled token (``loss_mask == 1``), with a negative control: μ of
    token t against π_old of token t+1 inside the same model turn. The control must differ by
    far more than the tolerance, or the check could not see misaligned tokens."""
    diffs: list[float] = []
    values: list[float] = []
    shifted: list[float] = []
    for t in trajs:
        if t.old_logprobs is None:
            raise ValueError("a trajectory has no old_logprobs: the update did not score it")
        for i, m in enumerate(t.loss_mask):
            if m:
                diffs.append(abs(t.logprobs[i] - t.old_logprobs[i]))
                values.append(t.logprobs[i])
                if i + 1 < len(t.loss_mask) and t.loss_mask[i + 1]:
                    shifted.append(abs(t.logprobs[i] - t.old_logprobs[i + 1]))
    data = LogprobData(dtype=dtype, tokens=len(diffs), tol_mean=tolerance[0], tol_max=tolerance[1])
    if diffs:
        ordered = sorted(diffs)
        mean_v = sum(values) / len(values)
        data.mean_abs = sum(diffs) / len(diffs)
        data.max_abs = ordered[-1]
        data.p99_abs = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        data.logprob_std = math.sqrt(sum((v - mean_v) ** 2 for v in values) / len(values))
        data.shifted_mean_abs = sum(shifted) / len(shifted) if shifted else 0.0
    return data


def trajectory_problems(t, expected_prompt: list[int] | None, decode) -> list[str]:
    """Every broken invariant of one trajectory (empty when it is sound).

    Lengths agree; spans tile ``[0, len)`` in order with known kinds; the first span is the
    prompt and ends at ``prompt_len``; ``loss_mask`` is 1 exactly on model spans; μ and π_old
    are finite, ≤ 0 on sampled tokens and 0 elsewhere; the prompt ids are the chat template's
    rendering of the first messages (token-in-token-out); each tool result the model saw is
    in the tool spans' text.
    """
    n = len(t.token_ids)
    out = []
    lengths = {"loss_mask": len(t.loss_mask), "logprobs": len(t.logprobs)}
    if t.old_logprobs is not None:
        lengths["old_logprobs"] = len(t.old_logprobs)
    out += [f"len({k}) = {v} != {n} tokens" for k, v in lengths.items() if v != n]
    pos = 0
    for s in t.spans:
        if s.start != pos or s.end <= s.start:
            out.append(f"span {s.kind} [{s.start}, {s.end}) does not follow {pos}")
        if s.kind not in SPAN_KINDS:
            out.append(f"unknown span kind {s.kind!r}")
        pos = s.end
    if pos != n:
        out.append(f"spans end at {pos}, the sequence at {n}")
    if not t.spans or t.spans[0].kind != "prompt" or t.spans[0].end != t.prompt_len:
        out.append(f"the first span is not the prompt [0, prompt_len={t.prompt_len})")
    if out:
        return out  # the checks below index by span
    kind_at = [s.kind for s in t.spans for _ in range(s.start, s.end)]
    bad_mask = [i for i in range(n) if t.loss_mask[i] != (kind_at[i] == "model")]
    if bad_mask:
        out.append(f"loss_mask disagrees with the model spans at {len(bad_mask)} tokens (first {bad_mask[0]})")
    for name, lps in (("μ", t.logprobs), ("π_old", t.old_logprobs)):
        if lps is None:
            continue
        bad = [i for i in range(n) if not math.isfinite(lps[i]) or (lps[i] > 1e-6 if t.loss_mask[i] else lps[i] != 0)]
        if bad:
            out.append(f"{name} is not finite ≤ 0 on sampled tokens and 0 elsewhere at {len(bad)} tokens")
    if expected_prompt is not None and t.token_ids[: t.prompt_len] != expected_prompt:
        out.append("the prompt ids differ from the chat template's rendering of the system and user messages")
    tool_text = "".join(decode(t.token_ids[s.start:s.end]) for s in t.spans if s.kind == "tool")
    for call in t.tool_calls:
        if call.result.strip() and call.result.strip() not in tool_text:
            out.append(f"tool result {call.result.strip()[:40]!r} is not in the tool spans")
    return out


def masks_spans(trajs: list, chat, tokenizer, tools: list[dict] | None) -> MasksData:
    """``trajectory_problems`` over ``trajs``, counted per span kind."""
    data = MasksData(trajectories=len(trajs))
    problems: list[str] = []

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    for k, t in enumerate(trajs):
        expected = chat.encode_prompt(t.messages[:2], tools)
        data.prompts_rerendered += 1
        problems += [f"trajectory {k} ({t.group_id}#{t.sample_index}): {p}"
                     for p in trajectory_problems(t, expected, decode)]
        data.with_tool_calls += bool(t.tool_calls)
        for s in t.spans:
            data.span_tokens[s.kind] = data.span_tokens.get(s.kind, 0) + s.end - s.start
    data.problems_found = problems[:MAX_LISTED] + (
        [f"... and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else [])
    return data
