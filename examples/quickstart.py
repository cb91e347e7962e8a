"""Quickstart: a tool, a rollout on the offline tiny model, and a look at the mask."""

from agentrl import ChatTemplate, HFEngine, RolloutConfig, RolloutRunner, Task, ToolBox, tool
from agentrl.models.tiny import ensure_tiny_model


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


if __name__ == "__main__":
    engine = HFEngine.from_pretrained(ensure_tiny_model())  # offline tiny Qwen2 model, built once
    chat = ChatTemplate(engine.tokenizer)  # the model's own chat template
    runner = RolloutRunner(engine, chat, ToolBox([multiply], tokenizer=engine.tokenizer),
                           RolloutConfig(max_turns=3, max_new_tokens=48))
    traj = runner.run([Task(id="t0", prompt="What is 17*23?", answer="391")], num_samples=2).trajectories[0]
    for s in traj.spans:  # prompt / model / tool / template
        text = engine.tokenizer.decode(traj.token_ids[s.start:s.end])
        print(f"{s.kind:8} mask={traj.loss_mask[s.start]} {text[:70]!r}")
    print(f"{len(traj.token_ids)} tokens, {sum(traj.loss_mask)} trained on, finish_reason={traj.finish_reason}")
