"""``python -m agentrl`` (and ``torchrun -m agentrl``) runs the CLI."""

from agentrl.cli import main

raise SystemExit(main())
