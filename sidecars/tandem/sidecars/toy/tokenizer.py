"""A small byte-level BPE tokenizer trained locally with `tokenizers`, saved as a HF tokenizer.

Role: the demo model's tokenizer (no downloads exist here). Callers: `toy.build`.

Design: byte-level BPE (every string encodes; decoding is exact), digits split one per token
before BPE (so numbers are digit sequences, as in Qwen2), `<answer>`/`</answer>` as single added
tokens, specials `<pad>` (id 0), `<bos>` (1), `<eos>` (2); a post-processor prepends `<bos>` when
special tokens are added (HF and vLLM encode prompts the same way). The vocabulary is padded with
`<|reserved_i|>` special tokens to exactly `vocab_size` so that every id the model can emit
decodes. Saved with tokenizer.json + tokenizer_config.json (class PreTrainedTokenizerFast),
loadable by `transformers.AutoTokenizer` and by vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
ANSWER_TAGS = ("<answer>", "</answer>")


def train_tokenizer(texts: Sequence[str], vocab_size: int = 384) -> Tokenizer:
    """Train the byte-level BPE on `texts`; the result has exactly `vocab_size` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ANSWER_TAGS), special_tokens=[PAD, BOS, EOS],
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
                                 model_max_length=model_max_length, padding_side="left",
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(str(out_dir))
    return hf
