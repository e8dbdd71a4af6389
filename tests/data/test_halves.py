"""tfgpu.data in two halves (the map in tfgpu/data/__init__.py): reading a dataset never depends on how it was
written. The read half imports nothing of the write half, the write half nothing of the read half, directly or
through other tfgpu.data modules; both share only the schema. Imports are parsed (ast), nothing is imported."""
import ast
import pathlib

DATA = pathlib.Path(__file__).resolve().parents[2] / "tfgpu" / "data"

SCHEMA = {"tfrecord", "shards"}  # the record format, dataset.json and the checks of shards against it
WRITE = {"builtin", "convert", "csvlist", "encode", "folders", "foreign", "manifest", "outdir", "source_formats", "sources", "tfds_source", "workers"}
READ = {"augment", "chunks", "dataset_info", "input_position", "order", "pipeline", "position", "records", "resume"}
BRIDGE = {"catalog"}  # which dataset a run names, converted first when it must be: above both halves


def _data_imports(source: str) -> set:
    """The tfgpu.data modules ``source`` imports, anywhere in it (an import inside a function counts too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "tfgpu.data":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfgpu.data."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("tfgpu.data."))
    return found


def _graph() -> dict:
    return {p.stem: _data_imports(p.read_text()) - {p.stem} for p in DATA.glob("*.py") if p.stem != "__init__"}


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
             "catalog": _data_imports("def f():\n    from tfgpu.data import sources"),
             "sources": set()}
    assert _crossings(graph, {"records"}, {"sources"}) == ["records -> catalog -> sources"]
