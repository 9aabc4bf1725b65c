"""A small byte-level BPE tokenizer trained locally with `tokenizers`, saved as a HF tokenizer.

Role: the demo model's tokenizer (no downloads exist here). Callers: `toy.build`.

Design: byte-level BPE (every string encodes; decoding is exact) with exactly Qwen2's normalizer
(NFC) and pre-tokenizer (its split regex, one digit per token, then byte-level): transformers
loads a tokenizer next to a `model_type: qwen2` config as `Qwen2Tokenizer`, which rebuilds that
pipeline around our vocabulary and merges — so HF, vLLM and the trainer tokenize alike whichever
class loads it. `<answer>`/`</answer>` are single added tokens; specials `<pad>` (id 0), `<bos>`
(1), `<eos>` (2), `<unk>` (3, never produced by byte-level BPE; declared so Qwen2Tokenizer does
not add its own); a post-processor prepends `<bos>` when special tokens are added. The vocabulary
is padded with `<|reserved_i|>` special tokens to exactly `vocab_size` so that every id the model can emit
decodes. Saved with tokenizer.json + tokenizer_config.json (class PreTrainedTokenizerFast),
loadable by `transformers.AutoTokenizer` and by vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
ANSWER_TAGS = ("<answer>", "</answer>")
# Qwen2's pre-tokenizer split (letters with one leading non-letter, single digits, punctuation runs).
SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_tokenizer(texts: Sequence[str], vocab_size: int = 384) -> Tokenizer:
    """Train the byte-level BPE on `texts`; the result has exactly `vocab_size` tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ANSWER_TAGS), special_tokens=[PAD, BOS, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(list(ANSWER_TAGS))
    missing = vocab_size - tok.get_vocab_size()
    if missing < 0:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the byte alphabet plus specials")
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tok


def save_hf_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> Any:
    """Save as a HF fast tokenizer in `out_dir`; returns the `PreTrainedTokenizerFast`."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                 unk_token=UNK, model_max_length=model_max_length, padding_side="left",
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(str(out_dir))
    return hf
