"""Where the vendored test fixtures live: inside the repository, never beside it."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPLATES = FIXTURES / "chat_templates"
TOKENIZERS = FIXTURES / "tokenizers"
QWEN25 = TOKENIZERS / "qwen2.5"
QWEN3 = TOKENIZERS / "qwen3"
