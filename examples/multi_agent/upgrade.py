"""Before a restart, `effectful-durable check-upgrade` says what changed code does to the run.

The story of a Ctrl-C, an edit and a restart, told through the check:

1. The workflow runs, and is stopped midway (``--stop-after``: Ctrl-C, pressed for you).
2. ``check-upgrade`` with the code as it is: the finished steps replay, the next one goes live.
3. Someone edits the code: a coder now writes its modules in the other order.
4. ``check-upgrade`` with the edited copy names the step that would diverge, what the journal
   recorded and what the new code asks for, and exits 3: before the restart, with no
   model called and nothing written.

Then put the order back, or reset the workflow from that step (``effectful-durable
reset-workflow DB build-textkit --from-step N``) and let the new code do it again.

    python examples/multi_agent/upgrade.py         # offline, in a temporary folder
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

# The edit: coder-1 writes its modules last first. Its first step then asks for another
# module than the one the journal recorded at that place.
OLD = "    for module in modules:\n        say(coder.agent_id, coder.write_module(module))"
NEW = (
    "    for module in reversed(modules):\n        say(coder.agent_id, coder.write_module(module))"
)


def check(db: Path, code: Path) -> int:
    """Run `effectful-durable check-upgrade` on ``db`` against the agent code in ``code``;
    its exit status."""
    command = [
        sys.executable, "-m", "effectful_durable", "check-upgrade", str(db),
        "--agents", "workflow:agent", "--workflow", "workflow:program",
    ]  # fmt: skip
    print(
        f"$ effectful-durable check-upgrade {db.name} --agents workflow:agent "
        "--workflow workflow:program"
    )
    status = subprocess.run(command, cwd=code, check=False).returncode
    print(f"(exit status {status})\n")
    return status


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        db = work / "build-textkit.db"
        # 1. Run the workflow and stop it after 8 model calls, as Ctrl-C would.
        subprocess.run(
            [sys.executable, str(HERE / "workflow.py"), "--db", str(db),
             "--out", str(work / "project"), "--stop-after", "8"],
            check=False, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        print("1. the workflow ran and was stopped after 8 model calls\n")
        # 2. The code as it is carries the run in flight.
        print("2. the code as it is:")
        same = check(db, HERE)
        # 3. An edited copy of the code: the order of one agent's steps changed.
        edited = work / "new-code"
        edited.mkdir()
        shutil.copy(HERE / "offline_model.py", edited)
        text = (HERE / "workflow.py").read_text()
        (edited / "workflow.py").write_text(text.replace(OLD, NEW))
        print("3. the code edited: coder-1 writes its modules in the other order")
        print("4. the edited code, checked before it runs:")
        changed = check(db, edited)
    caught = same == 0 and changed == 3
    print("the changed step was caught before the restart" if caught else "unexpected statuses")
    return 0 if caught else 1


if __name__ == "__main__":
    sys.exit(main())
