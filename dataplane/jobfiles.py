"""Job files (TOML or YAML, by extension) and ``--set key=value`` overrides: the raw settings a person wrote,
before :func:`dataplane.jobs.parse_job_spec` checks them. And the way back: a job's resolved spec as TOML or
YAML, so a finished job's exact settings can be downloaded, edited and submitted again.

One schema (``JobSpec``) for every way in; this module only turns text into a mapping and back.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from .dataset.content import DatasetError
from .dataset.jobfile import resolve_data_path
from .usercode import CodeError, resolve_code_modules

TOML_SUFFIXES = (".toml",)
YAML_SUFFIXES = (".yaml", ".yml")
_KEY = re.compile(r"[A-Za-z0-9_-]+")


class JobFileError(ValueError):
    """A job file or an override that cannot be read; ``str(err)`` names the file (or the override) and why."""


def read_job_text(text: str, *, kind: str, name: str = "job file") -> dict[str, Any]:
    """The mapping in ``text``, read as ``kind`` ("toml" or "yaml"); ``name`` says where it came from."""
    try:
        if kind == "toml":
            data = tomllib.loads(text)
        elif kind == "yaml":
            import yaml  # only job files need it; it comes with transformers on the agent, PyYAML on the site

            data = yaml.safe_load(text)
        else:
            raise JobFileError(f"{name}: unknown kind {kind!r}: a job file is .toml, .yaml or .yml")
    except JobFileError:
        raise
    except Exception as err:  # tomllib.TOMLDecodeError, yaml.YAMLError: both say where in the text
        raise JobFileError(f"{name}: not valid {kind.upper()}: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise JobFileError(f"{name}: must be a mapping of job settings (key = value), not {type(data).__name__}")
    return data


def file_kind(name: str) -> str:
    """'toml' or 'yaml' by the file name's extension; JobFileError for any other."""
    suffix = Path(name).suffix.lower()
    if suffix in TOML_SUFFIXES:
        return "toml"
    if suffix in YAML_SUFFIXES:
        return "yaml"
    raise JobFileError(f"{name}: a job file is .toml, .yaml or .yml (the extension says which)")


def load_job_file(path: Path | str) -> dict[str, Any]:
    """The settings in the TOML or YAML job file at ``path``; a data set it names by path (``task.data.path``,
    relative to the file) becomes its digest (:mod:`dataplane.dataset.jobfile`), the modules it ships to the
    workers (``task.code_modules``) their code package's (:mod:`dataplane.usercode`)."""
    kind = file_kind(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise JobFileError(f"{path}: cannot read: {err}") from None
    raw = read_job_text(text, kind=kind, name=str(path))
    try:  # a data set named by its path (task.data.path) becomes its digest, the files this machine's copy
        raw = resolve_data_path(raw, base=Path(path).parent)
        # the modules the workers import (task.code_modules), found as the learner imports them (from the working
        # directory first), become the digest of their code package (dataplane/usercode.py)
        return resolve_code_modules(raw, roots=[Path.cwd(), Path(path).parent.resolve()])
    except (DatasetError, CodeError) as err:
        raise JobFileError(f"{path}: {err}") from None


def parse_value(text: str) -> Any:
    """An override's value: a TOML value (``0.05``, ``true``, ``"x"``, ``[1, 2]``, ``{name = "math"}``), else
    JSON (``null``, ``{"name": "math"}``), else the text itself as a string (``task.name=math``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"loss.kl_beta=0.05"`` -> (["loss", "kl_beta"], 0.05)."""
    key, sep, value = item.partition("=")
    path = key.strip().split(".")
    if not sep or not all(_KEY.fullmatch(part) for part in path):
        raise JobFileError(f"--set {item}: expected KEY=VALUE, a dotted key such as loss.kl_beta=0.05")
    return path, parse_value(value.strip())


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every ``KEY=VALUE`` set, in order (a dotted key reaches into tables)."""
    out = json.loads(json.dumps(raw))  # a deep copy of plain data
    for item in overrides:
        path, value = parse_override(item)
        table = out
        for i, part in enumerate(path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise JobFileError(f"--set {item}: {'.'.join(path[:i + 1])} is not a table")
        table[path[-1]] = value
    return out


def dump_yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def dump_toml(data: dict[str, Any]) -> str:
    """``data`` as TOML: plain keys first, then one ``[table]`` per mapping. TOML has no null, so a key whose
    value is None is written as a comment (leaving it out means the field's default)."""
    return "\n".join(_toml_table(data, prefix=[])).rstrip() + "\n"


def _toml_table(data: dict[str, Any], *, prefix: list[str]) -> list[str]:
    lines = [f"[{'.'.join(map(_toml_key, prefix))}]"] if prefix else []
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if value is None:
            lines.append(f"# {_toml_key(key)} = null  (TOML has no null: --set {'.'.join([*prefix, key])}=null)")
        elif key not in tables:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += ["", *_toml_table(table, prefix=[*prefix, key])]
    return lines


def _toml_key(key: str) -> str:
    return key if _KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
