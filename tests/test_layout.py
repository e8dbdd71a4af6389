"""The package's shape, as docs/architecture.md describes it: no import cycle, commands on top, tests mirroring."""
import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfgpu"
COMMANDS = {"train", "evaluate", "export", "sample", "convert", "launch", "benchmark", "doctor", "report",
            "audit_input", "plan"}


@functools.lru_cache(maxsize=1)
def _modules() -> dict:
    """Dotted module name -> parsed source, for every module of tfgpu (parsed once per session; read only)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text())
    return out


def _imports(tree, names, anywhere: bool) -> set:
    """tfgpu modules a module imports: at module level only, or anywhere (function-level imports too)."""
    nodes = ast.walk(tree) if anywhere else tree.body
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfgpu"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in names else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tfgpu"))
    return found & set(names)


def _cycles(graph: dict) -> list:
    """Every import circle found by a depth-first walk of ``graph``, each as the path that closes it."""
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycle_between_modules():
    """A cycle among imports makes import order matter and hides who depends on whom; an import inside a function
    is a dependency all the same, so it counts too."""
    from tfgpu.tasks import TASK_MODULES  # the task registry imports these by name: edges all the same

    modules = _modules()
    graph = {name: _imports(tree, modules, anywhere=True) - {name} for name, tree in modules.items()}
    assert set(TASK_MODULES) <= set(modules)
    graph["tfgpu.tasks.registry"] |= set(TASK_MODULES)
    assert [" -> ".join(cycle) for cycle in _cycles(graph)] == []


def test_the_cycle_check_finds_a_circle_through_a_function_level_import():
    """The walk reports a circle closed by an import inside a function, naming its modules in order."""
    tree = {"tfgpu.a": ast.parse("import tfgpu.b"), "tfgpu.b": ast.parse("def f():\n    from tfgpu import a")}
    graph = {name: _imports(t, tree, anywhere=True) - {name} for name, t in tree.items()}
    assert _cycles(graph) == [["tfgpu.a", "tfgpu.b", "tfgpu.a"]]


def test_config_imports_nothing_from_tfgpu():
    """Config is a leaf: it holds and checks values; what they name is checked by its callers (config_sources)."""
    imported = []
    for path in sorted((PACKAGE / "config").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported += [(path.name, a.name if isinstance(node, ast.Import) else node.module) for node in ast.walk(tree)
                     if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names]
    outside = [(file, name) for file, name in imported
               if name and name.split(".")[0] == "tfgpu" and not name.startswith("tfgpu.config.")]
    assert outside == [] and ("__init__.py", "tfgpu.config.options") in imported


def test_the_library_never_imports_a_command():
    """Commands sit on top: they call the library, never the other way round (the converter's library once built
    an argv for the convert command, which imported it back)."""
    modules = _modules()
    commands = {f"tfgpu.{c}" for c in COMMANDS}
    offenders = {name: sorted(_imports(tree, modules, anywhere=True) & commands)
                 for name, tree in modules.items() if name not in commands and name != "tfgpu"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_tests_mirror_the_package():
    """Each library package has its test package: tests/<package>/ for tfgpu/<package>/."""
    tests = PACKAGE.parent / "tests"
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    assert sorted(p for p in packages if not (tests / p).is_dir()) == []
    library = [p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE and p.name != "__init__.py"]
    untested = [str(p.relative_to(PACKAGE)) for p in library
                if not (tests / p.relative_to(PACKAGE).parent / f"test_{p.stem}.py").exists()]
    assert len(untested) <= 12, untested  # shrinking: modules tested only through their callers so far


SECTIONED = {"tfgpu.runtime.distribute": "RuntimeConfig", "tfgpu.data.catalog": "DatasetConfig",
             "tfgpu.data.input.pipeline": "InputConfig", "tfgpu.tasks.optimizers": "OptimizationConfig",
             "tfgpu.training.trainer": "TrainerConfig"}


def test_subsystems_receive_their_section_not_the_whole_config():
    """The strategy, the dataset catalog, the input pipeline, the optimizers and the loop name the slice of the
    configuration they read (``tfgpu.config.Section``), so a reader sees a subsystem's inputs in its signature."""
    modules = _modules()
    for name, section in SECTIONED.items():
        imported = {alias.name for node in ast.walk(modules[name]) if isinstance(node, ast.ImportFrom)
                    and node.module == "tfgpu.config" for alias in node.names}
        assert section in imported and "Config" not in imported, (name, sorted(imported))


def test_no_module_is_over_400_lines():
    """Long modules are split by concept (config/ by section, plan's validation in bench/plan_validation.py)."""
    long = {str(path.relative_to(PACKAGE)): path.read_text().count("\n") for path in PACKAGE.rglob("*.py")}
    assert {name: lines for name, lines in long.items() if lines > 400} == {}


def test_the_readme_is_for_users_and_ci_runs_its_commands():
    """The README stays short (measurements live in docs/benchmarks.md), keeps the two commands a fresh machine
    needs, and .ci/run runs its test command verbatim; every doc page opens with the tasks it answers."""
    root = PACKAGE.parent
    readme = (root / "README.md").read_text()
    assert readme.count("\n") < 200
    quickstart = ("python -m pip install -e . && python -m tfgpu.train --flagfile=configs/quickstart.flags "
                  "--model_dir=/tmp/tfgpu-quickstart")
    tests = "python -m pip install -e '.[test]' && python -m pytest -q -n 2 --dist worksteal"
    assert quickstart in readme.splitlines() and tests in readme.splitlines()
    assert tests in (root / ".ci" / "run").read_text().splitlines()
    for page in sorted((root / "docs").glob("*.md")):
        assert "\nThis page answers:\n" in page.read_text()[:400], page.name


GROUND = {"config": set(), "durations": {"config"}, "runtime": {"config", "durations"},
          "data": {"config", "durations", "runtime"}, "models": {"config", "durations", "runtime"},
          "metrics": {"config", "durations", "runtime"}}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _package_arrows() -> dict:
    """(importing package, imported package) -> the module imports behind that arrow (function-level ones too);
    a top-level module (a command, config_sources, cli) is a package of its own."""
    modules = _modules()
    arrows = {}
    for name, tree in modules.items():
        for imported in _imports(tree, modules, anywhere=True):
            if _package(imported) != _package(name):
                arrows.setdefault((_package(name), _package(imported)), []).append((name, imported))
    return arrows


def test_the_ground_floors_import_nothing_above_them():
    """config and durations, then runtime/, then data/, models/ and metrics/ import only the floors below them
    (function-level imports count): what runtime/ needed of training/ (the exit codes, the run directory's names,
    the gradient clipping of the guarded step) lives in runtime/; what the launcher needed of the train flags is
    read by the launch command and handed in."""
    upward = sorted(edge for (source, target), edges in _package_arrows().items()
                    if source in GROUND and target not in GROUND[source] for edge in edges)
    assert upward == []


def test_no_circle_among_packages():
    """No two packages import each other, and no longer circle runs through packages either: each package sits on
    one floor of docs/architecture.md's map (tasks below training, metrics/ below both and the report)."""
    graph = {}
    for source, target in _package_arrows():
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    circles = [" -> ".join(c) + ": " + ", ".join(f"{a} imports {b}" for a, b in _package_arrows()[(c[0], c[1])][:2])
               for c in _cycles(graph)]
    assert circles == []


def test_the_circle_check_finds_a_circle_of_three_packages():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def _floors_of_the_map() -> dict:
    """Package -> floor, from the ``floor N  a, b`` block of docs/architecture.md's "Packages"."""
    import re

    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    floors = {}
    for number, names in re.findall(r"^floor (\d+)  (.+)$", text, flags=re.M):
        for name in names.split(", "):
            assert name not in floors, f"{name} is on two floors of the map"
            floors[name] = int(number)
    return floors


def test_every_import_points_down_the_map_in_docs_architecture():
    """docs/architecture.md's map is the code's: every package (``tfgpu`` for tfgpu/__init__.py) on one floor, and
    every import from a floor to a lower one."""
    floors = {("tfgpu" if name == "" else name): floor for name, floor in _floors_of_the_map().items()}
    arrows = {(a or "tfgpu", b or "tfgpu"): edges for (a, b), edges in _package_arrows().items()}
    packages = {name for arrow in arrows for name in arrow}
    assert sorted(packages - set(floors)) == [] and sorted(set(floors) - packages) == []
    wrong = [f"{a} (floor {floors[a]}) imports {b} (floor {floors[b]}): {edges[0][0]} imports {edges[0][1]}"
             for (a, b), edges in sorted(arrows.items()) if floors[a] <= floors[b]]
    assert wrong == []


STRATEGIES = {"MirroredStrategy", "MultiWorkerMirroredStrategy", "OneDeviceStrategy", "TPUStrategy",
              "ParameterServerStrategy", "CentralStorageStrategy"}


def _strategy_constructions(tree) -> list:
    """Line numbers where ``tree`` calls a tf.distribute strategy's constructor (``tf.distribute.X(...)``, ``X(...)``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in STRATEGIES:
                lines.append(node.lineno)
    return lines


def test_one_module_builds_strategies():
    """Issue 54: a strategy is built in one place, runtime/distribute.py (its settings, devices, collective options
    and errors), whoever asks for it: a command's flags, ``import tfgpu``, the all-reduce probe."""
    builders = {name: lines for name, tree in _modules().items() if (lines := _strategy_constructions(tree))}
    assert set(builders) == {"tfgpu.runtime.distribute"}, builders


def test_the_strategy_check_finds_a_second_builder():
    tree = ast.parse("import tensorflow as tf\ndef make():\n    return tf.distribute.MirroredStrategy()\n")
    assert _strategy_constructions(tree) == [3]


def test_one_place_says_whether_a_strategy_spans_several_workers():
    """Issue 54: ``runtime.distribute.is_multi_worker`` alone reads the strategy's private multi-worker mode."""
    readers = {name for name, tree in _modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr == "_in_multi_worker_mode"}
    assert readers == {"tfgpu.runtime.distribute"}, readers


# A loop that is not over training or test steps: the index order's loop over windows of the data.
WHILE_LOOPS_NOT_OVER_STEPS = {"tfgpu.data.index.order"}


def _while_loop_calls(tree) -> list:
    """Line numbers where ``tree`` calls ``tf.while_loop`` (or a bare ``while_loop``)."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "while_loop"]


def test_one_module_loops_over_steps():
    """Issue 54: the compiled loop over steps (``training.loop.run_steps``: steps per call, the stop flag, an input
    that may end) is written once; the flag command, tfgpu.fit and the Keras adapter build on it."""
    loops = {name: lines for name, tree in _modules().items() if (lines := _while_loop_calls(tree))}
    assert set(loops) - WHILE_LOOPS_NOT_OVER_STEPS == {"tfgpu.training.loop"}, loops
    assert len(loops["tfgpu.training.loop"]) == 1, loops  # one while_loop, whatever the input


def test_the_loop_check_finds_a_second_loop():
    tree = ast.parse("import tensorflow as tf\ndef run(n):\n    return tf.while_loop(lambda i: i < n, "
                     "lambda i: i + 1, [0])\n")
    assert _while_loop_calls(tree) == [3]


def test_one_scheme_keeps_a_workers_outputs_off_the_real_run_directory():
    """Issue 54: what every worker must write but only the chief keeps (checkpoints, a callback's files) goes, off the
    chief, to ``runtime.distribute.scratch_dir``; no module of the doors (training/) makes a temporary directory of its
    own, but the export's, which is an atomic write beside its target."""
    makers = {name for name, tree in _modules().items() if name.startswith("tfgpu.training")
              for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "mkdtemp"}
    assert makers == {"tfgpu.training.exporting"}, makers


def test_one_module_writes_and_restores_checkpoints():
    """Issue 54: both doors save and resume through ``training.checkpoint.Checkpointer`` (tfgpu.fit's run state,
    ``fit/state.py``, and the flag command's trainer): no other module makes a ``CheckpointManager`` or a
    ``tf.train.Checkpoint`` (``input_profile``'s is a snapshot of the trainer's state in a temporary directory, read
    back after the profiled steps: never a checkpoint of the run)."""
    def makes(tree, name):
        return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
                   for node in ast.walk(tree))

    managers = {name for name, tree in _modules().items() if makes(tree, "CheckpointManager")}
    checkpoints = {name for name, tree in _modules().items() if makes(tree, "Checkpoint")}
    assert managers == {"tfgpu.training.checkpoint"}, managers
    assert checkpoints == {"tfgpu.training.checkpoint", "tfgpu.training.input_profile"}, checkpoints
