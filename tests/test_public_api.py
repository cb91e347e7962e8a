"""The public API: every name in ``agentrl.__all__`` resolves, the explicit imports that
editors and type checkers read name the same objects, and ``import agentrl`` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agentrl

INIT = Path(agentrl.__file__)


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the imports in ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}


def test_explicit_imports_and_lazy_table_agree():
    assert _type_checking_imports() == agentrl._EXPORTS


def test_every_public_name_resolves_to_its_definition():
    for name, module in agentrl._EXPORTS.items():
        obj = getattr(agentrl, name)
        assert getattr(obj, "__module__", module) == module, (name, obj)


def test_tool_is_the_decorator_and_the_module_is_toolbox():
    from agentrl.toolbox import tool

    assert agentrl.tool is tool and callable(agentrl.tool)
    assert "agentrl.tool" not in sys.modules


def test_import_is_light():
    code = "import agentrl, agentrl.types, sys; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
