import pytest

from rollwise.registry import Registry, UserError


def test_register_and_resolve_lazy_string():
    r = Registry("thing")
    r.register("json_dumps", "json:dumps")
    import json

    assert r.get("json_dumps") is json.dumps


def test_duplicate_refused():
    r = Registry("thing")
    r.register("a", object())
    with pytest.raises(ValueError, match="already registered"):
        r.register("a", object())


def test_miss_lists_known_names():
    r = Registry("controller")
    r.register("uniform", object())
    r.register("dars", object())
    with pytest.raises(UserError, match=r"unknown controller 'nope'; known: dars, uniform"):
        r.get("nope")


def test_argument_entries():
    r = Registry("task")
    r.register("jsonl", object(), takes_arg=True)
    r.register("plain", object())
    assert r.resolve("jsonl:data.jsonl").arg == "data.jsonl"
    with pytest.raises(UserError, match="needs an argument"):
        r.resolve("jsonl")
    with pytest.raises(UserError, match="takes no argument"):
        r.resolve("plain:x")


def test_plugin_import_path():
    r = Registry("objective")
    import os.path

    assert r.get("os.path:join") is os.path.join
    with pytest.raises(UserError, match="cannot import module"):
        r.get("no_such_pkg.mod:fn")
