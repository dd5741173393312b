"""Tokenizers: the character-level one the tiny presets share, and loading one from a checkpoint dir.

The character tokenizer is built in code (deterministic, nothing shipped or downloaded): ids 0-2 are
`<pad>`, `<bos>`, `<eos>`, then "\\n" and the printable ASCII characters 32..126, 99 tokens in all.
Any other character is encoded as "?" (tab as a space). Encoding prepends `<bos>`, which gives the
tiny models a fixed first position to attend to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.base import AdapterError
from adapters.config_values import check_vocabulary, id_count, id_list
from adapters.files import check_closed
from adapters.engine.config import LoopConfig

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = ("\n",) + tuple(chr(c) for c in range(32, 127))
CHAR_VOCAB_SIZE = len(SPECIALS) + len(CHARS)


def char_tokenizer() -> Any:
    """The tiny presets' tokenizer as a transformers `PreTrainedTokenizerFast`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace("\t", " "), normalizers.Replace(Regex(r"[^\n -~]"), "?")]
    )
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 1)]
    )
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def load_tokenizer(directory: Path) -> Any | None:
    """The tokenizer saved in a checkpoint directory (tokenizer.json), or None when there is none.

    It is always read as a fast tokenizer from tokenizer.json (special tokens from
    tokenizer_config.json), never through `AutoTokenizer`: a folder's config or tokenizer config may
    name Python shipped in the folder (`auto_map`, as real Ouro checkpoints do), and the engine runs
    no code from a model folder.
    """
    from transformers import PreTrainedTokenizerFast

    if not (directory / "tokenizer.json").is_file():
        return None
    check_closed(directory)  # transformers opens tokenizer_config.json, special_tokens_map.json, ... there
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 (any parse failure is the user's file)
        raise AdapterError(f"cannot read tokenizer in {directory}: {exc}") from exc


def token_ids(cfg: LoopConfig, tokenizer: Any | None) -> LoopConfig:
    """The config with the bos/eos/pad ids and stop ids a model folder's tokenizer agrees with: the one home of that rule.

    Released configs can disagree with their tokenizer (Ouro's config.json and generation_config.json
    set bos/eos/pad to 0, `<|endoftext|>`, while its tokenizer's bos/eos are 1 and 2). The tokenizer
    wins: bos, eos and pad are its own where it has them. A sample stops on the tokenizer's eos plus
    generation_config.json's ids when that file names the tokenizer's eos (Qwen3 lists `<|im_end|>`
    and `<|endoftext|>`); otherwise on the tokenizer's eos plus the ids the config files claim that
    the tokenizer does not map to another special token. Every id, and the tokenizer's size, must fit the model's
    vocabulary: checked here, at load, not found as an index error mid-run.
    """
    if tokenizer is None:
        return cfg
    check_vocabulary("the folder's tokenizer", cfg.vocab_size, {}, tokens=id_count(tokenizer))
    if tokenizer.eos_token_id is None:
        return cfg
    eos = tokenizer.eos_token_id
    generation = set(id_list(cfg.extra, "generation_eos_ids", "config extra"))
    claimed = {cfg.eos_token_id, *id_list(cfg.extra, "eos_token_ids", "config extra"), *generation} - {None}
    others = set(tokenizer.all_special_ids) - {eos}
    stops = generation | {eos} if eos in generation else {eos} | (claimed - others)
    bos = cfg.bos_token_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id
    pad = cfg.pad_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    check_vocabulary(
        "the folder's tokenizer and config",
        cfg.vocab_size,
        {"bos id": bos, "eos id": eos, "pad id": pad, "stop id": stops},
    )
    return cfg.replace(
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, extra={**cfg.extra, "eos_token_ids": sorted(stops)}
    )
