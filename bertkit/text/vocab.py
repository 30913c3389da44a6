"""The WordPiece vocabulary: `vocab.txt`, one token per line, id = line number.

This is the file format of google-research/bert (`tokenization.load_vocab`) and
of every Hugging Face BERT checkpoint: line i (0-based) holds the token with id
i; a word-internal piece carries the `##` continuation prefix. Five special
tokens must be present: [PAD] [UNK] [CLS] [SEP] [MASK] (bert-base-uncased puts
them at 0, 100, 101, 102, 103; a trained vocabulary puts them first).

We load strictly: a missing special token, a duplicate line or an empty line is
an error naming the line, because a silently shifted id table breaks every
checkpoint that uses it. Deviation from the original: it keeps the *last*
duplicate silently; we refuse.
"""

import json
import os
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.data.atomic import check_whole, saving, write_folder, write_json, write_lines
from bertkit.data.textfiles import read_text

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONTINUATION = "##"  # the prefix of a word-internal piece (bertkit.text.wordpiece)


def validate_tokens(tokens: list[str], source: str = "vocabulary") -> None:
    """Check a token list: non-empty entries, no duplicates, all special tokens present."""
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not isinstance(tok, str):
            raise BertkitError(f"{source}: entry {i} is {type(tok).__name__}, expected a string token")
        if tok == "" or tok.strip() != tok:
            raise BertkitError(
                f"{source}: line {i + 1} is empty or has surrounding whitespace ({tok!r}); "
                "vocab.txt needs exactly one token per line"
            )
        if tok in seen:
            raise BertkitError(
                f"{source}: token {tok!r} appears twice (lines {seen[tok] + 1} and {i + 1}); "
                "ids are line numbers, so every token must be unique"
            )
        seen[tok] = i
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise BertkitError(
            f"{source}: missing special token(s) {', '.join(missing)}; a BERT vocabulary needs "
            f"all of {' '.join(SPECIAL_TOKENS)}"
        )


def check_has_words(tokens: list[str], source: str = "the vocabulary") -> None:
    """Refuse a vocabulary of special tokens only (a hand-written one, or one trained smaller than the special
    tokens): WordPiece makes every word [UNK], and masked LM has no word to predict. Pre-training asks it of its
    vocabulary, `bertkit vocab check` of any; loading does not (the tokenizer still runs)."""
    if all(t in SPECIAL_TOKENS for t in tokens):
        raise BertkitError(f"{source} holds only special tokens ({', '.join(tokens)}): every word would "
                           "be [UNK], with nothing to predict; learn one with `bertkit vocab train`")


def load_vocab(path) -> list[str]:
    """Read vocab.txt into a list of tokens (index = id), validated."""
    path = Path(path)
    if path.is_dir():
        path = path / "vocab.txt"
    if not path.is_file():
        raise BertkitError(f"vocabulary file not found: {path} (pass a vocab.txt or a model directory)")
    return tokens_from_text(read_text(path, "vocabulary file"), str(path))


def read_vocab_file(path: Path, hf_json: bool) -> tuple[str, list[str]]:
    """(the text, its tokens) of a vocab.txt, or of a Hugging Face tokenizer.json when `hf_json`."""
    check_whole(Path(path).parent)  # a model folder whose save was stopped between two of its files
    text = read_text(path, "tokenizer file" if hf_json else "vocabulary file")
    return text, (tokens_from_tokenizer_json if hf_json else tokens_from_text)(text, str(path))


def tokens_from_text(text: str, source: str) -> list[str]:
    """The tokens of a vocab.txt's text (index = id), validated; `source` names the file in errors."""
    # Split on "\n" only: str.splitlines() would also split on U+2028 and friends,
    # which can be tokens; a trailing newline does not add a token.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = [line[:-1] if line.endswith("\r") else line for line in lines]
    validate_tokens(tokens, source)
    return tokens


def tokens_from_tokenizer_json(text: str, source: str, complete: bool = False) -> list[str]:
    """The WordPiece vocabulary inside a Hugging Face tokenizer.json's text (token -> id in
    `model.vocab`), as a list of tokens (index = id), validated: the folders sentence-transformers 6
    saves carry only this file, no vocab.txt. `source` names the file in errors.

    complete: special tokens the file lacks are appended after its last id (model2vec drops [CLS],
    [SEP] and [MASK] from a static model's vocabulary: it never adds them), so the ids it has keep
    their meaning."""
    try:
        data = json.loads(text)
        model = data["model"]
        vocab = model["vocab"]
        kind = model.get("type")
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise BertkitError(f"{source} is not a Hugging Face tokenizer.json with a vocabulary ({err})") from None
    if kind != "WordPiece" or not isinstance(vocab, dict):
        raise BertkitError(f"{source} holds a {kind} tokenizer, not WordPiece: BERT needs a WordPiece vocabulary")
    if model.get("continuing_subword_prefix", CONTINUATION) != CONTINUATION or model.get("unk_token", UNK) != UNK:
        raise BertkitError(f"{source}: a WordPiece model with prefix {model.get('continuing_subword_prefix')!r} and "
                           f"unknown token {model.get('unk_token')!r}; bertkit reads '##' and '[UNK]'")
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < len(tokens) or tokens[i] is not None:
            raise BertkitError(f"{source}: the vocabulary's ids are not 0..{len(vocab) - 1}, each once (token {token!r})")
        tokens[i] = token
    added = data.get("added_tokens") or []
    check_added_tokens({a.get("content"): a.get("id") for a in added if isinstance(a, dict)}, tokens, source)
    if complete:
        tokens += [t for t in SPECIAL_TOKENS if t not in vocab]
    validate_tokens(tokens, source)
    return tokens


def check_added_tokens(added: dict, tokens: list[str], source) -> None:
    """Refuse tokens added beyond the vocabulary (`added`: token -> id; transformers' `add_tokens(["[E1]"])`,
    saved in tokenizer.json's added_tokens, or tokenizer_config.json's added_tokens_decoder and
    added_tokens.json): reading the vocabulary alone would drop them, and "[E1]" would become other ids. A
    token that is the vocabulary's own at its id is fine, and so are BERT's special tokens (every save lists
    them; model2vec's even where its vocabulary lacks them)."""
    extra = [t for t, i in added.items() if t not in SPECIAL_TOKENS
             and not (isinstance(i, int) and 0 <= i < len(tokens) and tokens[i] == t)]
    if extra:
        raise BertkitError(f"{source} adds {len(extra)} token(s) beyond its WordPiece vocabulary "
                           f"({', '.join(map(str, extra[:5]))}{', ...' if len(extra) > 5 else ''}); bertkit reads "
                           "the vocabulary and BERT's special tokens only: save the tokenizer without added tokens")


def save_vocab(tokens: list[str], path, config: dict | None = None) -> Path:
    """Write tokens to vocab.txt (one per line, id order) and, given `config`, the tokenizer_config.json
    beside it that says how to read them (casing, accents); returns the vocab.txt path.

    Each file is written whole or not at all (`bertkit.data.atomic`): written in place, a save killed or out
    of disk over a model folder left vocab.txt cut after its k-th line, and the model then loaded without a
    word of complaint, every token past line k read as [UNK] (or the ids of another vocabulary). The two as one
    (`bertkit.data.atomic.saving`, within a model's save when one is under way): a file whose bytes are the same
    is left as it is, and a stop between two that change leaves a folder the readers refuse, never a vocab.txt
    beside settings not its own."""
    validate_tokens(list(tokens), "vocabulary to save")
    path = Path(path)
    if path.is_dir():
        path = path / "vocab.txt"
    with saving(path.parent):
        write_lines(path, (t + "\n" for t in tokens))
        if config is not None:
            write_json(path.parent / "tokenizer_config.json", config)
    return path


def save_vocab_pair(tokens: list[str], path, config: dict, replaceable=()) -> Path:
    """`save_vocab` of vocab.txt (at `path`) and its tokenizer_config.json as one pair: a kill or a full disk
    between the two writes left the new vocab.txt beside the last save's tokenizer_config.json (a cased
    vocabulary read lower-cased) or, the first time, beside none, read with the defaults.

    A folder holding nothing else (but the `replaceable` names: the writer's lock file) is written whole and
    swapped in (`bertkit.data.atomic.write_folder`): both old files or both new ones. A folder holding other
    files (the corpus, the current directory) cannot be swapped: there the old vocab.txt is removed first, the
    settings written, then vocab.txt, so a stop between them leaves no vocab.txt (which every reader refuses),
    never a vocab.txt beside settings not its own."""
    path = Path(path)
    folder = path.parent
    ours = {path.name, "tokenizer_config.json", *replaceable}
    # the current directory (a shell stands in it), a link to a folder, and one in a folder this process may not
    # write (the swap renames it there) are never swapped
    swapped = not folder.exists() or (folder.resolve() != Path.cwd().resolve() and not folder.is_symlink()
                                      and os.access(folder.resolve().parent, os.W_OK)
                                      and all(f.name in ours for f in folder.iterdir()))
    if swapped:
        with write_folder(folder) as tmp:
            save_vocab(tokens, tmp / path.name, config)
    else:
        validate_tokens(list(tokens), "vocabulary to save")
        path.unlink(missing_ok=True)
        write_json(folder / "tokenizer_config.json", config)
        save_vocab(tokens, path)
    return path


def check_casing(tokens: list[str], lowercase: bool) -> None:
    """Refuse an obvious cased/uncased mismatch between vocabulary and settings.

    Judged only on vocabularies of 1000+ tokens (handmade test vocabularies are
    too small to tell): a lower-casing tokenizer can never produce a token with
    capitals, so a vocabulary with many of them is cased; a cased vocabulary of
    English-like text always has some capitalised words.
    Only words with letters that have case count: Arabic, Hebrew, Devanagari, Thai or CJK words read the
    same either way, so a cased vocabulary of such text (`vocab train --cased`, to keep its marks) has no
    capitals and was refused as "uncased" by every command that loads it.
    """
    words = [t for t in tokens if t.isalpha() and t.lower() != t.upper()]
    if len(tokens) < 1000 or len(words) < 500:
        return
    upper = sum(1 for t in words if t != t.lower())
    if lowercase and upper > 0.05 * len(words):
        raise BertkitError(
            f"casing mismatch: lowercase=True but the vocabulary looks cased ({upper} of {len(words)} words "
            "have capitals, which lower-cased text can never match); pass lowercase=False"
        )
    if not lowercase and upper == 0:
        raise BertkitError(
            "casing mismatch: lowercase=False but the vocabulary has no capitalised words (it looks uncased); "
            "pass lowercase=True"
        )


def no_vocabulary(folder: Path) -> str:
    """The error for a folder without vocab.txt or tokenizer.json. A sentence-transformers folder keeps its
    tokenizer in a module's folder (a static model's 0_StaticEmbedding, an older layout's 0_Transformer): the
    loader finds it through modules.json (`bertkit.model.sentence_layout`, `bertkit.model.static`), which the
    tokenizer, a floor below the model, does not read; the message names the module folder that holds one
    (it said "pass a model directory" of a folder every model command reads)."""
    inner = sorted(folder.glob("*/vocab.txt")) + sorted(folder.glob("*/tokenizer.json"))
    if (folder / "modules.json").is_file() and inner:
        return (f"{folder} keeps its vocabulary in a module folder, {inner[0].parent}: pass that folder (or its "
                f"{inner[0].name})")
    return f"{folder} has no vocab.txt; pass a model directory or a vocab.txt file"
