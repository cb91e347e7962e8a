"""A training run, assembled: the recipe that puts the components together.

Owns: the typed config (``config``), building model, engine, tools and rollout runner from it
(``build``), the training loop (``trainer``, with the step's collection in ``collect``), the
asynchronous rollout thread (``producer``), checkpoints (``checkpoint``, sharded:
``checkpoint_dcp``), per-rank results merged (``rank_merge``), metrics and plots (``metrics``),
evaluation (``evaluate``, ``eval_cli``), ``agentrl serve`` (``serve_cli``) and the SFT warm start
(``warmstart``, ``demonstrations``).

The top of the import graph: it may import everything else in agentrl; nothing in agentrl
imports it but the CLI (``tests/test_import_graph.py``).
"""
