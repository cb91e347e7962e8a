"""agentrl: train tool-using LLM agents with RLVR and GRPO."""
