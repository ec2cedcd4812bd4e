"""Reading a config: YAML files (duplicate keys refused), `--section.key=value` arguments, and coercing each
value to its field's type. Generic over the config dataclass, so this file
knows no section or key."""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from errors import UserError, clipped, short_error
from fileio import check_path_value, path_kind, read_user_file
from settings import path_fields


def section_keys(cfg: Any) -> dict[str, list[str]]:
    return {s.name: [f.name for f in dataclasses.fields(getattr(cfg, s.name))] for s in dataclasses.fields(cfg)}


def parse_argv(argv: list[str], sections: dict[str, list[str]]) -> tuple[str | None, list[tuple[str, str]]]:
    """(the --config value, [(section.key, value), ...]) from the command line."""
    config_name = None
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise UserError(f"unexpected argument {arg!r}; options look like --config small or --train.lr=3e-4")
        key, eq, value = arg[2:].partition("=")
        if key != "config" and "." not in key:  # unknown, whether a value follows or not (not "has no value")
            raise UserError(f"unknown option --{key}; {_suggest_option(key, sections)}")
        if not eq:  # "--key value"
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError(f"option --{key} has no value; write --{key}=VALUE")
            value = argv[i + 1]
            i += 1
        i += 1
        if key == "config":
            config_name = value
        else:
            overrides.append((key, value))
    return config_name, overrides


FLAGS = ("config", "print-config", "help")  # the options that are no section.key


def _suggest_option(key: str, sections: dict[str, list[str]]) -> str:
    owners = [s for s, keys in sections.items() if key in keys]
    if owners:
        return f"did you mean --{owners[0]}.{key}=...? overrides are written --section.key=value"
    flag = next((f for f in FLAGS if f.replace("-", "") == key.replace("_", "").replace("-", "").lower()), None)
    if flag:
        return f"did you mean --{flag}?"
    return f"overrides are written --section.key=value with sections {', '.join(sections)}; see --help"


def nest(dotted: str, value: Any) -> dict[str, Any]:
    section, _, key = dotted.partition(".")
    if not section or not key or "." in key:
        raise UserError(f"bad option --{dotted}; overrides are written --section.key=value, e.g. --train.lr=3e-4")
    return {section: {key: value}}


def find_config_file(name: str, config_dir: Path) -> Path:
    """A path to a YAML file, or a name in configs/ with or without .yaml."""
    candidates = [check_path_value(name, "--config")]  # NUL, a name over 255 bytes, not UTF-8: one line
    if not name.endswith((".yaml", ".yml")):
        candidates.append(Path(name + ".yaml").expanduser())
    candidates += [config_dir / c.name for c in list(candidates) if c.parent == Path(".")]
    for c in candidates:
        if c.is_file():
            return c
    for c in candidates:  # there, but not a file: say what it is (a FIFO, a device, a symlink loop...)
        if os.path.lexists(c):
            raise UserError(f"config {str(c)!r} is {path_kind(c)}, not a YAML file; pass a YAML file's path")
    shipped = ", ".join(sorted(p.stem for p in config_dir.glob("*.yaml"))) or "none"
    raise UserError(f"config {name!r} not found as a file or in configs/; pass a YAML path or one of: {shipped}")


MAX_CONFIG_BYTES = 2**20  # a config is a few hundred bytes; a bigger file is not one
MAX_YAML_DEPTH = 32  # sections of key: value need 2 or 3 levels


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that:
    - a key written twice in one mapping is an error (PyYAML keeps the last one silently, so a config
      could say two things and mean one);
    - aliases (`*name`) are refused: a config has no use for them, and nested aliases expand
      exponentially (a "billion laughs" file of a few hundred bytes fills the memory);
    - nesting deeper than MAX_YAML_DEPTH is refused (PyYAML recurses once per level);
    - an integer too long for Python's int() (over 4300 digits) is a one-line error, not a ValueError;
    - so is a tagged value its constructor can't build (`!!float abc`, `!!timestamp 2001-13-45`), a
      key that is a sequence, a mapping or a set (`? [a, b]`: unhashable), and a string holding a lone
      surrogate (`"\\ud800"`, which no encoder takes);
    - a number YAML 1.1 reads in base 60 (`1:20`) or octal (`012`) is a one-line error (80 and 10, unsaid)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise UserError(f"{self.name}: line {mark.line + 1} uses a YAML alias (*{self.peek_event().anchor}); "
                            "configs do not expand aliases: write the value out")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise UserError(f"{self.name}: values nested more than {MAX_YAML_DEPTH} deep (line {mark.line + 1}); "
                                "a config is sections of key: value")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node):
        self._no_yaml11_surprise(node, super().construct_yaml_int)
        try:
            value = super().construct_yaml_int(node)
            if value.bit_length() <= 14_000:  # a 0x... of more bits has over 4300 digits: not even printable
                return value
        except ValueError:
            if len(node.value) <= 4300:  # not a number at all: `!!int abc`
                raise
        raise UserError(f"{self.name}: the number at line {node.start_mark.line + 1} has {len(node.value)} "
                        "characters, too many for an integer; write a sensible value") from None

    def construct_yaml_float(self, node):
        self._no_yaml11_surprise(node, super().construct_yaml_float)  # (`!!float 012` is 12.0: no octal float)
        return super().construct_yaml_float(node)

    def _no_yaml11_surprise(self, node, read):
        """YAML 1.1 (PyYAML's) reads `1:20` as base 60 (80) and `012` as octal (10): a time, a clock-like value or
        a zero-padded count would become another number without a word."""
        digits = node.value.lstrip("+-").replace("_", "")
        octal = (read == super().construct_yaml_int and len(digits) > 1 and digits[0] == "0" and digits.isdigit()
                 and int(digits, 8) != int(digits))  # (07 is 7 either way)
        if ":" in digits or octal:
            value = read(node)  # what YAML would have read
            raise UserError(f"{self.name}: {clipped(node.value)} at line {node.start_mark.line + 1} is read by YAML as "
                            f"a number in {'base 60' if ':' in digits else 'octal'} ({clipped(value)}); write the number "
                            "in decimal, or quote it if it is text")

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as e:  # a constructor's own error: a traceback otherwise
            tag = node.tag.rsplit(":", 1)[-1]
            raise UserError(f"{self.name}: the value at line {node.start_mark.line + 1} is not a valid !!{tag} "
                            f"({short_error(e, 80)}); write a plain value") from None

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, collections.abc.Hashable):  # `? [a, b]`: PyYAML would raise TypeError
                raise UserError(f"{self.name}: the key at line {key_node.start_mark.line + 1} is a "
                                f"{type(key).__name__}; keys are names (sections and settings)")
            if key in seen:
                raise UserError(f"{self.name}: {key!r} appears twice (line {key_node.start_mark.line + 1}); "
                                "keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_str(self, node):
        value = super().construct_yaml_str(node)
        if not utf8(value):  # "\ud800": an escape YAML allows, a string that can't be printed, written or encoded
            raise UserError(f"{self.name}: the string at line {node.start_mark.line + 1} holds a lone surrogate "
                            "(an escape such as \\ud800); write the character itself")
        return value


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _UniqueKeyLoader.construct_yaml_float)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:str", _UniqueKeyLoader.construct_yaml_str)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = read_user_file(path, "config", fix="check --config", limit=MAX_CONFIG_BYTES).decode("utf-8")
        loader = _UniqueKeyLoader(text)
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise UserError(f"config {path} is not valid YAML{at}; fix the syntax (sections of key: value)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config {path} ({e.__class__.__name__}); check the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must be a mapping of sections (model:, data:, train:, wandb:); got {type(data).__name__}")
    return data



# ------------------------------------------------------------------------------------ typed overrides

def apply_overrides(cfg: Any, d: dict[str, Any], *, source: str) -> None:
    """Set cfg.<section>.<key> = value for each entry of a nested dict, coercing to the field's type."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(d).__name__}")
    sections = section_keys(cfg)
    for section, values in d.items():
        if section not in sections:
            raise UserError(f"{source}: unknown section {_short(section)}; valid sections: {', '.join(sections)}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise UserError(f"{source}: section {_short(section)} must be a mapping of key: value, got {_short(values)}")
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        paths = {f.name for f in path_fields(obj)}
        for key, value in values.items():
            if key not in sections[section]:
                close = difflib.get_close_matches(str(key), sections[section], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UserError(f"{source}: unknown key {section}.{str(key)[:80]}{hint}; valid keys: {', '.join(sections[section])}")
            value = coerce(value, hints[key], f"{section}.{key}", source)
            if key in paths and isinstance(value, str):  # ~ as the gate checks it: the run writes there, not into ./~
                value = os.path.expanduser(value)
            setattr(obj, key, value)


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def coerce(value: Any, typ: Any, name: str, source: str = "config") -> Any:
    """Convert a YAML value or a CLI string to `typ` (bool, int, float, str, X | None, list[X], or int | str:
    an integer where the value reads as one, else the string, which the field's check then judges)."""
    args = typing.get_args(typ)
    union = typing.get_origin(typ) in (typing.Union, types.UnionType)
    if union and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            return None
        typ = next(a for a in args if a is not type(None))
    where = f"{source}: {name}"
    if union and set(args) == {int, str}:
        try:
            return coerce(value, int, name, source)
        except UserError:
            if isinstance(value, str):
                return value.strip()
            raise UserError(f"{where} expects an int or a string, got {_short(value)}") from None
    if typing.get_origin(typ) is list:
        return _coerce_list(value, typing.get_args(typ)[0], name, source)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise UserError(f"{where} expects a bool (true/false), got {_short(value)}")
    if typ is int:
        n = _int_or_none(value)
        if n is None:
            raise UserError(f"{where} expects an int, got {_short(value)}")
        return n  # (settings.check_fields bounds it to 64 bits)
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            f = float(value) if not isinstance(value, int) or value.bit_length() <= 1024 else math.inf  # (OverflowError)
        elif isinstance(value, str):
            try:
                f = float(value.strip())
            except ValueError:
                raise UserError(f"{where} expects a float (e.g. 3e-4), got {_short(value)}") from None
        else:
            raise UserError(f"{where} expects a float (e.g. 3e-4), got {_short(value)}")
        if not math.isfinite(f):
            raise UserError(f"{where} expects a finite float, got {_short(value)}")
        return f
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # a YAML `run_name: 42`
        raise UserError(f"{where} expects a string, got {_short(value)}{_yaml_bool_hint(value, name)}")
    raise TypeError(f"config field {name} has unsupported type {typ!r}")  # a bug in this file, not user input


def _int_or_none(value: Any) -> int | None:
    """An int from an int, an integral float or a string that reads as either (e.g. 5e3); else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f.is_integer():
                return int(f)
    return None


def _coerce_list(value: Any, item: Any, name: str, source: str) -> list:
    """A list[item] from a YAML list, or from a string: a YAML flow list (`["ROMEO:", "JULIET:"]`, how the
    command line writes one) when it starts with "[" and holds a quote or a comma (so a prompt such as
    "[Enter ROMEO]" stays one string), "" or "[]" the empty list (the default), else a list of that one string.
    Items are coerced one by one, except that a list of strings takes only strings: a YAML `- 42` is
    refused, not guessed."""
    where = f"{source}: {name}"
    if isinstance(value, str) and (not value.strip() or value.strip() == "[]"):  # "" or [] (json.dumps of []): empty
        value = []
    elif isinstance(value, str) and value.strip().startswith("[") and any(c in value for c in "\"',"):
        loader = _UniqueKeyLoader(value)
        loader.name = where
        try:
            value = loader.get_single_data()
        except yaml.YAMLError:
            raise UserError(f"{where} is not a valid YAML list; write it like [\"a\", \"b\"]") from None
        finally:
            loader.dispose()
    elif isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise UserError(f"{where} expects a list of {item.__name__}s, got {_short(value)}")
    out = []
    for i, v in enumerate(value):
        if item is str and not isinstance(v, str):
            raise UserError(f"{where}: item {i + 1} expects a string, got {_short(v)}"
                            + (_yaml_bool_hint(v, name) or "; quote it"))
        out.append(coerce(v, item, f"{name} item {i + 1}", source))
    return out


def _yaml_bool_hint(value: Any, name: str) -> str:
    """Why a string key got a bool: YAML 1.1 reads an unquoted yes/no/on/off/true/false (any of its cases)
    as one, so `mode: off` arrives as False, which 'expects a string, got False' alone does not explain."""
    if not isinstance(value, bool):
        return ""
    word = "on" if value else "off"
    return (f" (YAML reads an unquoted yes, no, on, off, true or false as a boolean); quote the word, e.g. "
            f'{name.rpartition(".")[2].split(" ")[0]}: "{word}"')


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
