"""The layout reads as the architecture: few top-level modules, packages in one dependency order.

Every `import` statement under lab/ is read (module level and inside functions alike): an import
inside a function is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lab.release import release_layouts
from tests.head_cases import HEAD_NAMES

LAB = Path(__file__).resolve().parents[1] / "lab"
# Lower first: each unit imports only units before it (and itself). A unit is a package or module under lab/,
# or a dotted part of one. Tensor building blocks (nn) and data sit below the decoding core (decode_core, model-free);
# the heads are written against the core, the model (trunks, the MTP model, cost, compile) is assembled from them.
# Release formats (release) read and write through the model and the checkpoint files; training and the decoding
# application (decode) drive them all. Tracking (console, CSV history, wandb, measured time) needs only the first modules.
LAYERS = ["errors", "schema", "labels", "horizon", "data", "tracking", "nn", "decode_core", "model.heads", "model",
          "objective", "checkpoint", "release", "training", "decode", "eval", "callbacks", "config", "report", "run", "train"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LAB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The lab modules `path` imports (`from lab.x import y` counts lab.x.y when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in LAB.rglob("*.py")}
    return {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}


def unit(module: str, layers: list[str] = LAYERS) -> str:
    """The longest entry of `layers` that holds `module`: lab.model.heads.base → model.heads; lab.model.mtp → model;
    lab.train → train."""
    if "." not in module:
        return module
    dotted = module.split(".", 1)[1]
    return max((u for u in layers if dotted == u or dotted.startswith(u + ".")), key=len)


def upward_imports(graph: dict[str, set[str]], layers: list[str] = LAYERS) -> list[str]:
    """Edges a -> b where b's unit stands after a's. A package's __init__ re-exporting its own members is no such edge."""
    rank = {name: i for i, name in enumerate(layers)}
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if unit(a) != "lab" and unit(b) != "lab" and not b.startswith(a + ".") and rank[unit(b, layers)] > rank[unit(a, layers)])


def imports_into(graph: dict[str, set[str]], sources: set[str], target: str) -> list[str]:
    """Edges from a module of the units `sources` to one of unit `target`."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if unit(a) in sources for b in targets if unit(b) == target)


def test_the_top_level_has_at_most_six_modules():
    modules = sorted(p.name for p in LAB.glob("*.py"))
    assert len(modules) <= 6, modules


def test_every_package_and_top_level_module_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in LAB.iterdir() if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    top = {layer.split(".")[0] for layer in LAYERS}
    assert units == top, units ^ top
    graph = import_graph()
    assert [layer for layer in LAYERS if f"lab.{layer}" not in graph] == []  # every dotted unit names a module or package


def test_no_import_runs_upward():
    upward = upward_imports(import_graph())
    assert upward == [], upward


def test_heads_and_the_decoding_core_never_import_the_decoding_application():
    """A head's drafter and the core it is written against stay below generate, batching, the CLI and loading."""
    assert imports_into(import_graph(), {"decode_core", "model.heads"}, "decode") == []


def reachable(graph: dict[str, set[str]], sources: set[str]) -> set[str]:
    """Every module the units `sources` import, directly or through others."""
    seen, todo = set(), [m for m in graph if unit(m) in sources]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_report_never_imports_the_model():
    """lab-report reads what it needs of a head from run.json (`head_traits`, `k`), directly or through other modules."""
    model = sorted(m for m in reachable(import_graph(), {"report"}) if unit(m).split(".")[0] == "model")
    assert model == [], model


def test_no_module_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path + [node, target]
            if target not in state and (cycle := visit(target, path + [node])):
                return cycle
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize("root", ["lab", "analysis", "experiments"])
def test_no_head_or_format_name_is_compared_outside_the_heads_package(root):
    """What a report, an export or a loader needs to know of an architecture is in its HeadSpec (lab/model/heads):
    no `==`, `!=` or `in` test on a head name or a head's release format name elsewhere."""
    names = "|".join(HEAD_NAMES + tuple(release_layouts()))
    pattern = re.compile(r"""(==|!=)\s*["'](%s)["']|["'](%s)["']\s*(==|!=|in\b|not\s+in\b)""" % (names, names))
    heads = LAB / "model" / "heads"
    hits = [f"{p}:{i}" for p in (LAB.parent / root).rglob("*.py") if heads not in p.parents
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == [], hits


def folder_imports(graph: dict[str, set[str]], folders: tuple[str, ...]) -> list[str]:
    """Edges from a module outside lab.model.heads into a head folder (`lab.model.heads.<name>[.*]`)."""
    inside = tuple(f"lab.model.heads.{name}" for name in folders)
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if not a.startswith("lab.model.heads")
                  for b in targets if b in inside or b.startswith(tuple(f"{i}." for i in inside)))


def test_the_library_reads_head_folders_through_the_registry():
    """lab.checkpoint, lab.decode, the model and the reports find an architecture's module, drafter and release
    layouts in its HeadSpec (lab.model.heads), never by importing its folder."""
    assert folder_imports(import_graph(), HEAD_NAMES) == []


def test_the_checks_see_a_violation():
    """The instruments themselves: upward edges, core/head imports of the application and a name comparison are found."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    assert rank[unit("lab.report.render")] > rank[unit("lab.model.mtp")]  # model -> report would be upward
    wrong = {"lab.decode_core.target": {"lab.decode.generate", "lab.model.mtp"}, "lab.model.heads.deepseek.drafter": {"lab.decode.loading"},
             "lab.nn.blocks": {"lab.model.heads.base"}, "lab.model": {"lab.model.mtp"}, "lab.decode.proposers": {"lab.model.heads"},
             "lab.decode_core.cache": {"lab.model.trunk"}, "lab.checkpoint.files": {"lab.release.hf_folder"}}
    assert upward_imports(wrong) == ["lab.checkpoint.files -> lab.release.hf_folder", "lab.decode_core.cache -> lab.model.trunk",
                                     "lab.decode_core.target -> lab.decode.generate", "lab.decode_core.target -> lab.model.mtp",
                                     "lab.model.heads.deepseek.drafter -> lab.decode.loading", "lab.nn.blocks -> lab.model.heads.base"]
    assert imports_into(wrong, {"decode_core", "model.heads"}, "decode") == ["lab.decode_core.target -> lab.decode.generate",
                                                                           "lab.model.heads.deepseek.drafter -> lab.decode.loading"]
    assert folder_imports({"lab.release.medusa": {"lab.model.heads", "lab.model.heads.medusa.head"}}, ("medusa",)) == [
        "lab.release.medusa -> lab.model.heads.medusa.head"]
    assert reachable({"lab.report.table": {"lab.report.head_traits"}, "lab.report.head_traits": {"lab.model.heads"}}, {"report"}) == {
        "lab.report.head_traits", "lab.model.heads"}  # a model import one module away is found
    pattern = re.compile(r"""(==|!=)\s*["'](ntp)["']""")
    assert pattern.search('if v.head == "ntp":')
