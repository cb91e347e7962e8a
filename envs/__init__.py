"""Built-in environments, installed as ``agentrl.envs`` (this folder is ``envs/`` in the
repository; ``pyproject.toml`` maps it). Each is one module with its tasks, tools and checker,
implementing :class:`agentrl.env.Environment`:

- ``arithmetic``: integer arithmetic with the python tool (the CPU example);
- ``search_qa``: name the document a masked description comes from, by searching a corpus;
- ``humaneval``: write a function, test it with the python tool, submit it (its tests decide);
- ``math``: math word problems with the python tool (GSM8K, MATH, or your own JSONL);
- ``ledger``: read a ledger page by page and report every page's code, at a context budget
  that needs compaction (docs/compaction.md);
- ``reasoning_gym:NAME[,NAME...]``: reasoning-gym's procedural task families with their own
  scorers (``pip install reasoning-gym``; a prefix of :data:`ENV_PREFIXES`).

``env.name`` in a run config is a name of :data:`BUILTIN_ENVS` or an import path
(``mypackage.myenv:MyEnv``, ``path/to/file.py:MyEnv``), or ``PREFIX:SPEC`` for a prefix of
:data:`ENV_PREFIXES`: a family of environments named by what follows the prefix. Adding a
built-in environment is its module plus one line here.
"""

# name -> "module:Class", imported only when a run asks for it
BUILTIN_ENVS = {
    "arithmetic": "agentrl.envs.arithmetic:ArithmeticEnv",
    "search_qa": "agentrl.envs.search_qa:SearchQAEnv",
    "humaneval": "agentrl.envs.humaneval:HumanEvalEnv",
    "math": "agentrl.envs.math:MathEnv",
    "bfcl": "agentrl.envs.bfcl:BFCLEnv",
    "ledger": "agentrl.envs.ledger:LedgerEnv",
}

# name prefix -> ("module:Class", keyword): env.name "PREFIX:SPEC" builds Class(keyword=SPEC, **env.args).
# Checked before import paths, so "reasoning_gym:chain_sum" never imports the reasoning_gym package itself.
ENV_PREFIXES = {
    "reasoning_gym": ("agentrl.envs.reasoning_gym:ReasoningGymEnv", "datasets"),
}
