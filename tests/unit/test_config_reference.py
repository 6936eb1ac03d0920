"""The documentation site's configuration reference (``config_doc.reference_markdown``), generated
from the schema: every key of every section and every strategy's options appear, with the
default the schema gives, so the page cannot fall behind the code."""

from pydantic import BaseModel

from rollwise import components
from rollwise.config import Config
from rollwise.config_doc import reference_markdown


def _keys(model: type[BaseModel], path: str):
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}"
        a = field.annotation
        if isinstance(a, type) and issubclass(a, BaseModel):
            yield from _keys(a, key)
        else:
            yield key


def test_every_key_has_a_row():
    text = reference_markdown()
    keys = [k for sec, f in Config.model_fields.items() for k in _keys(f.annotation, sec)]
    assert len(keys) > 100
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert missing == []


def test_a_row_carries_type_default_and_description():
    text = reference_markdown()
    row = next(ln for ln in text.splitlines() if ln.startswith("| `run.seed` |"))
    assert row.split(" | ")[1:3] == ["`int`", "`0`"]
    assert "Seed for model init" in row
    # the nested table train.async is a section of its own, its keys rows of it
    assert "`[train.async]`" in text and "| `train.async.max_staleness` |" in text


def test_every_strategy_and_its_options_appear():
    text = reference_markdown()
    for section, reg in components._registries().items():
        for name in reg.names():
            assert f"#### `{section}` `{name}`" in text
    block = text.split("#### `filter` `zero_variance`", 1)[1].split("####", 1)[0]
    assert "| `tol` | `float` | `1e-06` |" in block
