"""``trained`` (tests/conftest.py, issue #41 item 5): a whole training shared by the tests that only
read its results runs once per distinct configuration in a session, wherever the test would have
written it, and a test that writes into a run gets a copy of its own."""

import json

from conftest import tiny_overrides


def _small(tmp_path, **extra):
    small = {"model.warm_start.steps": 2, "eval.at_start": False, "eval.n_prompts": 2, "eval.k": [1], "eval.samples": 1}
    return tiny_overrides(tmp_path, steps=1, **{**small, **extra})


def test_one_configuration_is_trained_once_and_shared(tmp_path, trained):
    first = trained(_small(tmp_path / "a", **{"run.name": "a"}))
    written = (first / "metrics.jsonl").stat().st_mtime_ns
    again = trained(_small(tmp_path / "b", **{"run.name": "b"}))  # another place, the same configuration
    assert again == first and (first / "metrics.jsonl").stat().st_mtime_ns == written  # not trained again
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    other = trained(_small(tmp_path, **{"train.steps": 2}))  # another configuration: a run of its own
    assert other != first
    assert [json.loads(x)["step"] for x in (other / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert [json.loads(x)["step"] for x in (first / "metrics.jsonl").read_text().splitlines()] == [0]


def test_a_copy_is_the_tests_own(tmp_path, trained):
    shared = trained(_small(tmp_path))
    mine = trained(_small(tmp_path), copy_to=tmp_path / "mine")
    assert mine == tmp_path / "mine" and mine != shared
    assert (mine / "metrics.jsonl").read_text() == (shared / "metrics.jsonl").read_text()
    (mine / "metrics.jsonl").write_text("")  # what the test writes into its copy
    assert (shared / "metrics.jsonl").read_text()  # leaves the shared run as it was
