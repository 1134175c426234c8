"""The examples the upgrade check's tests edit as a developer would (imported explicitly)."""

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

from paths import ROOT

from effectful_durable.testing import ToolCall

EXAMPLES = ROOT / "examples"
REFUNDS = EXAMPLES / "approvals" / "refunds.py"
PLANTS = EXAMPLES / "alarms" / "checkback.py"
TEAM = EXAMPLES / "multi_agent" / "workflow.py"
_names = itertools.count()
REFUND_CALL = ToolCall("refund", {"order": "A-1002", "amount": 250})
RENAME_REFUND = (
    "def refund(self, order: str, amount: float)",
    "def pay_refund(self, order: str, amount: float)",
)


def edited(source: Path, folder: Path, *edits: tuple[str, str]) -> ModuleType:
    """A copy of the example ``source`` in ``folder`` with each (old, new) edit made, imported."""
    text = source.read_text()
    for old, new in edits:
        assert old in text, f"the example no longer holds {old!r}"
        text = text.replace(old, new)
    for sibling in source.parent.glob("*.py"):  # the example's other modules, as they are
        if sibling != source and not (folder / sibling.name).exists():
            (folder / sibling.name).write_text(sibling.read_text())
    name = f"{source.stem}_{next(_names)}"
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module
