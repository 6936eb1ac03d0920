"""Configuration as documentation (``rollwise config show``, ``rollwise config options``).

``annotated_toml(cfg)`` renders a resolved ``Config`` as TOML in which every key appears with its
description as a comment, keys whose value is unset (``None``: the budgets, ``run.name``, ...) as
commented lines, and every strategy's options table with the strategy's own options: the ones set
as keys, the others as commented lines with their default and description. Parsing the output
gives exactly ``to_toml(cfg)``'s data. ``options_text(section, name)`` lists one strategy's
options (``rollwise config options task jsonl``).
"""

from __future__ import annotations

import textwrap
from typing import Any

from pydantic import BaseModel

WIDTH = 110


def _value(key: str, value: Any) -> str:
    """``key = value`` on one line (arrays and tables inline), valid TOML."""
    return f"{_key(key)} = {_compact(value)}"


def _compact(v: Any) -> str:
    import tomli_w

    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_compact(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_compact(x) for x in v) + "]"
    return tomli_w.dumps({"v": v}).strip()[len("v = ") :]


def _key(k: str) -> str:
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'"{k}"'


def _comment(text: str | None, indent: str = "") -> list[str]:
    if not text:
        return []
    return [indent + "# " + ln for ln in textwrap.wrap(" ".join(text.split()), WIDTH - len(indent) - 2)]


def _strategy_options(cfg, path: str) -> tuple[type[BaseModel] | None, str]:
    """(Options model, strategy name) for a strategy section ('task', 'control', ...) or a filter
    ('filter.<name>'); (None, name) when it has none or cannot be resolved."""
    from rollwise import components

    try:
        if path.startswith("filter."):
            name = path.split(".", 1)[1]
            obj = components._registries()["filter"].get(name)
        else:
            name = getattr(cfg, path).name
            obj = components._registries()[path].get(name)
    except Exception:  # noqa: BLE001 - rendering never fails on a name the loader will report
        return None, path
    return getattr(obj, "Options", None), name


def _options_lines(model: type[BaseModel] | None, given: dict, name: str) -> list[str]:
    """Lines of an options table: given options as keys, the rest commented with their defaults."""
    if model is None:
        return [f"# {name!r} takes no options"] if not given else [_value(k, v) for k, v in given.items()]
    out = []
    for key, field in model.model_fields.items():
        if key in given:
            out += _comment(field.description)
            out.append(_value(key, given[key]))
        else:
            default = field.get_default(call_default_factory=True)
            if isinstance(default, BaseModel):
                default = default.model_dump(mode="json")
            shown = "(unset)" if default is None else _value(key, default).split(" = ", 1)[1]
            out.append(
                f"# {key} = {shown}" + (f"  -- {' '.join(field.description.split())}" if field.description else "")
            )
    extra = [k for k in given if k not in model.model_fields]
    out += [_value(k, given[k]) for k in extra]
    return out


def annotated_toml(cfg) -> str:
    """The resolved config as commented TOML (see the module docstring)."""
    data = cfg.model_dump(mode="json")
    lines: list[str] = []

    def section(model: BaseModel, values: dict, path: str, description: str | None) -> None:
        cls = type(model)
        lines.append("")
        lines.extend(_comment(description))
        lines.append(f"[{path}]")
        later: list[tuple[str, Any, Any]] = []
        for name, field in cls.model_fields.items():
            key = field.alias or name  # train.async: the field TrainConfig.async_
            value, attr = values.get(key), getattr(model, name)
            if isinstance(attr, BaseModel):
                later.append((key, field, attr))
                continue
            if key == "options" and isinstance(value, dict):
                later.append((key, field, None))
                continue
            if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
                later.append((key, field, None))  # e.g. filter.options: one table per filter
                continue
            lines.extend(_comment(field.description))
            lines.append(f"# {key} = (unset)" if value is None else _value(key, value))
        for key, field, attr in later:
            sub = f"{path}.{key}"
            if attr is not None:
                section(attr, values[key], sub, field.description)
            elif key == "options" and path == "filter":
                lines.append("")
                lines.extend(_comment(field.description))
                lines.append(f"[{sub}]")
                for fname in cfg.filter.names:
                    model_, name = _strategy_options(cfg, f"filter.{fname}")
                    present, given = fname in values[key], values[key].get(fname, {})
                    lines.append(f"[{sub}.{_key(fname)}]" if present else f"# [{sub}.{_key(fname)}]")
                    lines.extend(
                        ln if ln.startswith("#") or present else "# " + ln for ln in _options_lines(model_, given, name)
                    )
            elif key == "options":
                model_, name = _strategy_options(cfg, path)
                lines.append("")
                lines.extend(
                    _comment(f"Options of {path} {name!r} (rollwise config options {path} {name.split(':')[0]}).")
                )
                lines.append(f"[{sub}]")
                lines.extend(_options_lines(model_, values[key], name))
            else:
                lines.append("")
                lines.extend(_comment(field.description))
                lines.append(f"[{sub}]")
                lines.extend(_value(k, v) for k, v in values[key].items())

    for key, field in type(cfg).model_fields.items():
        section(getattr(cfg, key), data[key], key, field.description)
    return "\n".join(lines).lstrip("\n") + "\n"


def options_text(section: str, name: str | None = None) -> str:
    """Every option of strategy ``name`` of ``section`` with its type, default and description;
    without a name, the names ``section`` knows."""
    from rollwise import components
    from rollwise.registry import UserError

    regs = components._registries()
    if section not in regs:
        raise UserError(f"unknown section {section!r}; sections with named strategies: {', '.join(sorted(regs))}")
    reg = regs[section]
    if name is None:
        return (
            f"{section} names: {', '.join(reg.names())}\n(rollwise config options {section} NAME lists one's options)"
        )
    if ":" not in name and f"{name}:<arg>" in reg.names():  # 'jsonl', 'reasoning_gym': the options need no argument
        name = f"{name}:_"
    obj = reg.resolve(name).obj
    name = name.removesuffix(":_")
    model = getattr(obj, "Options", None)
    head = f"{section} {name!r}"
    if model is None:
        return f"{head} takes no options"
    out = [
        f"{head} options (set as "
        f"{section}.options.KEY=VALUE{'' if section != 'filter' else ' under filter.options.' + name})"
    ]
    for key, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        import typing

        a = field.annotation
        ann = (str(a) if typing.get_origin(a) is not None else getattr(a, "__name__", str(a))).replace("typing.", "")
        out.append(f"  {key} ({ann}, default {'unset' if default is None else _compact(default)})")
        out += _comment(field.description, "      ")
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    if doc:
        out.append(f"  -- {doc[0]}")
    return "\n".join(ln.replace("      # ", "      ") for ln in out)


def _type_name(annotation: Any) -> str:
    import typing

    a = annotation
    text = str(a) if typing.get_origin(a) is not None else getattr(a, "__name__", str(a))
    return text.replace("typing.", "").replace("NoneType", "None")


def _cell(text: Any) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _default_text(field) -> str:
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return "(table)"
    return "unset" if default is None else f"`{_compact(default)}`"


def _fields_table(model: type[BaseModel], path: str) -> tuple[list[str], list[tuple[str, type[BaseModel], str]]]:
    """(table lines, nested sections) of one configuration model."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    nested = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        a = field.annotation
        if isinstance(a, type) and issubclass(a, BaseModel):
            nested.append((f"{path}.{key}", a, field.description or ""))
            continue
        rows.append(
            f"| `{path}.{key}` | `{_cell(_type_name(a))}` | {_cell(_default_text(field))} | "
            f"{_cell(field.description or '')} |"
        )
    return rows, nested


def reference_markdown() -> str:
    """The configuration reference as Markdown, generated from the schema: every section's keys
    (type, default, description) and every named strategy's options. The documentation site
    renders it (``docs/hooks.py``), so the reference is never written by hand."""
    from rollwise import components
    from rollwise.config import Config

    out: list[str] = []

    def section(path: str, model: type[BaseModel], description: str) -> None:
        out.extend([f"{'#' * min(2 + path.count('.'), 4)} `[{path}]`", ""])
        if description:
            out.extend([" ".join(description.split()), ""])
        rows, nested = _fields_table(model, path)
        out.extend(rows + [""])
        for sub, sub_model, sub_desc in nested:
            section(sub, sub_model, sub_desc)

    for key, field in Config.model_fields.items():
        section(key, field.annotation, field.description or "")
    out.extend(["## Strategies and their options", ""])
    out.append(
        "Each section below chooses a strategy by `name` (filters: a list in `filter.names`) and sets its "
        "options as `SECTION.options.KEY = VALUE` (filters: `filter.options.NAME.KEY`). "
        "`rollwise config options SECTION NAME` prints the same list."
    )
    out.append("")
    regs = components._registries()
    for sec in regs:
        out.extend([f"### `{sec}`", ""])
        for name in regs[sec].names():
            resolved = name.replace("<arg>", "_")
            obj = regs[sec].resolve(resolved).obj
            doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
            out.extend([f"#### `{sec}` `{name}`", ""])
            if doc and doc[0].strip():
                out.extend([_cell(doc[0]), ""])
            model = getattr(obj, "Options", None)
            if model is None or not model.model_fields:
                out.extend(["No options.", ""])
                continue
            out.extend(["| option | type | default | description |", "|---|---|---|---|"])
            for key, f in model.model_fields.items():
                out.append(
                    f"| `{key}` | `{_cell(_type_name(f.annotation))}` | {_cell(_default_text(f))} | "
                    f"{_cell(f.description or '')} |"
                )
            out.append("")
    return "\n".join(out).rstrip() + "\n"
