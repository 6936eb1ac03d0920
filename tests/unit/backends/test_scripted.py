from rollwise.backends.scripted import ScriptedBackend
from rollwise.types import Sampling


def test_scripted_appends_eos_and_truncates():
    b = ScriptedBackend(lambda seq, i: [10 + i] * (i + 1), eos_id=2)
    out = b.generate([[1], [1], [1]], Sampling(1.0, 1.0, 3))
    assert out[0].token_ids == (10, 2) and out[0].finish == "stop"
    assert out[1].token_ids == (11, 11, 2)
    assert out[2].token_ids == (12, 12, 12) and out[2].finish == "length"
    assert out[0].logprobs == (-0.5, -0.5)
    assert b.state_dict() == {"calls": 3}
