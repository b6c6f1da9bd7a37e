"""The layering contracts of docs/DESIGN.md, checked two ways.

Statically: every `import` and `from … import` (relative ones resolved, those inside
functions and `if TYPE_CHECKING:` blocks included) in the modules a contract covers, and in
every project module they reach. At run time: the modules are imported in a fresh
interpreter that records who imported what, and nothing forbidden may be in `sys.modules`
afterwards (this sees what third-party libraries pull in, too).

A failure names the forbidden module, the module that imports it (with the line) and how
that module is reached from the one under contract.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpud", "launch", "tui", "trainers")

#: Libraries that do I/O: sockets, processes, databases, GPUs.
IO_LIBRARIES = ("zmq", "psutil", "sqlite3", "pynvml", "socket", "subprocess")
#: The project's modules that touch files, sockets or processes. `gpud.model.endpoints` (pure
#: address parsing) and `gpud.model.snapshot` (pydantic models) are not among them.
IO_PROJECT_MODULES = (
    "gpud.attach.client",
    "gpud.attach.server",
    "gpud.checkpoints",
    "gpud.cli",
    "gpud.commands.demo",
    "gpud.daemon",
    "gpud.hardware",
    "gpud.kube",
    "gpud.node.paths",
    "gpud.node.statedir",
    "gpud.node.store",
    "gpud.notify.sender",
    "gpud.notify.service",
    "gpud.retention.compact",
    "gpud.retention.files",
    "gpud.retention.rows",
    "gpud.retention.service",
    "gpud.runs",
    "gpud.scaling.baselines",
    "gpud.security.audit",
    "gpud.security.auth",
    "gpud.security.guard",
    "gpud.security.keys",
    "gpud.security.known_nodes",
    "gpud.settings",
    "gpud.slurm",
    "gpud.wire.client",
    "gpud.wire.control",
    "gpud.wire.drain",
    "gpud.wire.ingest",
    "gpud.wire.publisher",
    "launch.gpuctl",
    "launch.scripts",
)


#: The rooms of `gpud.runs` (gpud/runs/__init__.py), lowest first, each with the rooms it
#: may import; it may import no other.
RUN_ROOMS: dict[str, tuple[str, ...]] = {
    "process": ("process",),
    "diagnosis": ("diagnosis", "process"),
    "placement": ("placement", "process"),
    "state": ("state", "process", "diagnosis"),
    "multinode": ("multinode", "process", "diagnosis", "placement", "state"),
    "health": ("health", "process", "diagnosis", "placement", "state", "multinode"),
    "lifecycle": ("lifecycle", "process", "diagnosis", "placement", "state", "multinode", "health"),
}


@dataclass(frozen=True)
class Contract:
    """Modules (or whole packages) that must not import some others."""

    name: str
    covers: tuple[str, ...]
    forbidden: tuple[str, ...]
    #: Modules the runtime check leaves out: scripts that do their work at import.
    not_imported: tuple[str, ...] = ()
    #: Forbidden at the static check only: the standard library or a dependency imports
    #: these anyway, so their presence in `sys.modules` says nothing about our code.
    static_only: tuple[str, ...] = ()


CONTRACTS = [
    Contract(
        "trainers imports nothing of the project",
        covers=("trainers",),
        forbidden=("gpud", "launch", "tui"),
        not_imported=("trainers.examples",),
    ),
    Contract(
        "the TUI's model layer imports no Textual",
        covers=("tui.model",),
        forbidden=("textual", "textual_serve"),
    ),
    Contract(
        "run specs, command builders and auto-tuning do no I/O",
        covers=(
            "launch.spec",
            "launch.sections",
            "launch.backends",
            "launch.placement",
            "launch.environment",
            "launch.autotune",
            "launch.slurm",
            "launch.slurm_states",
        ),
        forbidden=IO_LIBRARIES + IO_PROJECT_MODULES,
        static_only=("socket", "subprocess"),
    ),
    Contract(
        "the scaling arithmetic does no I/O",
        covers=("gpud.scaling.arithmetic",),
        forbidden=IO_LIBRARIES + IO_PROJECT_MODULES,
        static_only=("socket", "subprocess"),
    ),
    Contract(
        "webhook config, alerts and payloads do no I/O",
        covers=("gpud.notify.targets", "gpud.notify.alerts", "gpud.notify.payloads"),
        forbidden=IO_LIBRARIES + IO_PROJECT_MODULES + ("urllib.request", "http"),
        static_only=("socket", "subprocess", "urllib.request", "http"),
    ),
    Contract(
        "retention's choice, thinning and usage rows do no I/O",
        covers=("gpud.retention.policy", "gpud.retention.reduce", "gpud.retention.usage"),
        forbidden=IO_LIBRARIES + IO_PROJECT_MODULES,
        static_only=("socket", "subprocess"),
    ),
    Contract(
        "gpud.model is data: no I/O, and nothing of the node, security, the wire or the runs",
        covers=("gpud.model",),
        forbidden=IO_LIBRARIES
        + IO_PROJECT_MODULES
        + ("gpud.node", "gpud.security", "gpud.wire", "gpud.runs"),
        static_only=("socket", "subprocess"),
    ),
    Contract(
        "the node's state imports nothing of security, the wire or the runs",
        covers=("gpud.node",),
        forbidden=("gpud.security", "gpud.wire", "gpud.runs", "gpud.daemon", "gpud.commands"),
    ),
    Contract(
        "security imports nothing of the wire or the runs",
        covers=("gpud.security",),
        forbidden=("gpud.wire", "gpud.runs", "gpud.daemon", "gpud.commands"),
    ),
    Contract(
        "the wire imports nothing of the runs, the daemon or the commands",
        covers=("gpud.wire",),
        forbidden=("gpud.runs", "gpud.daemon", "gpud.commands", "gpud.cli"),
    ),
    *(
        Contract(
            f"gpud.runs.{room} imports no room of gpud.runs above it",
            covers=(f"gpud.runs.{room}",),
            forbidden=tuple(f"gpud.runs.{other}" for other in RUN_ROOMS if other not in below),
        )
        for room, below in RUN_ROOMS.items()
    ),
    Contract(
        "gpud never imports the front ends",
        covers=("gpud",),
        forbidden=("tui", "launch.gpuctl", "textual"),
    ),
]


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden_by(contract: Contract, module: str, static: bool = True) -> str | None:
    rules = contract.forbidden
    if not static:
        rules = tuple(r for r in rules if r not in contract.static_only)
    return next((r for r in rules if is_under(module, r)), None)


# --------------------------------------------------------------------------- static


@dataclass(frozen=True)
class ImportLine:
    """One name an import statement may bring in (`from a import b`: `a` and `a.b`)."""

    target: str
    line: int


@cache
def project_modules() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def module_imports(module: str, path: Path) -> list[ImportLine]:
    """Every import statement anywhere in the file, relative ones made absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[ImportLine] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [ImportLine(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append(ImportLine(base, node.lineno))
            found += [
                ImportLine(f"{base}.{alias.name}", node.lineno)
                for alias in node.names
                if alias.name != "*"
            ]
    return found


def project_module_of(target: str) -> str | None:
    """The project module an imported name lives in (`gpud.wire.protocol.Method` is in
    gpud.wire.protocol)."""
    modules = project_modules()
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def covered(contract: Contract) -> list[str]:
    return [m for m in project_modules() if any(is_under(m, c) for c in contract.covers)]


def static_violations(contract: Contract) -> Iterator[str]:
    """Walk the project modules reachable from the covered ones; yield each bad import."""
    modules = project_modules()
    via: dict[str, str | None] = dict.fromkeys(covered(contract))
    queue = list(via)
    while queue:
        module = queue.pop(0)
        reported: set[int] = set()  # one message per statement
        for imp in module_imports(module, modules[module]):
            rule = forbidden_by(contract, imp.target)
            if rule is not None:
                if imp.line in reported:
                    continue
                reported.add(imp.line)
                where = f"{modules[module].relative_to(ROOT)}:{imp.line}"
                yield f"{imp.target} (forbidden: {rule}) imported by {module} at {where}" + (
                    f", reached through {chain(module, via)}" if via[module] else ""
                )
                continue
            reached = project_module_of(imp.target)
            if reached is not None and reached not in via:
                via[reached] = module
                queue.append(reached)


def chain(module: str, via: dict[str, str | None]) -> str:
    path = [module]
    while (parent := via.get(path[-1])) is not None and parent not in path:
        path.append(parent)
    return " ← ".join(path)


# --------------------------------------------------------------------------- runtime

#: Run in a fresh interpreter: import the modules named on the command line, recording for
#: every module the module whose import statement loaded it; print both as JSON.
PROBE = """
import importlib, json, sys

importers = {}

class RecordImporter:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in importers:
            frame = sys._getframe(1)
            while frame is not None and (
                frame.f_code.co_filename.startswith("<frozen")
                or frame.f_globals.get("__name__", "").startswith("importlib")
            ):
                frame = frame.f_back
            importers[name] = frame.f_globals.get("__name__", "?") if frame else "?"
        return None

sys.meta_path.insert(0, RecordImporter)
for name in sys.argv[1:]:
    importers.setdefault(name, "the test")
    importlib.import_module(name)
print(json.dumps({"modules": sorted(sys.modules), "importers": importers}))
"""


@dataclass(frozen=True)
class Loaded:
    modules: list[str]
    importers: dict[str, str]

    def chain(self, module: str) -> str:
        path = [module]
        while (parent := self.importers.get(path[-1])) is not None and parent not in path:
            path.append(parent)
            if parent == "the test":
                break
        else:
            if path[-1] != "the test":
                path.append("(loaded before the test's imports)")
        return " ← ".join(path)


def import_fresh(modules: Iterable[str]) -> Loaded:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, f"importing {list(modules)} failed:\n{result.stderr}"
    data = json.loads(result.stdout)
    return Loaded(data["modules"], data["importers"])


def runtime_violations(contract: Contract) -> list[str]:
    names = [m for m in covered(contract) if m.rpartition(".")[2] != "__main__"]
    names = [m for m in names if not any(is_under(m, n) for n in contract.not_imported)]
    loaded = import_fresh(names)
    bad = []
    for module in loaded.modules:
        rule = forbidden_by(contract, module, static=False)
        importer = loaded.importers.get(module, "")
        # Where the line is crossed, not everything the forbidden module loads in turn.
        if rule is not None and forbidden_by(contract, importer, static=False) is None:
            bad.append(f"{module} (forbidden: {rule}) is loaded: {loaded.chain(module)}")
    return bad


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_no_forbidden_import_statement(contract: Contract) -> None:
    assert covered(contract), f"{contract.covers} matched no module: the contract checks nothing"
    bad = list(static_violations(contract))
    assert not bad, f"{contract.name}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_no_forbidden_module_is_loaded(contract: Contract) -> None:
    bad = runtime_violations(contract)
    assert not bad, f"{contract.name}:\n  " + "\n  ".join(bad)


def test_static_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Relative imports, imports inside functions and `from` imports of submodules."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text(
        "import os\n"
        "from .. import sibling\n"
        "from ..other import thing\n"
        "def f():\n"
        "    from gpud.wire import client\n"
        "    import zmq.asyncio\n"
    )
    targets = {i.target for i in module_imports("pkg.sub.mod", pkg / "sub" / "mod.py")}
    assert {"os", "pkg.sibling", "pkg.other.thing", "gpud.wire.client", "zmq.asyncio"} <= targets
    init = {i.target for i in module_imports("pkg", pkg / "__init__.py")}
    assert "pkg.sub" in init
    io = CONTRACTS[2]
    assert forbidden_by(io, "gpud.wire.client") == "gpud.wire.client"
    assert forbidden_by(io, "zmq.asyncio") == "zmq"
    assert forbidden_by(io, "gpud.model.endpoints") is None
    assert forbidden_by(io, "socket", static=False) is None


def test_runtime_check_names_the_importer() -> None:
    """The probe traces a module loaded on the way back to what the test imported."""
    loaded = import_fresh(["gpud.wire.client"])
    assert "zmq" in loaded.modules
    assert loaded.chain("zmq").endswith("gpud.wire.client ← the test")
    assert loaded.chain("gpud.wire.client") == "gpud.wire.client ← the test"


#: What `gpuctl ps` never needs (issue 22 §4: a whole `gpuctl ps` under 200 ms, most of it
#: Python's start-up and imports): run specs and YAML, auto-tuning, the daemon's run
#: machinery (failure causes, hints, logs), the node briefs views of many nodes read,
#: Textual and torch.
NOT_FOR_PS = (
    "yaml",
    "torch",
    "textual",
    "launch.spec",
    "launch.sections",
    "launch.autotune",
    "launch.slurm",
    "gpud.runs",
    "gpud.hardware",
    "gpud.wire.brief",
    "concurrent.futures",
    "tempfile",
)


def test_gpuctl_ps_imports_only_what_it_needs() -> None:
    loaded = import_fresh(["launch.gpuctl.main", "launch.gpuctl.runs"])
    bad = [
        f"{module} is loaded: {loaded.chain(module)}"
        for module in loaded.modules
        if any(is_under(module, name) for name in NOT_FOR_PS)
    ]
    assert not bad, "\n  ".join(["`gpuctl ps` loads what it never uses:", *bad])
