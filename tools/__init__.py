"""Built-in tools, installed as agentrl.tools."""
