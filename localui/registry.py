"""The runners this process may resume, each bound to the store being served.

``--agents`` names them as ``package.module:attr`` or ``path/to/file.py:attr``;
the attribute is an ``Agent``, ``Chain``, ``Supervisor`` or ``Swarm``, a list of
them, or a function of no arguments returning either. A resume writes through the
runner's own checkpointer, so one that writes elsewhere than the store on screen
would resume a run nobody is looking at: such a runner is refused at start-up. A
runner with no checkpointer is bound to the served store (without one it would
not checkpoint its own continued run at all).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from localui.backends.base import StoreTarget


class RegistryError(Exception):
    """An ``--agents`` entry that cannot be loaded or bound; the message says why."""


def import_sdk() -> None:
    """Import the SDK for the runners to come, as the runners' own code imports it.

    ``import fastaiagent`` also imports its pytest plugin, and pytest with it, where
    pytest is installed; that is the SDK's choice, and the runners may rely on it, so
    it is left as it is (the memory budget counts localui's share beside it).
    """
    try:
        importlib.import_module("fastaiagent")
    except Exception as exc:
        raise RegistryError(f"cannot import the FastAIAgent SDK: {exc}") from exc


def load_spec(spec: str) -> list[Any]:
    """The agents named by one ``--agents`` value."""
    value = load_attribute("--agents", spec)
    if callable(value) and not _is_agent(value):
        value = _call_factory(spec, spec.rpartition(":")[2], value)
    agents = list(value) if isinstance(value, list | tuple) else [value]
    for agent in agents:
        if not _is_agent(agent):
            raise RegistryError(
                f"--agents {spec!r}: {type(agent).__name__} is not a fastaiagent Agent, "
                "Chain, Supervisor or Swarm"
            )
    return agents


def load_attribute(option: str, spec: str) -> Any:
    """The attribute ``spec`` (``MODULE:ATTR`` or ``FILE.py:ATTR``) names, imported as
    the runners' own code would be; errors name ``option`` and the spec. A file is
    imported once, so the agents and the ``--context`` factories of one file share it."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise RegistryError(f"{option} {spec!r}: expected MODULE:ATTR or FILE.py:ATTR")
    import_sdk()
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise RegistryError(f"{option} {spec!r}: no file {path}")
        name = f"localui_agents_{abs(hash(path.resolve()))}"
        module = sys.modules.get(name)
        if module is None:
            module = _import_file(option, spec, path, name)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise RegistryError(
                f"{option} {spec!r}: cannot import {target}: {type(exc).__name__}: {one_line(exc)}"
            ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise RegistryError(f"{option} {spec!r}: {target} has no attribute {attr!r}") from exc


def _import_file(option: str, spec: str, path: Path, name: str) -> ModuleType:
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise RegistryError(f"{option} {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise RegistryError(
            f"{option} {spec!r}: importing {path} failed: {type(exc).__name__}: {one_line(exc)}"
        ) from exc
    return module


def _call_factory(spec: str, attr: str, factory: Any) -> Any:
    """What a factory of no arguments returns; one that needs some, or raises, is refused."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        needed = [
            p.name
            for p in signature.parameters.values()
            if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        if needed:
            raise RegistryError(
                f"--agents {spec!r}: {attr} needs arguments ({', '.join(needed)}); name an "
                "Agent, a list of them, or a function of no arguments returning either"
            )
    try:
        return factory()
    except Exception as exc:
        raise RegistryError(
            f"--agents {spec!r}: calling {attr}() raised {type(exc).__name__}: {one_line(exc)}"
        ) from exc


def one_line(exc: BaseException) -> str:
    """An exception's message as one line: the error is printed as one."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def registry_kind(value: Any) -> str | None:
    """``agent``, ``chain``, ``supervisor`` or ``swarm``: which runner ``value`` is."""
    from fastaiagent import Agent, Chain, Supervisor, Swarm

    for kind, cls in (
        ("agent", Agent),
        ("chain", Chain),
        ("supervisor", Supervisor),
        ("swarm", Swarm),
    ):
        if isinstance(value, cls):
            return kind
    return None


def _is_agent(value: Any) -> bool:
    return registry_kind(value) is not None


def run_tools(agent: Any) -> list[Any]:
    """The tools ``Agent.aresume`` searches for the one it re-invokes."""
    return list(agent._run_tools())


def _members(runner: Any) -> list[Any]:
    """What writes through a checkpointer of its own: the runner, and a Swarm's agents
    (a Supervisor's workers run as clones on the Supervisor's checkpointer)."""
    if registry_kind(runner) == "swarm":
        return [runner, *runner.agents.values()]
    return [runner]


def bind(agent: Any, target: StoreTarget) -> None:
    """Make ``agent`` write to ``target``, or refuse when it writes somewhere else."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    checkpointer = agent._checkpointer  # the SDK keeps it here and offers no accessor
    if checkpointer is None:
        if target.sqlite_path is not None:
            agent._checkpointer = SQLiteCheckpointer(str(target.sqlite_path))
        elif target.pg_dsn is not None:
            from fastaiagent.checkpointers.postgres import PostgresCheckpointer

            agent._checkpointer = PostgresCheckpointer(target.pg_dsn, schema=target.pg_schema)
        return
    if isinstance(checkpointer, SQLiteCheckpointer):
        written = Path(str(checkpointer.db_path)).resolve()
        if target.sqlite_path is not None and written == target.sqlite_path.resolve():
            return
        raise RegistryError(
            f"agent {agent.name!r} writes to {written}, but this server shows "
            f"{target.describe()}: build it with SQLiteCheckpointer({str(target.sqlite_path)!r})"
            " or without a checkpointer, or serve its store instead"
        )
    schema = getattr(checkpointer, "schema", None)
    dsn = getattr(checkpointer, "connection_string", None)
    if target.pg_dsn is not None and schema is not None and isinstance(dsn, str):
        from localui.backends.postgres.pool import same_database
        from localui.backends.urls import redact

        if not same_database(dsn, target.pg_dsn):
            raise RegistryError(
                f"agent {agent.name!r} writes to {redact(dsn)}, but this server shows "
                f"{target.describe()}: build it with PostgresCheckpointer on the served "
                "database, or without a checkpointer"
            )
        schema_name = schema.strip('"')
        if schema_name == target.pg_schema:
            return
        raise RegistryError(
            f"agent {agent.name!r} writes to PostgreSQL schema {schema_name}, but this server "
            f"shows {target.describe()}: pass --pg-schema {schema_name} or build the agent with "
            "the served schema"
        )
    raise RegistryError(
        f"agent {agent.name!r} writes through {type(checkpointer).__name__}, which is not "
        f"the store this server shows ({target.describe()})"
    )


@dataclass(frozen=True, slots=True)
class Registry:
    """Registered agents by name (the ``chain_name`` their runs carry)."""

    agents: Mapping[str, Any]

    @classmethod
    def build(cls, agents: Iterable[Any], target: StoreTarget) -> Registry:
        by_name: dict[str, Any] = {}
        for agent in agents:
            if agent.name in by_name and by_name[agent.name] is not agent:
                raise RegistryError(f"two agents are registered as {agent.name!r}")
            for member in _members(agent):
                bind(member, target)
            by_name[agent.name] = agent
        return cls(agents=by_name)

    def get(self, name: str) -> Any | None:
        return self.agents.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.agents))


@contextlib.contextmanager
def project_scope(project_id: str | None) -> Iterator[None]:
    """Stamp what the SDK writes with the run's own project, as the run's process did.

    Without it the SDK resolves a project from this process's working directory,
    creating ``.fastaiagent/config.toml`` there, and the resumed rows would carry
    another project than the run's, out of reach of that project's outbox drain.
    """
    from fastaiagent._internal.scope import scoped_project_id

    token = scoped_project_id.set(project_id) if project_id is not None else None
    try:
        yield
    finally:
        if token is not None:
            scoped_project_id.reset(token)
