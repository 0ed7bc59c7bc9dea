"""The Shakespeare, IWSLT15 and SQuAD loaders on small files in the original formats."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mtbench.data.base import BOS, EOS, UNK
from mtbench.data.iwslt15 import IWSLT15
from mtbench.data.shakespeare import Shakespeare
from mtbench.data.squad import SQuAD
from mtbench.data.squad_files import char_span_to_tokens
from mtbench.data.text import build_vocab, tokenize
from mtbench.errors import DataError

SPEECH = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def test_shakespeare_vocabulary_is_the_files_characters(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(SPEECH, encoding="utf-8")
    corpus = Shakespeare(str(path)).char_corpus(10, seed=0)
    assert corpus.vocab == sorted(set(SPEECH))
    assert "".join(corpus.vocab[i] for i in corpus.ids) == SPEECH


def test_shakespeare_errors(tmp_path):
    with pytest.raises(DataError, match="missing file"):
        Shakespeare(str(tmp_path / "nope.txt")).char_corpus(10, 0)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        Shakespeare(str(bad)).char_corpus(10, 0)
    with pytest.raises(DataError, match="needs data.path"):
        Shakespeare("")


def test_char_rnn_trains_on_a_text_file(run, tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(SPEECH * 3, encoding="utf-8")
    s = run(["model=char_rnn", "batch=2", "data=shakespeare", f"data.path={path}", "model.workload.seq_len=16",
             "model.workload.hidden=16"])
    assert s["success"], s["failure"]
    assert s["data"] == f"shakespeare:{path}"
    assert s["throughput_units_per_s"]["chars"] == pytest.approx(16 * s["throughput_samples_per_s"])


def write_iwslt(root, vocab=True):
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.en").write_text("Rachel Pike : The science\nthank you .\n\nhello world\n", encoding="utf-8")
    (root / "train.vi").write_text("Khoa học\ncảm ơn .\nx\nxin chào thế giới\n", encoding="utf-8")
    if vocab:
        (root / "vocab.en").write_text("<unk>\n<s>\n</s>\nthank\nyou\n.\nhello\n", encoding="utf-8")
        (root / "vocab.vi").write_text("<unk>\n<s>\n</s>\ncảm\nơn\n.\n", encoding="utf-8")


def test_iwslt15_uses_the_vocab_files(tmp_path):
    write_iwslt(tmp_path)
    corpus = IWSLT15(str(tmp_path)).parallel_corpus(3, seed=0)
    assert corpus.src_vocab[:3] == ["<unk>", "<s>", "</s>"] and len(corpus.src_vocab) == 7
    pairs = {tuple(s): tuple(t) for s, t in zip(corpus.src, corpus.tgt)}
    # "thank you ." -> "cảm ơn ."; the empty English line and its pair are dropped
    assert pairs[(3, 4, 5)] == (3, 4, 5)
    assert (6, UNK) in pairs  # "hello world": world is not in vocab.en
    assert len(pairs) == 3


def test_iwslt15_builds_vocab_from_text_without_files(tmp_path):
    write_iwslt(tmp_path, vocab=False)
    corpus = IWSLT15(str(tmp_path)).parallel_corpus(3, seed=0)
    assert corpus.tgt_vocab[:3] == ["<unk>", "<s>", "</s>"]
    assert "." in corpus.tgt_vocab and "chào" in corpus.tgt_vocab
    assert all(UNK not in s for s in corpus.src)  # every word is in a vocabulary built from the text


def test_iwslt15_errors(tmp_path):
    write_iwslt(tmp_path)
    (tmp_path / "train.vi").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(DataError, match="4 lines but train.vi has 1"):
        IWSLT15(str(tmp_path)).parallel_corpus(2, 0)
    write_iwslt(tmp_path / "b")
    (tmp_path / "b" / "vocab.en").write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(DataError, match="must start with <unk> <s> </s>"):
        IWSLT15(str(tmp_path / "b")).parallel_corpus(2, 0)
    with pytest.raises(DataError, match="missing file .*train.en"):
        IWSLT15(str(tmp_path / "none")).parallel_corpus(2, 0)


def test_seq2seq_trains_on_iwslt15_files(run, tmp_path):
    write_iwslt(tmp_path / "nmt")
    s = run(["model=seq2seq", "batch=2", "data=iwslt15", f"data.root={tmp_path / 'nmt'}", "model.workload.hidden=16"])
    assert s["success"], s["failure"]
    assert s["data"] == f"iwslt15:{tmp_path / 'nmt'}" and s["throughput_units_per_s"]["tokens"] > 0


SQUAD = {
    "version": "1.1",
    "data": [{
        "title": "Notre_Dame",
        "paragraphs": [{
            "context": "Architecturally, the school has a Catholic character. Atop the Main Building's gold "
                       "dome is a golden statue of the Virgin Mary.",
            "qas": [
                {"id": "1", "question": "What sits on top of the Main Building?",
                 "answers": [{"text": "a golden statue of the Virgin Mary", "answer_start": 92}]},
                {"id": "2", "question": "What character does the school have?",
                 "answers": [{"text": "Catholic", "answer_start": 34}]},
                {"id": "3", "question": "A misplaced answer?",
                 "answers": [{"text": "nowhere", "answer_start": 5}]},
            ],
        }],
    }],
}


def test_tokenizer_keeps_character_offsets():
    text = "Atop the Main Building's dome."
    tokens = tokenize(text)
    assert [t for t, _, _ in tokens] == ["Atop", "the", "Main", "Building", "'", "s", "dome", "."]
    assert all(text[s:e] == t for t, s, e in tokens)


def test_char_span_to_token_span():
    tokens = tokenize("the Virgin Mary.")
    assert char_span_to_tokens(tokens, 4, 15) == (1, 2)
    assert char_span_to_tokens(tokens, 3, 10) == (1, 1)  # a span starting in the space before a word


def test_squad_answers_become_token_spans(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(SQUAD), encoding="utf-8")
    source = SQuAD(str(path))
    examples = source.squad_examples(4, seed=0)
    assert source.skipped == 1  # the answer whose text is not at answer_start
    by_question = {" ".join(e.question): e for e in examples}
    golden = by_question["What sits on top of the Main Building ?"]
    assert golden.context[golden.start: golden.end + 1] == ["a", "golden", "statue", "of", "the", "Virgin", "Mary"]
    catholic = by_question["What character does the school have ?"]
    assert catholic.context[catholic.start: catholic.end + 1] == ["Catholic"]


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not JSON"),
    (json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}), "not SQuAD v1.1"),
    (json.dumps({"data": []}), "holds no question"),
])
def test_squad_errors(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=needle):
        SQuAD(str(path)).squad_examples(2, 0)


@pytest.mark.parametrize("model, tiny", [
    ("bidaf", ["model.workload.d=8"]),
    ("bert", ["model.workload.hidden=32", "model.workload.layers=1", "model.workload.heads=2",
              "model.workload.intermediate=64", "model.workload.seq_len=48"]),
])
def test_qa_models_train_on_a_squad_file(run, tmp_path, model, tiny):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(SQUAD), encoding="utf-8")
    s = run([f"model={model}", "batch=2", "data=squad", f"data.path={path}"] + tiny)
    assert s["success"], s["failure"]
    assert s["data"] == f"squad:{path}"


def test_build_vocab_orders_by_frequency():
    assert build_vocab([["b", "a", "b"], ["c", "b", "a"]], ["<unk>"], 3) == ["<unk>", "b", "a"]


def test_special_ids_match_the_stanford_vocab_files():
    assert (UNK, BOS, EOS) == (0, 1, 2)
    assert np.int64(UNK) == 0
