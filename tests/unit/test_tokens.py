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
