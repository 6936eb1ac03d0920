"""UI-S1's semi-online replay (issue #44 item 4; rollwise.envs.semi_online) with scripted calculator
episodes in the episode pool: matching actions follow the expert, a mismatch within the budget is
patched, an exhausted budget ends the episode, evaluation runs the real environment; refusals."""

import pytest

from calc_episodes import PROMPT, TASK, play, scripted, turn_texts
from rollwise.config import load_config
from rollwise.envs import python_math
from rollwise.envs.semi_online import same_action
from rollwise.registry import UserError
from rollwise.sections.task import SemiOnlineConfig


def run(turns, budget=1, charge=True, costs=None):
    r, cost = play(scripted(turns), charge, semi_online=SemiOnlineConfig(enabled=True, patch_budget=budget))
    if costs is not None:
        costs.append(cost)
    return r


def shown(r):
    """(action, observation, reward, patched) of each turn."""
    return [(a, o, t.reward, t.patched) for (a, o), t in zip(turn_texts(r), r.episode.turns)]


def test_the_expert_trajectory_is_the_demonstration():
    assert TASK.demonstration(PROMPT) == (("<calc>12+3</calc>", "<out>15</out>", "tool"), ("15", "", "user"))


def test_matching_actions_follow_the_expert():
    r = run(["<calc>12+3</calc>", "15"])
    assert shown(r) == [("<calc>12+3</calc>", "<out>15</out>", 1.0, False), ("15", "", 1.0, False)]
    assert r.reward == 1.0 and r.episode.end == "done"
    assert [c.outcome for c in r.episode.tool_calls] == ["replayed"]  # no tool ran


def test_a_mismatch_within_the_budget_is_patched_with_the_expert_action():
    costs = []
    r = run(["<calc>12+4</calc>", "15"], costs=costs)  # the real tool would answer <out>16</out>
    assert shown(r) == [
        ("<calc>12+4</calc>", "<calc>12+3</calc><out>15</out>", 0.0, True),
        ("15", "", 1.0, False),
    ]
    assert r.reward == 1.0 and costs[0].metrics["episodes/patched"] == 1
    assert costs[0].metrics["episodes/tool_replayed"] == 1
    r = run(["<calc>12+3</calc>", "16"])  # a wrong answer at the expert's last turn: patched, judged by the task
    assert shown(r)[-1] == ("16", "", 0.0, True) and r.reward == 0.0 and r.episode.end == "done"


def test_an_exhausted_budget_ends_the_episode_with_score_0():
    r = run(["<calc>12+4</calc>", "16"], budget=1)  # patch, then a second mismatch
    assert [t[3] for t in shown(r)] == [True, False] and len(r.episode.turns) == 2
    assert r.verdict.score == 0.0 and r.verdict.reason == "semi_online_budget"
    r = run(["<calc>12+4</calc>"], budget=0)
    assert len(r.episode.turns) == 1 and r.verdict.reason == "semi_online_budget"


def test_evaluation_runs_the_tasks_own_environment():
    r = run(["<calc>12+4</calc>", "16"], charge=False)
    assert shown(r) == [("<calc>12+4</calc>", "<out>16</out>", 0.0, False), ("16", "", 0.0, False)]
    assert [c.outcome for c in r.episode.tool_calls] == ["ok"]


def test_same_action_collapses_whitespace_only():
    assert same_action("<calc>1+2</calc>\n", " <calc>1+2</calc>")
    assert not same_action("<calc>1+2</calc>", "<calc>1 +2</calc>")


def test_python_math_demonstrations_are_its_episode_examples():
    t = python_math.make(None, {"n_train": 6, "n_heldout": 2})
    for p, steps in t.episode_examples(3, seed=0):
        assert steps == t.demonstration(p) and steps[-1] == (p.answer, "", "user")


def test_semi_online_is_refused_on_tasks_without_demonstrations(tmp_path):
    import rollwise

    with pytest.raises(UserError, match=r"task\.semi_online\.enabled .* task\.name = 'guess_number' has no demonstr"):
        load_config(None, ["task.name=guess_number", "task.semi_online.enabled=true"])
    cfg = load_config(None, [f"run.dir={tmp_path}", "run.name=t", "task.semi_online.enabled=true", "train.steps=1"])
    with pytest.raises(UserError, match=r"task\.semi_online applies to environment tasks"):
        rollwise.train(cfg, log=lambda m: None)
    assert not (tmp_path / "t").exists()
    assert (
        load_config(None, ["task.name=python_math", "task.semi_online.enabled=true"]).task.semi_online.patch_budget == 1
    )
