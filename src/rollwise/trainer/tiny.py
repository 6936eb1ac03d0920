"""The built-in tiny model: a small Llama-architecture network with a character-level
Hugging Face tokenizer (printable ASCII), made from config so CI and laptops need no download.

``build_tiny(preset, seed)`` returns a randomly initialised ``LlamaForCausalLM`` and its
tokenizer; ``warm_start`` (in ``trainer/warm_start.py``) gives it a short supervised phase on
task examples so GRPO has mixed-reward groups from step 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = tuple(chr(i) for i in range(32, 127))


@dataclass(frozen=True)
class TinyPreset:
    hidden: int
    layers: int
    heads: int
    ffn: int


PRESETS = {
    "tiny-s": TinyPreset(hidden=128, layers=2, heads=4, ffn=512),
    "tiny-m": TinyPreset(hidden=256, layers=4, heads=4, ffn=1024),
    "tiny-l": TinyPreset(hidden=384, layers=6, heads=6, ffn=1536),
}
ALIASES = {"tiny": "tiny-s"}  # the embedded default: learns 2-digit +/- in ~1 min of CPU
NAMES = tuple(sorted(PRESETS)) + tuple(ALIASES)


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def char_tokenizer():
    """A character-level fast tokenizer: 4 specials + 95 printable ASCII characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def build_tiny(name: str, seed: int = 0):
    """Randomly initialised tiny Llama (fp32) and its character tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    p = PRESETS[canonical(name)]
    tok = char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=p.hidden,
        intermediate_size=p.ffn,
        num_hidden_layers=p.layers,
        num_attention_heads=p.heads,
        num_key_value_heads=p.heads,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model, tok
