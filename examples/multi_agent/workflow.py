"""A team of agents builds "textkit", a small Python library, and remembers every step.

An architect plans the library as structured data, two coders write its modules and
their tests in parallel threads, and a reviewer sends a module back until it is right.
Every agent call is a step of the workflow "build-textkit", journaled in SQLite: run
the program again and finished steps are replayed from the database without a model
call; stop it midway and the next run resumes at the first unfinished step.
"""

# effectful puts the docstring above at the head of every agent's system prompt, so it
# tells the model what the team is doing; how to run this file is in README.md and --help.

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pydantic
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler, completion
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled
from offline_model import scripted_model

from effectful_durable import (
    DurableError,
    NotFoundError,
    PersistenceHandler,
    PersistentAgent,
    Store,
    ephemeral,
)
from effectful_durable.testing import FakeLLM

WORKFLOW = "build-textkit"
CODE_VERSION = "textkit-demo-1"  # recorded with every turn; a deploy would use its git sha
OUT = Path(__file__).parent / "out"
MARKER = ".textkit-demo"  # --fresh deletes a project folder only if this program made it
MAX_REVIEW_ROUNDS = 3

REQUEST = """\
textkit, a small pure-Python library of text utilities, in three modules:
- slugify: slugify(text) -> str turns any text into a lowercase ASCII slug for URLs.
- wrap: wrap(text, width) -> list[str] wraps text into lines of at most width characters.
- redact: redact(text) -> str masks email addresses and phone numbers.
"""


# -- What the agents answer with: structured outputs ----------------------------------
class ModuleSpec(pydantic.BaseModel):
    """One module of the library: what it is for and the functions it exports."""

    name: str = pydantic.Field(description="a Python identifier: the file is textkit/<name>.py")
    summary: str
    functions: list[str] = pydantic.Field(description="e.g. 'slugify(text: str) -> str'")


class Plan(pydantic.BaseModel):
    """The architect's plan: the package and its modules, in the order to build them."""

    package: str
    modules: list[ModuleSpec]


class Review(pydantic.BaseModel):
    """The reviewer's verdict on one module; ``comments`` say what to change."""

    approved: bool
    comments: list[str]


# -- File tools, confined to the project folder ------------------------------------------
@dataclasses.dataclass
class ProjectFiles(PersistentAgent):
    """Base class of agents that work on the files of one project folder."""

    # Ephemeral: the folder is this run's choice (--out), not part of the agent's state.
    project: Path = ephemeral()

    def _inside(self, path: str) -> Path:
        """The file ``path`` names, refused if it is not inside the project folder."""
        root = self.project.resolve()
        target = (root / path).resolve()
        if target == root or not target.is_relative_to(root):
            msg = (
                f"{path!r} is not a file inside the project folder; "
                "use a relative path such as 'textkit/wrap.py'"
            )
            raise ValueError(msg)
        return target

    @Tool.define
    def read_file(self, path: str) -> str:
        """Return the text of the project file at `path`, e.g. 'textkit/wrap.py'."""
        return self._inside(path).read_text(encoding="utf-8")

    @Tool.define
    def list_files(self) -> list[str]:
        """List the files of the project, as paths relative to the project folder."""
        root = self.project.resolve()
        return sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.name != MARKER
        )


# -- The agents: PersistentAgents with stable ids ----------------------------------------
@dataclasses.dataclass
class Architect(PersistentAgent):
    """You are a software architect. You split a library into small modules, each with
    a one-line summary and the signatures of the functions it exports."""

    @Template.define
    def plan(self, request: str) -> Plan:
        """Plan this Python library as modules, in the order to build them:
        {request}"""
        raise NotHandled


@dataclasses.dataclass
class Coder(ProjectFiles):
    """You are a careful Python developer. You write small modules that use only the
    standard library, give every public function a docstring, and test them with
    pytest. You save every file with the write_file tool."""

    written: list[str] = dataclasses.field(default_factory=list)  # persisted each turn

    @Tool.define
    def write_file(self, path: str, content: str) -> str:
        """Create or replace the project file at `path`, e.g. 'textkit/wrap.py'."""
        target = self._inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        relative = target.relative_to(self.project.resolve()).as_posix()
        if relative not in self.written:
            self.written.append(relative)
        return f"saved {relative} ({len(content.splitlines())} lines)"

    @Template.define
    def write_module(self, module: ModuleSpec) -> str:
        """Write the module `textkit/{module.name}.py` of the package textkit, to this spec:
        {module}
        Also write its pytest tests, `tests/test_{module.name}.py`, importing it as
        `from textkit.{module.name} import ...`. Save both files with write_file, then
        reply with one line saying what you wrote."""
        raise NotHandled

    @Template.define
    def fix_module(self, module: ModuleSpec, comments: list[str]) -> str:
        """The reviewer did not approve `textkit/{module.name}.py`. Their comments:
        {comments}
        Read the module and its tests with read_file, change what the comments ask
        for, save the files with write_file, then reply with one line saying what
        you changed."""
        raise NotHandled

    @Template.define
    def finish_package(self, plan: Plan) -> str:
        """Finish the package textkit; all its modules are written and reviewed:
        {plan}
        Write `textkit/__init__.py`, re-exporting every module's public functions, and
        `pyproject.toml` for a project named textkit whose pytest settings are
        `pythonpath = ["."]` and `testpaths = ["tests"]`. Save both with write_file,
        then reply with one line saying what you wrote."""
        raise NotHandled


@dataclasses.dataclass
class Reviewer(ProjectFiles):
    """You are a strict code reviewer. You read the files yourself, and you approve a
    module only if it meets its spec, every public function has a docstring, and its
    tests cover the edge cases, the empty string included."""

    @Template.define
    def review(self, module: ModuleSpec) -> Review:
        """Review the module `textkit/{module.name}.py` and its tests
        `tests/test_{module.name}.py` against this spec:
        {module}
        Read both files with read_file. Approve them, or list each change to make."""
        raise NotHandled


@dataclasses.dataclass
class Team:
    """The four durable agents; their ids name them in the database."""

    architect: Architect
    coders: list[Coder]
    reviewer: Reviewer


def make_team(project: Path) -> Team:
    """The team, working on the files of ``project``."""
    return Team(
        architect=Architect(agent_id="architect"),
        coders=[Coder(agent_id=f"coder-{n}", project=project) for n in (1, 2)],
        reviewer=Reviewer(agent_id="reviewer", project=project),
    )


# -- The handler stack, installed in every thread ------------------------------------------
class ModelCalls(ObjectInterpretation):
    """Count this run's model requests, and refuse new ones once the run is stopping."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.count = 0
        self.stop_after = stop_after  # --stop-after: Ctrl-C, pressed by the program
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    @implements(completion)
    def _completion(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self.stop_after is not None and self.count >= self.stop_after:
                self.stopping.set()
            if self.stopping.is_set():  # Ctrl-C in another thread: stop here too
                raise KeyboardInterrupt
            self.count += 1
        return fwd()


@dataclasses.dataclass
class Run:
    """What every thread of one run shares: the model, the database, the call counter."""

    model: str | None  # a LiteLLM model name, or None for the offline script
    persistence: PersistenceHandler
    calls: ModelCalls
    offline: FakeLLM | None

    @contextlib.contextmanager
    def handlers(self) -> Iterator[None]:
        """Install the whole stack in this thread: effectful's handlers are thread-local."""
        offline = handler(self.offline) if self.offline else contextlib.nullcontext()
        with (
            handler(LiteLLMProvider(model=self.model or "offline")),
            offline,  # answers the provider's model requests, offline
            handler(self.calls),
            handler(RetryLLMHandler()),
            handler(self.persistence),  # inside the provider: it sees each template call first
        ):
            yield

    def in_parallel(self, jobs: list[Callable[[], None]]) -> None:
        """Run each job in its own thread under the full handler stack, and wait for all.

        If one fails, the others stop at their next model call, and its error is raised.
        """

        def run(job: Callable[[], None]) -> None:
            with self.handlers():
                job()

        with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
            futures = [pool.submit(run, job) for job in jobs]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # Ctrl-C while waiting: the threads stop at their next call
                self.calls.stopping.set()
                raise
            if any(future.exception() for future in done):
                self.calls.stopping.set()  # one failed: the others stop at their next call
        failed = [error for future in futures if (error := future.exception())]
        if failed:  # raise what stopped the run, not the KeyboardInterrupt it caused
            raise next((e for e in failed if not isinstance(e, KeyboardInterrupt)), failed[0])


# -- The workflow: plan, write in parallel, review until approved, finish -------------------
def build(team: Team, run: Run) -> Plan:
    """Build textkit. Each agent's calls come in the same order on every run, which is
    what lets the journal replay them; calls on different agents may interleave."""
    plan = team.architect.plan(REQUEST)
    say("architect", f"planned {plan.package} in {len(plan.modules)} modules:")
    for module in plan.modules:
        say("", f"  {module.name:<8} {'; '.join(module.functions)}")

    owner = {m.name: team.coders[i % len(team.coders)] for i, m in enumerate(plan.modules)}

    def share(coder: Coder, modules: list[ModuleSpec]) -> list[ModuleSpec]:
        """The modules that are ``coder``'s: dealt round-robin in plan order."""
        return [module for module in modules if owner[module.name] is coder]

    run.in_parallel(
        [functools.partial(write_modules, c, share(c, plan.modules)) for c in team.coders]
    )
    pending = list(plan.modules)
    for round_ in range(1, MAX_REVIEW_ROUNDS + 1):
        reviews = {module.name: review(team.reviewer, module) for module in pending}
        pending = [module for module in pending if not reviews[module.name].approved]
        if not pending or round_ == MAX_REVIEW_ROUNDS:
            break
        run.in_parallel(
            [
                functools.partial(fix_modules, c, share(c, pending), reviews)
                for c in team.coders
                if share(c, pending)
            ]
        )
    if pending:
        say("reviewer", f"still not approved: {', '.join(m.name for m in pending)}")
    say(team.coders[0].agent_id, team.coders[0].finish_package(plan))
    return plan


def write_modules(coder: Coder, modules: list[ModuleSpec]) -> None:
    """One coder's thread: write its modules, in plan order."""
    for module in modules:
        say(coder.agent_id, coder.write_module(module))


def review(reviewer: Reviewer, module: ModuleSpec) -> Review:
    """Review one module, in the main thread, and say the verdict."""
    verdict = reviewer.review(module)
    if verdict.approved:
        say(reviewer.agent_id, f"approved {module.name}")
    else:
        say(reviewer.agent_id, f"sent {module.name} back:")
        for comment in verdict.comments:
            say("", f"  - {comment}")
    return verdict


def fix_modules(coder: Coder, modules: list[ModuleSpec], reviews: dict[str, Review]) -> None:
    """One coder's thread: fix the modules the reviewer sent back."""
    for module in modules:
        say(coder.agent_id, coder.fix_module(module, reviews[module.name].comments))


# -- Before a restart with changed code: what `effectful-durable check-upgrade` runs -----
def agent(agent_id: str) -> PersistentAgent:
    """The team's agent ``agent_id`` (``check-upgrade DB --agents workflow:agent``)."""
    team = make_team(Path(tempfile.gettempdir()))  # the check runs no tool: no folder needed
    found = {a.agent_id: a for a in (team.architect, *team.coders, team.reviewer)}
    return found[agent_id]


def program(persistence: Callable[..., Any]) -> None:
    """The workflow, under the handler the check hands over (``check --workflow
    workflow:program``): where main() builds PersistenceHandler, it calls ``persistence``."""
    with tempfile.TemporaryDirectory() as folder:
        run = Run(None, persistence(workflow=WORKFLOW), ModelCalls(), None)
        with run.handlers():
            build(make_team(Path(folder)), run)


# -- Showing progress: the journal's log, and what each agent produced --------------------
_output = threading.Lock()


def say(agent_id: str, text: str) -> None:
    """Print one line of what an agent produced, whole even with threads."""
    with _output:
        sys.stdout.write(f"{agent_id:>10}  {text}\n")
        sys.stdout.flush()


def show_journal() -> None:
    """Print each step as the journal logs it: agent, step, replayed or live."""
    fields = {"step_key": "?", "template": "?", "outcome": "?"}
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(
        logging.Formatter("%(outcome)10s  %(step_key)s %(template)s", defaults=fields)
    )
    out.addFilter(lambda record: getattr(record, "outcome", None) != "done")  # say() shows it
    journal = logging.getLogger("effectful_durable.journal")
    journal.addHandler(out)
    journal.setLevel(logging.INFO)
    journal.propagate = False


def report(db: str, project: Path, calls: ModelCalls) -> None:
    """Say where the results are, run textkit's own tests, and count the model calls."""
    with Store(db, readonly=True) as store:
        steps = store.steps(WORKFLOW)
        agents = store.agents()
    print(f"\nproject:     {shown(project)}")
    print(f"database:    {shown(db)}: {len(agents)} agents, {len(steps)} journal steps")
    run_textkit_tests(project)
    print(f"model calls: {calls.count}")
    command = shown(Path(sys.executable).parent / "effectful-durable")  # the ui extra's page
    print(f"browse it:   {command} ui {shown(db)}")


def shown(place: str | Path) -> str:
    """A path as short as it can be (relative to the current folder if inside it), a
    database URL without its password."""
    if is_url(place):
        url = urllib.parse.urlsplit(str(place))
        if url.password is None:
            return str(place)
        return str(place).replace(f":{url.password}@", ":***@", 1)
    with contextlib.suppress(ValueError):
        return str(Path(place).resolve().relative_to(Path.cwd()))
    return str(place)


def is_url(place: str | Path) -> bool:
    """Whether ``place`` is a PostgreSQL URL rather than a file."""
    return str(place).startswith(("postgresql://", "postgres://"))


def run_textkit_tests(project: Path) -> None:
    """Run the generated tests with this Python's pytest, or say how to."""
    how = f"cd {shown(project)} && python -m pytest"
    if not (project / "tests").is_dir():
        print(f"tests:       none in {project}; the journal may be of another folder (--fresh)")
        return
    if importlib.util.find_spec("pytest") is None:
        print(f"tests:       pytest is not installed here; run `{how}`")
        return
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    lines = result.stdout.strip().splitlines() or ["(no output)"]
    if result.returncode:
        print(result.stdout + result.stderr)
    print(f"tests:       {lines[-1]}   ({how})")


# -- Running it: command line, --fresh, Ctrl-C -----------------------------------------------
EXAMPLES = """\
examples:
  python examples/multi_agent/workflow.py                      # offline, scripted model
  python examples/multi_agent/workflow.py --model gpt-4o-mini  # any LiteLLM model
  python examples/multi_agent/workflow.py --slow 1             # press Ctrl-C, run again
  python examples/multi_agent/workflow.py --fresh              # start over
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--db",
        default=str(OUT / "build-textkit.db"),
        help="database: a file, or a postgresql:// URL",
    )
    parser.add_argument(
        "--out", type=Path, default=OUT / "textkit-project", help="folder the coders write"
    )
    parser.add_argument("--model", help="a LiteLLM model name; default: offline script")
    parser.add_argument(
        "--fresh", action="store_true", help="delete the database and the folder first"
    )
    parser.add_argument(
        "--slow", type=float, default=0.0, metavar="SECONDS", help="offline model delay per call"
    )
    parser.add_argument(
        "--stop-after", type=int, metavar="N", help="stop as Ctrl-C does, after N model calls"
    )
    return parser.parse_args(argv)


def start_over(db: str, project: Path) -> None:
    """Delete the project folder, and the database file (with its -wal, -shm, -lock
    files) or, in a PostgreSQL database, the workflow's journal and agents."""
    if project.is_dir() and any(project.iterdir()) and not (project / MARKER).exists():
        msg = f"--fresh: not deleting {project}: this program did not create it"
        raise SystemExit(msg)
    shutil.rmtree(project, ignore_errors=True)
    if is_url(db):
        with Store(db) as store, contextlib.suppress(NotFoundError):  # no journal yet
            store.reset_workflow(WORKFLOW)  # deletes the agents its steps created
        return
    for suffix in ("", "-wal", "-shm", "-lock"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Run the workflow; return the exit status (130 after Ctrl-C)."""
    args = parse_args(argv)
    if args.fresh:
        start_over(args.db, args.out)
    if not is_url(args.db):
        Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    if not args.out.is_dir() or not any(args.out.iterdir()):
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / MARKER).touch()
    show_journal()

    calls = ModelCalls(stop_after=args.stop_after)
    offline = None if args.model else scripted_model(delay=args.slow, stopping=calls.stopping)
    persistence = PersistenceHandler(args.db, workflow=WORKFLOW, code_version=CODE_VERSION)
    run = Run(args.model, persistence, calls, offline)
    model = args.model or "the offline model"
    print(f"workflow {WORKFLOW!r} with {model}, journal in {shown(args.db)}")
    try:
        with run.handlers():
            build(make_team(args.out), run)
    except KeyboardInterrupt:
        calls.stopping.set()
        print("\ninterrupted: run the same command again to resume where it stopped.")
        print(f"model calls: {calls.count}")
        return 130
    except DurableError as error:
        print(f"\n{type(error).__name__}: {error}\n(--fresh starts over)", file=sys.stderr)
        return 1
    finally:
        persistence.close()
    report(args.db, args.out, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
