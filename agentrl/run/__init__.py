"""A training run, assembled: the recipe that puts the components together.

Owns: the typed config (``config``), building model, engine, tools and rollout runner from it
(``build``), the training loop (``trainer``), the asynchronous rollout thread (``producer``),
checkpoints (``checkpoint``), metrics and plots (``metrics``), evaluation (``evaluate``,
``eval_cli``) and the SFT warm start (``warmstart``).

May import everything else in agentrl; nothing outside ``agentrl.run`` (and the CLI) imports
it, except ``agentrl.run.config`` for the config dataclasses.
"""
