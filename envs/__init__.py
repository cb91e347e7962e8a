"""Built-in environments, installed as ``agentrl.envs`` (this folder is ``envs/`` in the
repository; ``pyproject.toml`` maps it). Each is one module with its tasks, tools and checker,
implementing :class:`agentrl.env.Environment`:

- ``arithmetic``: integer arithmetic with the python tool (the CPU example);
- ``search_qa``: name the document a masked description comes from, by searching a corpus;
- ``humaneval``: write a function, test it with the python tool, submit it (its tests decide);
- ``math``: math word problems with the python tool (GSM8K, MATH, or your own JSONL).

``env.name`` in a run config is a name of :data:`BUILTIN_ENVS` or an import path
(``mypackage.myenv:MyEnv``, ``path/to/file.py:MyEnv``). Adding a built-in environment is its
module plus one line here.
"""

# name -> "module:Class", imported only when a run asks for it
BUILTIN_ENVS = {
    "arithmetic": "agentrl.envs.arithmetic:ArithmeticEnv",
    "search_qa": "agentrl.envs.search_qa:SearchQAEnv",
    "humaneval": "agentrl.envs.humaneval:HumanEvalEnv",
    "math": "agentrl.envs.math:MathEnv",
}
