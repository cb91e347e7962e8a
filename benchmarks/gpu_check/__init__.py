"""GPU acceptance check (issue 20): run ``python benchmarks/gpu_check OUT_DIR [--smoke]``.

Modules: ``bootstrap`` (import agentrl from the working tree, stand-ins for missing packages),
``profile`` (sizes and budgets), ``models`` (the offline Qwen2.5-1.5B-shaped model),
``sampling``, ``policy``, ``checks``, ``update_timing``, ``arithmetic`` (the sections),
``sections`` (which section runs where, and how), ``results`` (the report's dataclasses).
"""
