"""Example environments with checkers, installed as agentrl.envs."""
