"""The warm start says what it costs and how far it is; a run that cannot score is warned about
before it trains (max_new_tokens shorter than the references; tasks the tiny model cannot learn)."""

from __future__ import annotations

from rollwise.tokens import Codec
from rollwise.trainer import tiny
from rollwise.trainer.warm_start import Progress, fit_warnings, format_seconds
from rollwise.types import Prompt


def _codec():
    _, tok = tiny.build_tiny("tiny-s")
    return Codec(tok, use_chat=False)


class _Task:
    def __init__(self, questions, targets, sft=True):
        self.prompts = tuple(
            Prompt(id=str(i), task="t", text=q, answer=a) for i, (q, a) in enumerate(zip(questions, targets))
        )
        self.sft = sft

    def train_prompts(self):
        return self.prompts

    def sft_examples(self, n, seed):
        if not self.sft:
            raise NotImplementedError
        return [(p, p.answer) for p in self.prompts[:n]]


def test_short_references_give_no_warning():
    # "12" is 2 characters + end-of-text = 3 tokens <= 8
    assert (
        fit_warnings(_Task(["7+5="], ["12"]), _codec(), max_new_tokens=8, context=512, builtin=True, episodes=False)
        == []
    )


def test_max_new_tokens_shorter_than_the_references_is_named():
    # "<answer>15</answer>" is 19 characters + end-of-text = 20 tokens > 8
    [w] = fit_warnings(_Task(["7+8="], ["<answer>15</answer>"]), _codec(), max_new_tokens=8, episodes=False)
    assert "sampling.max_new_tokens = 8" in w and "median 20 tokens" in w and "sampling.max_new_tokens=20" in w


def test_answers_are_used_when_the_task_has_no_warm_start_targets():
    [w] = fit_warnings(_Task(["q"], ["123456789"], sft=False), _codec(), max_new_tokens=4, episodes=False)
    assert "reference answers" in w and "median 10 tokens" in w  # 9 digits + end-of-text


def test_tiny_model_lacking_characters_is_told_at_start():
    # only the prompt has it: read as the unknown token, said so (a newline of a board would be harmless)
    ws = fit_warnings(
        _Task(["Combien font 2×3 ?"], ["6"]), _codec(), max_new_tokens=8, context=512, builtin=True, episodes=False
    )
    assert len(ws) == 1 and "of this task's prompts ('×')" in ws[0] and "one unknown token" in ws[0]
    # the answers need it: the model cannot write them
    ws = fit_warnings(
        _Task(["2 times 3"], ["6×1"]), _codec(), max_new_tokens=8, context=512, builtin=True, episodes=False
    )
    assert len(ws) == 1 and "cannot learn this task's format" in ws[0] and "('×')" in ws[0]


def test_prompts_longer_than_the_tiny_context_are_told_at_start():
    # a 600-character question: 1 bos + 600 tokens + 8 new tokens > 512
    ws = fit_warnings(_Task(["x" * 600], ["1"]), _codec(), max_new_tokens=8, context=512, builtin=True, episodes=False)
    assert len(ws) == 1 and "up to 601 tokens" in ws[0] and "context of 512" in ws[0]


def test_progress_reports_step_loss_and_time_left():
    lines = []
    p = Progress(100, lines.append, every_s=1e9)
    for step in range(1, 101):
        p(step, 1.0 / step)
    # step 10 (first estimate) and every tenth of 100 steps: 10, 20, ..., 100
    assert [ln.split(",")[0] for ln in lines] == [f"warm start: step {s}/100" for s in range(10, 101, 10)]
    assert "loss 0.100" in lines[0] and "left" in lines[0] and "took" in lines[-1]


def test_format_seconds():
    assert format_seconds(5.2) == "5 s" and format_seconds(62.4) == "1 min 2 s"
