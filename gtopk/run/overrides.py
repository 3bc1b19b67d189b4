"""The command line, checked before Hydra runs anything (``run.py``): Hydra creates the run
folder before the job starts, and reports its own errors over several lines with exit
status 1. Each problem here is one line naming the override and the fix (exit status 2):

* ``parse_problem``: an override Hydra's grammar cannot parse (``nodes=[``, ``x``);
* ``unknown_choice``: a config group choice (``reducer=``, ``model=``, ... any folder of
  ``conf/``) that has no file, with the choices;
* ``name_problem``: a ``name`` that is not a plain folder name (``name=../../x`` would
  write outside ``runs/``), sweeps included;
* ``composition_problem``: overrides that do not compose (a key the config lacks, a sweep
  without ``-m``), a config that does not resolve (an interpolation with nothing to
  point at), and the composed ``name`` and run folder. In a sweep (``-m``) the first job
  is composed, and one job per further choice of each swept config group.

``command_line_problem`` runs them in that order on ``run.py``'s arguments.
"""

from __future__ import annotations

import contextlib
import io
from argparse import Namespace
from pathlib import Path
from typing import Any

from gtopk.run.settings import name_problem as folder_name_problem
from gtopk.run.settings import one_line

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def hydra_arguments(argv: list[str]) -> Namespace | None:
    """``argv`` as Hydra's own argument parser reads it (None: it would refuse them, and
    say so itself)."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return get_args_parser().parse_args(argv)
    except SystemExit:
        return None


def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_problem(overrides: list[str]) -> str | None:
    """The first override Hydra's grammar cannot parse, as one line naming it."""
    parser = _parser()
    for text in overrides:
        key = text.split("=", 1)[0]
        try:
            if not any(o.key_or_group for o in parser.parse_overrides([text])):
                raise ValueError("no key before '='")
        except Exception as e:  # noqa: BLE001 - Hydra's OverrideParseException, or anything its parser raises
            detail = one_line(e).replace(f"Error parsing override '{text}' ", "")
            return (
                f"override {text!r} cannot be parsed ({detail}); write {key or 'key'}=value, quoting a value with "
                f"spaces or special characters, e.g. {key or 'key'}='a,b' (grammar: {GRAMMAR})"
            )
    return None


def unknown_choice(overrides: list[str], conf_dir: Path) -> str | None:
    """The problem with the first ``group=choice`` among command-line ``overrides``
    (sweeps included) whose choice has no ``conf_dir/group/choice.yaml``; None if all exist."""
    candidates = [o for o in overrides if "=" in o and not o.startswith("-")]
    try:
        parsed = _parser().parse_overrides(candidates)
    except Exception:  # noqa: BLE001 - malformed overrides: parse_problem reports those
        return None
    for o in parsed:
        group = o.key_or_group
        if not group or o.is_delete() or group.startswith("hydra") or not (conf_dir / group).is_dir():
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for value in values:
            if value not in choices:
                return (
                    f"{group}={value} is unknown; choose one of {', '.join(choices)} "
                    f"(the files in {conf_dir.name}/{group}/)"
                )
    return None


def name_problem(overrides: list[str]) -> str | None:
    """The first value of a ``name=`` override (each value of a sweep) that is not a plain
    folder name (``gtopk.run.settings.name_problem``)."""
    try:
        parsed = _parser().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - malformed overrides: parse_problem reports those
        return None
    for o in parsed:
        if o.key_or_group != "name" or o.is_delete():
            continue
        for value in o.sweep_iterator() if o.is_sweep_override() else [o.value()]:
            problem = folder_name_problem(value)
            if problem:
                return problem
    return None


def _jobs(overrides: list[str], conf_dir: Path, multirun: bool) -> list[list[str]]:
    """The override lists to compose: the given ones (a single run), or in a sweep the
    first job, then one per further value of each swept config group."""
    if not multirun:
        return [overrides]
    parsed = _parser().parse_overrides(overrides)
    first = [
        f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
        for o in parsed
    ]
    jobs = [first]
    for i, o in enumerate(parsed):
        group = o.key_or_group.split("@")[0]
        if o.is_sweep_override() and ((conf_dir / group).is_dir() or group.startswith("hydra/")):
            for value in list(o.sweep_string_iterator())[1:]:
                jobs.append([*first[:i], f"{o.get_key_element()}={value}", *first[i + 1 :]])
    return jobs


def _escapes(folder: str) -> bool:
    """Whether the relative path ``folder`` steps above where it starts ('..' parts)."""
    depth = 0
    for part in folder.split("/"):
        depth += -1 if part == ".." else 0 if part in ("", ".") else 1
        if depth < 0:
            return True
    return False


def _compose_one(overrides: list[str], conf_dir: Path, config_name: str, multirun: bool = False) -> str | None:
    """The problem with one job's overrides: composition, resolution, name, run folder
    (``gtopk.records.claim.folder_problem``: a folder the job may write into)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        try:
            full = compose(config_name, overrides=overrides, return_hydra_config=True)
        except Exception as e:  # noqa: BLE001 - every composition error is Hydra's multi-line report
            return f"the overrides do not compose: {one_line(e)}; check them against python run.py --cfg job"
        HydraConfig.instance().set_config(full)  # for the ${hydra:...} interpolations
        try:
            job = OmegaConf.masked_copy(full, [k for k in full.keys() if k != "hydra"])
            try:
                resolved = OmegaConf.to_container(job, resolve=True)
            except Exception as e:  # noqa: BLE001 - an interpolation with nothing to point at
                return _unresolved(job, e)
            problem = folder_name_problem(resolved.get("name"))
            if problem:
                return problem
            folder = str(OmegaConf.select(full, "hydra.job.override_dirname", default="") or "")
            if _escapes(folder):
                culprit = next((t for t in full.hydra.overrides.task if ".." in t.split("/")), folder)
                return (
                    f"{culprit} would put the run folder outside runs/<name>/: override values become part of its "
                    "path, and this one's '/..' climbs out; write the path without '..'"
                )
            return _folder_problem(full, multirun)
        finally:
            HydraConfig.instance().cfg = None
    return None


def _folder_problem(full: Any, multirun: bool) -> str | None:
    """Whether the job may write its run folder (and a sweep its sweep folder) where the
    composed Hydra config puts it."""
    from omegaconf import OmegaConf

    from gtopk.records.claim import folder_problem

    try:
        if not multirun:
            return folder_problem("hydra.run.dir", str(OmegaConf.select(full, "hydra.run.dir")))
        sweep = str(OmegaConf.select(full, "hydra.sweep.dir"))
        sub = str(OmegaConf.select(full, "hydra.sweep.subdir"))
        return folder_problem("hydra.sweep.dir", sweep, sweep=True) or folder_problem(
            "hydra.sweep.dir", str(Path(sweep) / sub)
        )
    except Exception as e:  # noqa: BLE001 - a folder setting that does not resolve
        return f"the run folder does not resolve: {one_line(e)}; check hydra.run.dir / hydra.sweep.dir"


def _unresolved(job: Any, error: Exception) -> str:
    """The message for a config that does not resolve: the setting check's where one
    explains it (``mode=foo`` leaves ``${model.grad_accum.${mode}}`` nothing to point at)."""
    from gtopk.run.checks import ConfigError, validate

    try:
        validate(job)
    except ConfigError as e:
        return str(e)
    except Exception:  # noqa: BLE001 - the checks trip over the same interpolation
        pass
    return f"the config does not resolve: {one_line(error)}; fix the setting it names"


def composition_problem(
    overrides: list[str], conf_dir: Path, config_name: str = "config", multirun: bool = False
) -> str | None:
    """The first problem composing the job(s) of ``overrides`` (see the module docstring)."""
    try:
        jobs = _jobs(overrides, conf_dir, multirun)
    except Exception:  # noqa: BLE001 - malformed overrides: parse_problem reports those
        return None
    for job in jobs:
        problem = _compose_one(job, conf_dir, config_name, multirun)
        if problem:
            return problem
    return None


def early_problem(overrides: list[str], conf_dir: Path) -> str | None:
    """The checks that need no composition: parsing, group choices, ``name``."""
    return parse_problem(overrides) or unknown_choice(overrides, conf_dir) or name_problem(overrides)


#: the launcher's variables a job reads (torchrun's, SLURM's launcher sets the same), and their least value
LAUNCH_VARS = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "MASTER_PORT": 1}


def environment_problem(environ: dict | None = None) -> str | None:
    """A launcher variable set to what is not a whole number in range (one line naming it)."""
    import os

    env = os.environ if environ is None else environ
    for name, least in LAUNCH_VARS.items():
        if name not in env:
            continue
        text = env[name].strip()
        most = 65535 if name == "MASTER_PORT" else None
        if not text.isdigit() or int(text) < least or (most is not None and int(text) > most):
            bound = f"{least}-{most}" if most else f">= {least}"
            return (
                f"the environment variable {name}={env[name]!r} must be a whole number {bound}: it is torchrun's "
                f"(or your launcher's); unset it, or start the job with torchrun, which sets it"
            )
    return None


def command_line_problem(argv: list[str], conf_dir: Path) -> str | None:
    """The first problem with ``run.py``'s arguments ``argv`` (None: Hydra may run them).
    Help, info and shell completion are Hydra's; with another config folder
    (``--config-dir``/``--config-path``) only the overrides are parsed."""
    args = hydra_arguments(argv)
    if args is None or args.help or args.hydra_help or args.info or args.shell_completion or args.experimental_rerun:
        return None
    overrides = list(args.overrides)
    problem = environment_problem() or early_problem(overrides, conf_dir)
    if problem or args.config_path or args.config_dir:
        return problem
    return composition_problem(overrides, conf_dir, args.config_name or "config", args.multirun)
