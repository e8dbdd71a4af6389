"""tfgpu.cli: one parser for every command. Config flags declared once and taken by every command that needs
them, the precedence of their sources, and bad flags as one line naming the flag, exit 1, for every command."""
import importlib
import os
import tempfile

import hypothesis
import hypothesis.strategies as st
import pytest

from tests.conftest import REPO
from tfgpu import audit_input, benchmark, cli, evaluate, export, sample, train
from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.models import registry  # noqa: F401 - imports TensorFlow (which raises the recursion limit) up front
from tfgpu.runtime import run_dir
from tfgpu.training import restore

COMMANDS = ("train", "evaluate", "export", "sample", "benchmark", "audit_input", "launch", "convert", "doctor",
            "report", "plan")
# Options a command requires, so that the flag under test is the first thing wrong.
REQUIRED = {"evaluate": ["--model_dir=/nonexistent/run"], "export": ["--model_dir=/nonexistent/run"],
            "sample": ["--model_dir=/nonexistent/run"], "report": ["--model_dir=/nonexistent/run"],
            "launch": ["--num_workers=1"]}
# The commands that take the shared Config flags, with how each builds its parser.
SHARED_PARSERS = {"train": train.parser, "evaluate": evaluate.parser, "export": export.parser,
                  "sample": sample.parser, "benchmark": benchmark.parser, "audit_input": audit_input.parser}
SHARED = {"model": ("small_cnn", "small_cnn"), "dataset": ("digits", "digits"), "data_dir": ("/d", "/d"),
          "image_size": ("16", 16), "distribution_strategy": ("mirrored", "mirrored"),
          "cpu_logical_devices": ("2", 2), "num_gpus": ("0", 0), "augment": ("flip", "flip"),
          "sync_batch_norm": ("true", True), "cache": ("false", False)}


def run_main(name, argv, capsys):
    """(exit code, stderr lines) of ``python -m tfgpu.<name> argv``, in this process."""
    module = importlib.import_module(f"tfgpu.{name}")
    try:
        code = module.main(list(argv))
    except SystemExit as e:  # argparse's own --help action (report) exits 0 after printing
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize("name", SHARED_PARSERS)
def test_every_command_that_trains_or_loads_a_model_takes_the_shared_flags(name):
    opts = SHARED_PARSERS[name]().parse_args(REQUIRED.get(name, []) + [f"--{k}={v}" for k, (v, _) in SHARED.items()])
    assert opts.config_flags == {k: value for k, (_, value) in SHARED.items()}


@pytest.mark.parametrize("name", ["evaluate", "export", "sample"])
def test_commands_on_a_run_take_every_train_flag_but_their_own_names(name):
    opts = SHARED_PARSERS[name]().parse_args(["--model_dir=/r", "--eval_split=test", "--lr_decay_epochs=3,6",
                                              "--checkpoint=/r/ckpt-3"])
    assert opts.config_flags == {"eval_split": "test", "lr_decay_epochs": (3.0, 6.0)}
    assert (opts.model_dir, opts.checkpoint) == ("/r", "/r/ckpt-3")  # the command's own, not Config's


def test_samples_seed_is_the_latent_seed_not_the_runs():
    opts = sample.parser().parse_args(["--model_dir=/r", "--seed=5"])
    assert opts.seed == 5 and "seed" not in opts.config_flags


def test_benchmark_sweeps_precision_and_xla_and_keeps_its_own_defaults():
    p = benchmark.parser()
    opts = p.parse_args(["--precision=float32,mixed_bfloat16", "--jit_compile=false,true", "--num_gpus=1"])
    assert (opts.precision, opts.jit_compile) == ("float32,mixed_bfloat16", "false,true")
    assert p.config_values(opts) == {"model": "resnet20", "dataset": "synthetic", "steps_per_loop": 10,
                                     "num_gpus": 1}


@pytest.mark.parametrize("argv, expected", [
    (["--jit_compile"], True), (["--nojit_compile"], False), (["--jit_compile=false"], False),
    (["--jit_compile=1"], True), (["--jit_compile", "--nojit_compile"], False),
])
def test_boolean_flag_forms(argv, expected):
    assert train.parser().parse_args(argv).config_flags == {"jit_compile": expected}


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seeds=st.tuples(*[st.one_of(st.none(), st.integers(0, 99))] * 3),
                  order=st.permutations(["yaml", "flagfile", "command_line"]))
def test_command_line_beats_flagfile_beats_yaml_beats_default(seeds, order):
    """Whatever order the sources appear in on the command line, the later source in precedence wins."""
    in_yaml, in_flagfile, on_command_line = seeds
    with tempfile.TemporaryDirectory() as tmp:
        argv = {"yaml": [], "flagfile": [], "command_line": []}
        if in_yaml is not None:
            with open(os.path.join(tmp, "c.yaml"), "w") as f:
                f.write(f"seed: {in_yaml}\n")
            argv["yaml"] = [f"--config={tmp}/c.yaml"]
        if in_flagfile is not None:
            with open(os.path.join(tmp, "f.flags"), "w") as f:
                f.write(f"--seed={in_flagfile}\n")
            argv["flagfile"] = [f"--flagfile={tmp}/f.flags"]
        if on_command_line is not None:
            argv["command_line"] = [f"--seed={on_command_line}"]
        config = train.parse(["--dataset=digits", "--model_dir=/tmp/unused"] + sum((argv[s] for s in order), []))
    expected = next((s for s in (on_command_line, in_flagfile, in_yaml) if s is not None), config_lib.Config.seed)
    assert config.seed == expected


def test_run_commands_read_the_saved_config_under_their_flags(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = config_lib.Config(model_dir="/where/it/trained", dataset="digits", model="small_cnn", seed=3,
                              eval_split="val", cpu_logical_devices=4)
    config_sources.save_yaml(saved, run_dir.config_yaml(run))
    (tmp_path / "f.flags").write_text("--cpu_logical_devices=2\n--eval_split=test\n")
    opts = evaluate.parser().parse_args([f"--model_dir={run}", "--cpu_logical_devices=0",
                                         f"--flagfile={tmp_path / 'f.flags'}"])
    config = restore.run_config(str(run), opts)
    assert (config.seed, config.model) == (3, "small_cnn")  # the run's own
    assert config.eval_split == "test"  # the flagfile over the saved config
    assert config.cpu_logical_devices == 0  # the command line over the flagfile
    assert config.model_dir == str(run)  # where the run is now


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_flag_is_one_line_naming_it_with_close_names(name, capsys):
    code, _, err = run_main(name, REQUIRED.get(name, []) + ["--output_jsn=x"], capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: --output_jsn: unknown flag"), err


@pytest.mark.parametrize("name", ["train", "evaluate", "export", "sample", "benchmark", "audit_input"])
@pytest.mark.parametrize("flag, message", [
    ("--cpu_logical_devices=two", "error: --cpu_logical_devices: expected int, got 'two'"),
    ("--distribution_strategy=tpu", "error: --distribution_strategy: 'tpu' is not one of"),
    ("--sync_batch_norm=maybe", "error: --sync_batch_norm: expected bool, got 'maybe'"),
    ("--image_size", "error: --image_size: expected one argument"),
    ("--imag_size=3", "error: --imag_size: unknown flag"),  # never an abbreviation of --image_size
])
def test_a_bad_shared_flag_is_the_same_one_line_error_in_every_command(name, flag, message, capsys):
    code, _, err = run_main(name, REQUIRED.get(name, []) + ["--dataset=digits", flag], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith(message), err


@pytest.mark.parametrize("name", COMMANDS)
def test_help_lists_the_flags_and_exits_0(name, capsys):
    code, out, _ = run_main(name, ["--help"], capsys)
    assert code == 0 and out.startswith("usage: python -m tfgpu.") and "--flagfile" in out
    if name in SHARED_PARSERS:
        assert "--model " in out and "--data_dir " in out and "--distribution_strategy " in out
        assert "tfgpu.data flags" in out


@pytest.mark.parametrize("content, message", [
    ("--seed=1\n--flagfile=self.flags\n", "includes itself"),
    ("seed=1\n", "line 1: 'seed=1' is not a --flag=value line"),
])
def test_flagfile_errors_name_the_file(tmp_path, content, message):
    (tmp_path / "self.flags").write_text(content)
    with pytest.raises(cli.ConfigError, match=message) as e:
        cli.expand_flagfiles([f"--flagfile={tmp_path / 'self.flags'}"])
    assert e.value.flag == "flagfile" and str(tmp_path / "self.flags") in str(e.value)


# How an include line can name the same file: as written, with ./, through its directory from the side, absolute,
# and through a symlink. Every spelling must be recognised as the same file.
INCLUDE_SPELLINGS = ("plain", "dot", "via_parent", "absolute", "symlink")


def _include(tmp_path, target: str, spelling: str) -> str:
    """The text after --flagfile= that names ``tmp_path/target`` from a file in ``tmp_path``."""
    if spelling == "dot":
        return f"./{target}"
    if spelling == "via_parent":
        return f"../{tmp_path.name}/{target}"
    if spelling == "absolute":
        return str(tmp_path / target)
    if spelling == "symlink":
        link = tmp_path / f"link-to-{target}"
        if not link.is_symlink():
            link.symlink_to(tmp_path / target)
        return link.name
    return target


@pytest.mark.parametrize("spelling", INCLUDE_SPELLINGS)
def test_a_flagfile_including_itself_is_named_under_any_spelling(tmp_path, spelling):
    (tmp_path / "self.flags").write_text(f"--seed=1\n--flagfile={_include(tmp_path, 'self.flags', spelling)}\n")
    with pytest.raises(cli.ConfigError, match="self.flags includes itself") as e:
        cli.expand_flagfiles([f"--flagfile={tmp_path / 'self.flags'}"])
    assert e.value.flag == "flagfile"


@pytest.mark.parametrize("spelling", INCLUDE_SPELLINGS)
def test_an_include_cycle_through_another_file_names_the_files(tmp_path, spelling):
    (tmp_path / "a.flags").write_text("--flagfile=b.flags\n")
    (tmp_path / "b.flags").write_text(f"--flagfile={_include(tmp_path, 'a.flags', spelling)}\n")
    with pytest.raises(cli.ConfigError) as e:
        cli.expand_flagfiles([f"--flagfile={tmp_path / 'a.flags'}"])
    message = str(e.value)
    assert message.startswith(f"--flagfile: {tmp_path / 'a.flags'} includes itself through ")
    assert message.split(" through ")[1].split(" -> ")[0] == str(tmp_path / "b.flags")


def test_a_relative_flagfile_from_another_working_directory_names_its_cycle(tmp_path, monkeypatch):
    (tmp_path / "flags").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "flags" / "a.flags").write_text("--flagfile=./b.flags\n")
    (tmp_path / "flags" / "b.flags").write_text("--flagfile=../flags/a.flags\n")
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(cli.ConfigError, match=r"^--flagfile: ../flags/a.flags includes itself through "
                                              r"../flags/b.flags -> ../flags/a.flags$"):
        cli.expand_flagfiles(["--flagfile=../flags/a.flags"])


def test_a_missing_nested_flagfile_names_the_including_line(tmp_path):
    (tmp_path / "job.flags").write_text("--seed=1\n--flagfile=base.flags\n")
    with pytest.raises(cli.ConfigError, match=r"job.flags line 2: 'base.flags' does not exist"):
        cli.expand_flagfiles([f"--flagfile={tmp_path / 'job.flags'}"])


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(includes=st.lists(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(INCLUDE_SPELLINGS)),
                                             max_size=3), min_size=4, max_size=4))
def test_flagfile_includes_expand_depth_first_or_name_a_cycle(includes):
    """Four flagfiles, each with its own --seed line and includes of the others under any spelling: the
    expansion is the depth-first walk (diamonds read twice), or, when the walk from f0 meets a file already on
    its path, one ConfigError naming that file."""
    with tempfile.TemporaryDirectory() as tmp:
        import pathlib

        tmp_path = pathlib.Path(tmp)
        for index, targets in enumerate(includes):
            lines = [f"--seed={index}"] + [f"--flagfile={_include(tmp_path, f'f{t}.flags', s)}" for t, s in targets]
            (tmp_path / f"f{index}.flags").write_text("\n".join(lines) + "\n")

        def walk(index, path):
            if index in path:
                return index
            expanded = [f"--seed={index}"]
            for target, _ in includes[index]:
                found = walk(target, path + (index,))
                if isinstance(found, int):
                    return found
                expanded += found
            return expanded

        expected = walk(0, ())
        if isinstance(expected, int):
            with pytest.raises(cli.ConfigError, match=f"f{expected}.flags includes itself"):
                cli.expand_flagfiles([f"--flagfile={tmp_path / 'f0.flags'}"])
        else:
            assert cli.expand_flagfiles([f"--flagfile={tmp_path / 'f0.flags'}"]) == expected


@pytest.mark.parametrize("name", ["train", "benchmark", "plan", "evaluate"])
def test_list_recipes_shows_every_installed_recipe_in_one_line_and_exits_0(name, capsys):
    code, out, _ = run_main(name, REQUIRED.get(name, []) + ["--list_recipes"], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == len(cli.recipes()) >= 3
    assert any(line.startswith("quickstart ") and "ResNet-20" in line for line in lines)
    assert all(len(line) <= 130 for line in lines)


def test_a_recipe_is_the_shipped_flagfile_and_a_flagfile_can_start_from_one(tmp_path):
    assert cli.expand_flagfiles(["--recipe=quickstart"]) == cli.expand_flagfiles(
        [f"--flagfile={os.path.join(REPO, 'configs', 'quickstart.flags')}"])
    (tmp_path / "mine.flags").write_text("--recipe=quickstart\n--epochs=2\n")
    config = train.parse([f"--flagfile={tmp_path / 'mine.flags'}", f"--model_dir={tmp_path}", "--seed=7"])
    assert (config.epochs, config.seed, config.model, config.dataset) == (2.0, 7, "resnet20", "digits")


@pytest.mark.parametrize("argv, message", [
    (["--recipe=quickstrat"], "error: --recipe: unknown recipe 'quickstrat' (did you mean quickstart?); installed: "),
    (["--recipe"], "error: --recipe: expects a name: --recipe=NAME (--list_recipes shows them)"),
])
def test_an_unknown_recipe_is_one_line_naming_the_close_one(argv, message, capsys):
    code, _, err = run_main("train", ["--model_dir=/nonexistent/run"] + argv, capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith(message), err


def test_an_unknown_recipe_in_a_flagfile_names_the_file_and_line(tmp_path):
    (tmp_path / "job.flags").write_text("--seed=1\n--recipe=nope\n")
    with pytest.raises(cli.ConfigError, match=r"job.flags line 2: unknown recipe 'nope'"):
        cli.expand_flagfiles([f"--flagfile={tmp_path / 'job.flags'}"])


@pytest.mark.parametrize("name", COMMANDS)
def test_usage_and_errors_name_the_program_as_it_was_run(name, capsys, monkeypatch):
    script = "tfgpu-" + name.replace("_", "-")
    monkeypatch.setattr("sys.argv", [f"/venv/bin/{script}"])
    code, out, _ = run_main(name, ["--help"], capsys)
    assert code == 0 and out.startswith(f"usage: {script} ") and "python -m" not in out.split("\n\n")[0]
    code, _, err = run_main(name, REQUIRED.get(name, []) + ["--no_such_flag=1"], capsys)
    assert code == 1 and err == [f"error: --no_such_flag: unknown flag for {script}"]
    monkeypatch.setattr("sys.argv", [os.path.join(REPO, "tfgpu", f"{name}.py")])  # what python -m sets
    code, out, _ = run_main(name, ["--help"], capsys)
    assert code == 0 and out.startswith(f"usage: python -m tfgpu.{name} ")
