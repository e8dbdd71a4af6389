"""tfgpu.data in two halves (the map in tfgpu/data/__init__.py): reading a dataset never depends on how it was
written. The read half (index/, input/) imports nothing of the write half (sources/, conversion/), the write half
nothing of the read half, directly or through other tfgpu.data modules; both share only the schema (schema/).
Imports are parsed (ast), nothing is imported."""
import ast
import pathlib

DATA = pathlib.Path(__file__).resolve().parents[2] / "tfgpu" / "data"

SCHEMA = {"tfrecord", "shards"}  # the record format, dataset.json and the checks of shards against it
WRITE = {"builtin", "convert", "csvlist", "encode", "folders", "foreign", "manifest", "outdir", "source_formats",
         "source", "tfds_source", "workers"}
READ = {"augment", "chunks", "dataset_info", "input_position", "loader", "memory", "order", "pipeline", "position",
        "records", "resume"}
BRIDGE = {"catalog"}  # which dataset a run names, converted first when it must be: above both halves


SUBPACKAGES = {"schema", "index", "input", "sources", "conversion"}
HALF_OF_SUBPACKAGE = {"schema": SCHEMA, "index": READ, "input": READ, "sources": WRITE, "conversion": WRITE}


def _data_imports(source: str) -> set:
    """The tfgpu.data modules ``source`` imports, anywhere in it (an import inside a function counts too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfgpu.data"):
            last = node.module.split(".")[-1]
            found.update(alias.name for alias in node.names) if last in SUBPACKAGES | {"data"} else found.add(last)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[-1] for a in node.names if a.name.startswith("tfgpu.data."))
    return found


def _graph() -> dict:
    return {p.stem: _data_imports(p.read_text()) - {p.stem} for p in DATA.rglob("*.py") if p.stem != "__init__"}


def _reaches(graph: dict, start: str) -> dict:
    """Every tfgpu.data module ``start`` imports directly or transitively -> the import path that gets there."""
    paths, todo = {start: [start]}, [start]
    while todo:
        name = todo.pop()
        for nxt in sorted(graph.get(name, ())):
            if nxt not in paths:
                paths[nxt] = paths[name] + [nxt]
                todo.append(nxt)
    return paths


def _crossings(graph: dict, half: set, other: set) -> list:
    return sorted(" -> ".join(path) for name in half for reached, path in _reaches(graph, name).items()
                  if reached in other)


def test_every_data_module_is_in_one_half_the_schema_or_the_bridge():
    """A new module says which half it belongs to (add it to the map in tfgpu/data/__init__.py and here)."""
    groups = [SCHEMA, WRITE, READ, BRIDGE]
    assert sum(len(g) for g in groups) == len(set().union(*groups))
    assert set(_graph()) == set().union(*groups)


def test_each_subpackage_holds_one_half_or_the_schema():
    """The sub-packages follow the halves: a module of index/ or input/ reads, of sources/ or conversion/ writes."""
    for package, half in HALF_OF_SUBPACKAGE.items():
        stems = {p.stem for p in (DATA / package).glob("*.py") if p.stem != "__init__"}
        assert stems and stems <= half, (package, sorted(stems - half))


def test_the_read_half_imports_nothing_of_the_write_half():
    """Reading a converted dataset (records, pipeline, resume, ...) needs only its files and dataset.json."""
    assert _crossings(_graph(), READ, WRITE | BRIDGE) == []


def test_the_write_half_imports_nothing_of_the_read_half():
    """The converter writes the schema; how a run reads it is none of its business."""
    assert _crossings(_graph(), WRITE, READ | BRIDGE) == []


def test_the_schema_imports_neither_half():
    assert _crossings(_graph(), SCHEMA, READ | WRITE | BRIDGE) == []


def test_a_crossing_through_another_module_is_found_with_its_path():
    """The check follows imports transitively, inside functions too: how records once reached the converter."""
    graph = {"records": _data_imports("from tfgpu.data.catalog import DatasetInfo"),
             "catalog": _data_imports("def f():\n    from tfgpu.data.sources import folders"),
             "folders": set()}
    assert _crossings(graph, {"records"}, {"folders"}) == ["records -> catalog -> folders"]
