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
