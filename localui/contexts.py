"""The ``RunContext`` a resume or a fork hands the runner's tools (``--context``).

A tool given dependencies (a database handle, the user it acts for) declares a
``RunContext`` parameter, and the SDK's ``aresume``/``afork`` pass theirs on as
``context=``. The process that started the run had one; this one makes its own
through a factory the operator names:

- ``--context MODULE:FACTORY`` (or ``FILE.py:FACTORY``): for every runner;
- ``--context RUNNER=MODULE:FACTORY``: for the runner named ``RUNNER``, instead.

A factory is called as ``factory(execution_id=..., runner=...)`` before every
resume and fork, on the event loop as the runner's tools are (so keep it quick, or
make it ``async def``), and returns a ``fastaiagent.RunContext``. It is called
*before* the decision is claimed: otherwise the SDK would claim the pause and the
tool would fail after, losing it. So one that raises, or returns anything else,
refuses the action, and a pause stays waiting.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localui.errors import Refused
from localui.registry import Registry, RegistryError, load_attribute, one_line

OPTION = "--context"
#: The keywords a factory is called with.
KEYWORDS = ("execution_id", "runner")
#: A refusal carries the factory's error as one line of at most this many characters.
MESSAGE_CHARS = 300


def takes_context(runner: Any, method: str) -> bool:
    """Whether ``runner.method`` (``aresume``/``afork``) has a ``context`` parameter in
    the installed SDK (a Supervisor or Swarm has no ``afork`` at all)."""
    call = getattr(runner, method, None)
    if call is None:
        return False
    try:
        return "context" in inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class ContextFactory:
    """One ``--context`` value: the factory, and the runner it is for (None: every one)."""

    spec: str
    runner: str | None
    make: Callable[..., Any]

    @classmethod
    def load(cls, spec: str) -> ContextFactory:
        """Import the factory ``spec`` names and check it can be called as one."""
        runner, sep, target = spec.partition("=")
        if not sep:
            runner, target = "", spec
        elif not runner.strip():
            raise RegistryError(f"{OPTION} {spec!r}: expected RUNNER=MODULE:FACTORY")
        make = load_attribute(OPTION, target)
        if not callable(make):
            raise RegistryError(
                f"{OPTION} {spec!r}: {type(make).__name__} is not callable: name a function "
                f"of ({', '.join(f'{k}=' for k in KEYWORDS)}) returning a RunContext"
            )
        problem = _signature_problem(make)
        if problem is not None:
            raise RegistryError(f"{OPTION} {spec!r}: {problem}")
        return cls(spec=spec, runner=runner.strip() or None, make=make)

    async def context(self, *, execution_id: str, runner: str) -> Any:
        """The factory's ``RunContext`` for this run, or :class:`Refused` saying why not."""
        from fastaiagent import RunContext

        try:
            # On the event loop, where the runner's tools run too: a handle made here
            # (a sqlite3 connection) is used from the thread that made it.
            made = self.make(execution_id=execution_id, runner=runner)
            if inspect.isawaitable(made):
                made = await made
        except Exception as exc:
            raise Refused(
                f"the run context for {runner!r} could not be made: {self.spec} raised "
                f"{type(exc).__name__}: {_bounded(one_line(exc))}. Nothing was claimed"
                " or changed; try again once it is fixed."
            ) from exc
        if not isinstance(made, RunContext):
            raise Refused(
                f"the run context for {runner!r} could not be made: {self.spec} returned "
                f"{type(made).__name__}, not a fastaiagent RunContext. Nothing was claimed"
                " or changed."
            )
        return made


def _signature_problem(make: Callable[..., Any]) -> str | None:
    """Why ``make(execution_id=..., runner=...)`` cannot be called, if it cannot."""
    try:
        signature = inspect.signature(make)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: its call says
    try:
        signature.bind(**dict.fromkeys(KEYWORDS, ""))
    except TypeError as exc:
        wanted = ", ".join(f"{k}=" for k in KEYWORDS)
        return f"it cannot be called as {getattr(make, '__name__', 'it')}({wanted}): {exc}"
    return None


def _bounded(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class RunContexts:
    """Which factory makes each runner's context: its own, else the default, else none."""

    default: ContextFactory | None = None
    by_runner: Mapping[str, ContextFactory] = field(default_factory=dict)

    @classmethod
    def build(cls, factories: Iterable[ContextFactory], registry: Registry) -> RunContexts:
        """Match ``factories`` to the registered runners, or say what does not match."""
        default: ContextFactory | None = None
        by_runner: dict[str, ContextFactory] = {}
        for factory in factories:
            if factory.runner is None:
                if default is not None:
                    raise RegistryError(
                        f"{OPTION} {factory.spec!r}: {default.spec!r} is already the default;"
                        " name the runner as RUNNER=MODULE:FACTORY"
                    )
                default = factory
                continue
            name = factory.runner
            runner = registry.get(name)
            if runner is None:
                known = ", ".join(repr(n) for n in registry.names()) or "none (pass --agents)"
                raise RegistryError(
                    f"{OPTION} {factory.spec!r}: no runner named {name!r} is registered;"
                    f" the runners are: {known}"
                )
            if name in by_runner:
                raise RegistryError(
                    f"{OPTION} {factory.spec!r}: runner {name!r} already has"
                    f" {by_runner[name].spec!r}"
                )
            if not takes_context(runner, "aresume"):
                raise RegistryError(
                    f"{OPTION} {factory.spec!r}: {type(runner).__name__}.aresume of this "
                    "fastaiagent takes no context"
                )
            by_runner[name] = factory
        return cls(default=default, by_runner=by_runner)

    def factory_for(self, runner: str) -> ContextFactory | None:
        return self.by_runner.get(runner, self.default)

    async def context_for(
        self, runner: Any, method: str, *, execution_id: str, name: str
    ) -> Any | None:
        """The context to pass as ``runner.method(..., context=...)`` for the run
        ``execution_id`` of the runner registered as ``name``; None when it has no
        factory or that method takes no context (then none is passed)."""
        factory = self.factory_for(name)
        if factory is None or not takes_context(runner, method):
            return None
        return await factory.context(execution_id=execution_id, runner=name)

    def describe(self) -> list[str]:
        """One line per factory, for the start-up lines."""
        lines = [f"{name}: {f.spec}" for name, f in sorted(self.by_runner.items())]
        if self.default is not None:
            lines.append(f"every other runner: {self.default.spec}")
        return lines
